package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	tu "github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

// Two Balancers on one Store, each with its Collector: a sample offered to
// the Store once must count once in the registry, so that summing the
// counter over its labels (sum by (result)) gives what the Store did.
func TestSharedStoreSamplesCountOnce(t *testing.T) {
	clock := tu.NewClock()
	store := &telemetry.Store{Clock: clock}
	llm := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	emb := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	eps := []inferlb.Endpoint{{Addr: "a:1"}}
	require.NoError(t, llm.Update(eps))
	require.NoError(t, emb.Update(eps))
	s := telemetry.Sample{Time: clock.Now()}
	s.Set(telemetry.Waiting, 3)
	llm.Publish("a:1", s)
	emb.Publish("gone:1", s)
	old := telemetry.Sample{Time: clock.Now().Add(-time.Minute)} // past the default TelemetryMaxAge
	old.Set(telemetry.KVCacheUsage, 0.5)
	llm.Publish("a:1", old)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(llm, "llm"), metrics.NewCollector(emb, "embed"),
		metrics.NewStoreCollector(store, "shared"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "inferlb_telemetry_samples_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					sum[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	assert.Equal(t, 1.0, sum["accepted"])
	assert.Equal(t, 1.0, sum["dropped_unknown"])
	assert.Equal(t, 1.0, sum["arrived_stale"], "kept but never read: not accepted")
}
