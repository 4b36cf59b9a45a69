package scoring_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// The KV-cache projection moves a reading by each call's mean share of the
// running calls (usage / Running), not by the whole usage per call: at 80%
// with 16 running, two more calls make 90%, which with the curve uncapped
// costs 3x, not a full cache's 100x cap.
func TestKVProjectionMovesByTheMeanShareOfARunningCall(t *testing.T) {
	l := &scoring.LLM{MaxKVPressure: 100}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	st := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 16, float64(telemetry.KVCacheUsage), 0.8)
	st.InFlightSinceReading, st.InFlightSinceKV = 2, 2
	// load = 16 running + 2 sent since; the usage is 0.8 + 2 x 0.8/16 = 0.9.
	assert.InDelta(t, (16+2+1)*scoring.Pressure(0.9, 0.85, 4), l.Cost(req, st), 1e-9)
	assert.InDelta(t, 19*3, l.Cost(req, st), 1e-9)
}

// The figures the LLM field docs give for the pressure curves: memory at
// 95% costs 5.8x and at 97% about 14x (MemoryKnee 0.92, MemorySteepness
// 8); an ORCA utilization of 1 costs 401x, 1.05 601x and 1.2 1201x (UtilKnee
// 0.9, Steepness 4): finite, and rising past 1.
func TestPressureFiguresAsDocumented(t *testing.T) {
	assert.InDelta(t, 5.8, scoring.Pressure(0.95, 0.92, 8), 1e-9)
	assert.InDelta(t, 14.33, scoring.Pressure(0.97, 0.92, 8), 0.01)
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	for u, want := range map[float64]float64{1: 401, 1.05: 601, 1.2: 1201} {
		st := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.AppUtil), u)
		assert.InDelta(t, want, l.Cost(req, st), 1e-6, "utilization %v", u)
	}
}

// An error rate of 1 (every call failing) is priced at the floor of its
// odds, 10001x with the default penalty: finite, so two endpoints that
// both fail every call are still compared on load, not tied at +Inf.
func TestErrorRateOfOneIsFinite(t *testing.T) {
	req := &inferlb.Request{}
	for name, sc := range map[string]scoring.Scorer{
		"least loaded": &scoring.LeastLoaded{},
		"llm":          &scoring.LLM{},
	} {
		idle := sc.Cost(req, scoring.State{Now: now, Weight: 1, ErrorRate: 1})
		busy := sc.Cost(req, scoring.State{Now: now, Weight: 1, ErrorRate: 1, InFlight: 3})
		assert.InDelta(t, 10001, idle, 1e-6, name)
		assert.Greater(t, busy, idle, "%s: still ordered by load", name)
	}
}
