package scoring_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// A server put to sleep reports no load, the cheapest reading of the
// fleet; it serves nothing until woken, so it must cost more than any
// awake one, however loaded, and two sleeping ones still compare by load.
func TestLLMCostPricesASleepingServerAboveAnyAwakeOne(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	base := scoring.State{Now: now, Weight: 1}
	asleep := withTelemetry(base, float64(telemetry.Running), 0, float64(telemetry.Waiting), 0, float64(telemetry.KVCacheUsage), 0, float64(telemetry.Asleep), 1)
	busy := withTelemetry(base, float64(telemetry.Running), 200, float64(telemetry.Waiting), 100, float64(telemetry.KVCacheUsage), 0.99)
	assert.Greater(t, l.Cost(req, asleep), l.Cost(req, busy))
	awake := withTelemetry(base, float64(telemetry.Running), 0, float64(telemetry.Asleep), 0)
	assert.Equal(t, l.Cost(req, withTelemetry(base, float64(telemetry.Running), 0)), l.Cost(req, awake), "an awake reading is neutral")
	asleepBusier := asleep
	asleepBusier.InFlight = 3
	assert.Greater(t, l.Cost(req, asleepBusier), l.Cost(req, asleep))
}
