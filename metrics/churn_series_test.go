package metrics_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

// Pods replaced 2,000 times, each time at new addresses, with calls and
// telemetry in between and a scrape after each set: every scrape exports
// the series of the current endpoints only. A series of a removed endpoint
// left behind would be a cardinality leak in the Prometheus server (a
// new one per pod IP for good); the collectors keep no state, so the
// series of an endpoint go with it from the next scrape.
func TestScrapesDuringEndpointChurnExportTheCurrentEndpointsOnly(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(9)})
	t.Cleanup(b.Close)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"), metrics.NewStoreCollector(b.Telemetry(), "llm"))
	const rounds, size = 2_000, 4
	for r := range rounds {
		eps := make([]inferlb.Endpoint, size)
		want := map[string]bool{}
		for i := range eps {
			eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.%d.%d.%d:8000", r>>8&255, r&255, i)}
			want[eps[i].Addr] = true
		}
		require.NoError(t, b.Update(eps))
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Waiting, 2)
		b.Publish(eps[0].Addr, s)
		for k := range 4 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: uint64(k + 1)})
			require.NoError(t, err)
			var o inferlb.Outcome
			if k == 0 {
				o.Err = errors.New("down")
			}
			p.Done(o)
		}
		clock.Advance(time.Second)
		if r%100 != 0 && r != rounds-1 {
			continue
		}
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]bool{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" {
						got[l.GetValue()] = true
					}
				}
			}
		}
		require.Equal(t, want, got, "round %d: the endpoints with series", r)
		assert.Equal(t, float64(size), gaugeValue(t, reg, "inferlb_telemetry_store_endpoints"), "round %d", r)
	}
}

// gaugeValue is the value of the single series of the gauge name.
func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
