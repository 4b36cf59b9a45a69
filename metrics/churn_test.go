package metrics_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

// TestScrapesDuringChurnAndClose: scrapes run while endpoints come and go
// (IDs that need escaping among them), calls end and telemetry arrives,
// and while the Balancer is closed. Every scrape succeeds (no duplicate
// or invalid series), the counters of an endpoint that stays never go
// down, and once the Balancer is closed no endpoint series is left.
// Run it with -race.
func TestScrapesDuringChurnAndClose(t *testing.T) {
	b := balancer.New(balancer.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"), metrics.NewStoreCollector(b.Telemetry(), "llm"))
	fleet := func(i int) []inferlb.Endpoint {
		return []inferlb.Endpoint{
			{Addr: "stable:1"},
			{Addr: fmt.Sprintf("pod-%d:1", i%5), Weight: float64(1 + i%3)},
			{ID: fmt.Sprintf("pod-\xff%d", i%2), Addr: "10.0.0.9:1"},
			{ID: `pod-\xff0`, Addr: "10.0.0.8:1"}, // valid, spelled as one of those is escaped
		}
	}
	require.NoError(t, b.Update(fleet(0)))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // churn
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = b.Update(fleet(i))
		}
	}()
	go func() { // traffic and telemetry
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if p, err := b.Pick(&inferlb.Request{Model: fmt.Sprint(i % 7), AffinityKey: uint64(i%11 + 1)}); err == nil {
				p.Done(inferlb.Outcome{Overloaded: i%5 == 0})
			}
			s := telemetry.Sample{Time: b.Now()}
			s.Set(telemetry.Waiting, float64(i%9))
			b.Publish(fmt.Sprintf("pod-%d:1", i%5), s)
		}
	}()

	picks := func(mfs []*dto.MetricFamily, id string) (float64, bool) {
		for _, mf := range mfs {
			if mf.GetName() != "inferlb_endpoint_picks_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" && l.GetValue() == id {
						return m.GetCounter().GetValue(), true
					}
				}
			}
		}
		return 0, false
	}
	last := 0.0
	for range 40 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		n, ok := picks(mfs, "stable:1")
		require.True(t, ok, "stable:1 is listed by every Update")
		require.GreaterOrEqual(t, n, last, "picks_total of an endpoint that stayed went down")
		last = n
	}
	b.Close()
	for range 5 { // scrapes still racing the Updates that Close refuses
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotEqual(t, "endpoint", l.GetName(), "%s of a closed Balancer", mf.GetName())
			}
		}
	}
}
