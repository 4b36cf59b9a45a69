package grpcbalancer

import (
	"math"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/balancer"

	"github.com/inferlb/inferlb/telemetry"
)

// badORCAReports carry values no server measures: NaN, infinities,
// negative utilizations and counts, fractions above 1. Each is dropped, and
// a report with nothing else is counted as malformed telemetry (the Store's
// DroppedEmpty), as an unreadable endpoint-load-metrics header is on the
// HTTP transport: a server sending only such reports must show up in the
// counters, not vanish.
var badORCAReports = []*v3orcapb.OrcaLoadReport{
	{CpuUtilization: math.NaN()},
	{CpuUtilization: -0.5},
	{ApplicationUtilization: math.Inf(1)},
	{NamedMetrics: map[string]float64{"kv_cache_usage": math.NaN()}},
	{NamedMetrics: map[string]float64{"num_requests_waiting": math.Inf(1)}},
	{NamedMetrics: map[string]float64{"num_requests_running": -3}},
	{Utilization: map[string]float64{"kv_cache_usage_perc": 1.7}},
}

func TestMalformedPerCallORCAIsCountedNotApplied(t *testing.T) {
	h := newHarness(t, Name, `{}`, 1)
	store := h.lb().core.Load().Telemetry()
	for i, r := range badORCAReports {
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		di := sent
		di.ServerLoad = r
		res.Done(di)
		assert.EqualValues(t, i+1, store.Stats().DroppedEmpty, "report %v not counted", r)
	}
	_, ok := store.Latest(addr(0), time.Now(), time.Minute)
	assert.False(t, ok, "a malformed report was applied")

	// A report with nothing this package reads is no malformed one.
	_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
	di := sent
	di.ServerLoad = &v3orcapb.OrcaLoadReport{RpsFractional: 10, NamedMetrics: map[string]float64{"other": -1}}
	res.Done(di)
	assert.EqualValues(t, len(badORCAReports), store.Stats().DroppedEmpty)
}

func TestMalformedOOBORCAIsCountedNotApplied(t *testing.T) {
	h := newHarness(t, Name, `{}`, 1) // the fake has no ORCA producer: the test delivers the reports
	sc := h.onlySubConn(t)
	store := h.lb().core.Load().Telemetry()
	for i, r := range badORCAReports {
		sc.OnLoadReport(r)
		assert.EqualValues(t, i+1, store.Stats().DroppedEmpty, "report %v not counted", r)
	}
	_, ok := store.Latest(addr(0), time.Now(), time.Minute)
	assert.False(t, ok, "a malformed report was applied")
}

// A report with one good value and one bad one keeps the good one.
func TestPartlyMalformedORCAKeepsTheRest(t *testing.T) {
	s, bad := sampleFromORCA(&v3orcapb.OrcaLoadReport{
		CpuUtilization: math.NaN(),
		NamedMetrics:   map[string]float64{"kv_cache_usage": 0.5, "num_requests_waiting": -1},
	}, time.Now())
	assert.True(t, bad)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.KVCacheUsage), s.Has)
}

// A report with a good value beside a bad one publishes the good one and
// counts the bad one (StoreStats.Partial), per call and out of band: the
// bad field was dropped with nothing counted, where a report with nothing
// good was counted in DroppedEmpty.
func TestPartlyMalformedORCAIsCounted(t *testing.T) {
	partly := &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 0.5, "num_requests_waiting": -1}}
	good := &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 0.25}}

	h := newHarness(t, Name, `{}`, 1)
	store := h.lb().core.Load().Telemetry()
	for _, r := range []*v3orcapb.OrcaLoadReport{good, partly, badORCAReports[0]} {
		_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z"})
		di := sent
		di.ServerLoad = r
		res.Done(di)
	}
	st := store.Stats()
	assert.EqualValues(t, 1, st.Partial, "per call: %+v", st)
	assert.EqualValues(t, 1, st.DroppedEmpty, "per call: %+v", st)
	s, ok := store.Latest(addr(0), time.Now(), time.Minute)
	assert.True(t, ok)
	kv, _ := s.Get(telemetry.KVCacheUsage)
	assert.Equal(t, 0.5, kv, "the partly malformed report's good field was applied")

	oob := newHarness(t, Name, `{}`, 1)
	sc := oob.onlySubConn(t)
	store = oob.lb().core.Load().Telemetry()
	sc.OnLoadReport(good)
	sc.OnLoadReport(partly)
	assert.EqualValues(t, 1, store.Stats().Partial, "out of band: %+v", store.Stats())
}
