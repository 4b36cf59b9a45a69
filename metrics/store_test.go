package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// TestStoreEndpointsHelpSaysWhereAFullStoreDrops: a Store full of a
// Balancer's endpoints counts the endpoint it had no room for, one with no
// reading yet among them, and refuses that endpoint's samples as
// dropped_unknown (they come through the Balancer), while a sample
// published to the Store directly for a new ID is dropped_full. The HELP
// said the store_endpoints were those it kept telemetry for and that new
// ones were dropped as dropped_full, so an operator watching dropped_full
// for a full table saw nothing while the Balancer's endpoint went unread.
func TestStoreEndpointsHelpSaysWhereAFullStoreDrops(t *testing.T) {
	clock := tu.NewClock()
	store := &telemetry.Store{Clock: clock, MaxEndpoints: 1}
	b := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}, {Addr: "b:1"}}))
	s := telemetry.Sample{Time: clock.Now()}
	s.Set(telemetry.Waiting, 1)
	b.Publish("b:1", s)     // the endpoint without a slot
	store.Publish("c:1", s) // a Poller publishing into the Store

	require.NoError(t, testutil.CollectAndCompare(metrics.NewStoreCollector(store, "shared"), strings.NewReader(`
# HELP inferlb_telemetry_partial_samples_total Samples an adapter published with some fields left out as malformed (an HTTP load header or an ORCA report with a NaN, a negative count, a field that does not parse); their other fields count in inferlb_telemetry_samples_total as usual.
# TYPE inferlb_telemetry_partial_samples_total counter
inferlb_telemetry_partial_samples_total{store="shared"} 0
# HELP inferlb_telemetry_samples_total Telemetry samples offered to the store, by what happened to them.
# TYPE inferlb_telemetry_samples_total counter
inferlb_telemetry_samples_total{result="accepted",store="shared"} 0
inferlb_telemetry_samples_total{result="arrived_stale",store="shared"} 0
inferlb_telemetry_samples_total{result="dropped_empty",store="shared"} 0
inferlb_telemetry_samples_total{result="dropped_full",store="shared"} 1
inferlb_telemetry_samples_total{result="dropped_old",store="shared"} 0
inferlb_telemetry_samples_total{result="dropped_unknown",store="shared"} 1
# HELP inferlb_telemetry_store_endpoints Endpoint IDs the store has a slot for: a Balancer's endpoints, read or not yet, and IDs published to the store directly. Past its MaxEndpoints, samples for an ID without a slot are dropped: dropped_full when published to the store directly (a Poller whose Sink is the store), dropped_unknown through a Balancer.
# TYPE inferlb_telemetry_store_endpoints gauge
inferlb_telemetry_store_endpoints{store="shared"} 1
`)))
}
