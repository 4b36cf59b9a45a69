package metrics_test

import (
	"errors"
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

// everyCollector returns the package's four collectors over objects in a
// state where each collector exports every series it describes (the
// Collector's conditional ones included: per-service latency, TTFT, time
// per output token, telemetry and its age, the key-reuse estimate).
func everyCollector(t *testing.T, name string) []prometheus.Collector {
	t.Helper()
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	for i := range uint64(2000) { // keys with their top 3 bits zero are sampled
		p, err := b.Pick(&inferlb.Request{AffinityKey: i*0x9e3779b97f4a7c15>>3 | 1})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Latency: time.Second, TTFT: 100 * time.Millisecond, OutputTokens: 10})
	}
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Err: errors.New("500")})
	s := telemetry.Sample{Time: clock.Now()}
	for f := range telemetry.NumFields {
		s.Set(telemetry.Field(f), 1)
	}
	b.Publish("a:1", s)
	return []prometheus.Collector{
		metrics.NewCollector(b, name),
		metrics.NewStoreCollector(b.Telemetry(), name),
		metrics.NewPollerCollector(statsFunc(func() telemetry.PollerStats {
			return telemetry.PollerStats{Rounds: 3, Failures: 1, ConsecutiveFailures: 1}
		}), name),
		metrics.NewTransportCollector(transportStats{Resends: 1, Failovers: 2}, name),
	}
}

// TestEveryCollectorPassesLint runs promlint (testutil.CollectAndLint:
// counters end in _total, base units, no type or unit abbreviations in
// names, HELP present) over every series of every collector, with each
// collector in a state that exports all it describes, and registers all
// four in one pedantic registry, which checks that each collected series
// was described and that a name's HELP and labels agree across
// collectors.
func TestEveryCollectorPassesLint(t *testing.T) {
	cs := everyCollector(t, "llm")
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		require.NoError(t, reg.Register(c))
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems, "%T", c)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	gathered := map[string]bool{}
	for _, mf := range mfs {
		gathered[mf.GetName()] = true
	}
	for n := range registered(t) {
		assert.True(t, gathered[n], "%s is described but was not collected: the lint did not see it", n)
	}
}

// TestCollectorsRegisterOncePerName: a collector registered twice, or two
// collectors of one kind under one name (two Balancers both called
// "llm"), are refused when registered, not found out scrape after scrape
// as duplicate series; under distinct names they register side by side.
func TestCollectorsRegisterOncePerName(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	first := everyCollector(t, "llm")
	for _, c := range first {
		require.NoError(t, reg.Register(c))
	}
	for _, c := range first {
		var already prometheus.AlreadyRegisteredError
		assert.ErrorAs(t, reg.Register(c), &already, "%T registered twice", c)
	}
	for _, c := range everyCollector(t, "llm") {
		assert.Error(t, reg.Register(c), "a second %T named llm", c)
	}
	for _, c := range everyCollector(t, "embedding") {
		assert.NoError(t, reg.Register(c), "%T named embedding", c)
	}
	_, err := reg.Gather()
	require.NoError(t, err)
}

// TestHelpGivesTheUnitsNamesLeaveOut: three series cannot say their unit
// in their name without a rename that would break dashboards, so their
// HELP must. inferlb_endpoint_telemetry holds every telemetry field, each
// in its own unit (bytes, Celsius, watts, counts, ratios): its HELP named
// none, so avg(inferlb_endpoint_telemetry) by (endpoint), which mixes
// bytes with ratios, looked like a sensible query. endpoint_error_rate and
// endpoint_slow_start_factor are ratios without the _ratio suffix, and
// their HELP did not say their range. A field added to telemetry without
// its unit in the HELP fails here.
func TestHelpGivesTheUnitsNamesLeaveOut(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(everyCollector(t, "llm")[0])
	mfs, err := reg.Gather()
	require.NoError(t, err)
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	tel := help["inferlb_endpoint_telemetry"]
	require.NotEmpty(t, tel)
	for f := range telemetry.NumFields {
		assert.Regexp(t, `\b`+telemetry.Field(f).String()+`\b`, tel, "the HELP gives no unit for field %s", telemetry.Field(f))
	}
	assert.Contains(t, tel, "Select one field before aggregating")
	for _, n := range []string{"inferlb_endpoint_error_rate", "inferlb_endpoint_slow_start_factor"} {
		assert.Contains(t, help[n], "a ratio from 0 to 1", n)
	}
}
