package scoring_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

func TestValidate(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, tc := range []struct {
		s    interface{ Validate() error }
		want string // "" for valid
	}{
		{&scoring.LLM{}, ""},
		{&scoring.LLM{KVKnee: 0.7, MemoryKnee: 0.95, UtilKnee: 0.5, MaxKVPressure: 1, ErrorPenalty: inf}, ""},
		{&scoring.LLM{KVKnee: 1.2}, "scoring.LLM.KVKnee = 1.2: must be in [0, 1]"},
		{&scoring.LLM{MemoryKnee: -0.1}, "scoring.LLM.MemoryKnee = -0.1"},
		{&scoring.LLM{UtilKnee: nan}, "scoring.LLM.UtilKnee = NaN"},
		{&scoring.LLM{MaxKVPressure: 0.5}, "scoring.LLM.MaxKVPressure = 0.5: must be at least 1"},
		{&scoring.LLM{QueueWeight: -2}, "scoring.LLM.QueueWeight = -2: must not be negative"},
		{&scoring.LLM{Steepness: nan}, "scoring.LLM.Steepness = NaN"},
		{&scoring.LLM{LoRALoad: 1, LoRAWait: 100}, ""},
		{&scoring.LLM{LoRALoad: 0.5}, "scoring.LLM.LoRALoad = 0.5: must be a finite factor of at least 1 (1 turns it off; 0 means the default 1.5)"},
		{&scoring.LLM{LoRAWait: -1}, "scoring.LLM.LoRAWait = -1"},
		{&scoring.LLM{LoRAWait: inf}, "scoring.LLM.LoRAWait = +Inf"},
		{&scoring.LLM{LoRAWait: nan}, "scoring.LLM.LoRAWait = NaN"},
		{&scoring.Latency{Prior: -time.Second}, "scoring.Latency.Prior = -1s"},
		{&scoring.Latency{ErrorPenalty: -1}, "scoring.Latency.ErrorPenalty = -1"},
		{&scoring.Latency{Prior: time.Second, ErrorPenalty: inf}, ""},
		{&scoring.LeastLoaded{ErrorPenalty: nan}, "scoring.LeastLoaded.ErrorPenalty = NaN"},
		{&scoring.LeastLoaded{}, ""},
		// A nil pointer in a Scorer interface is not a nil Scorer, so the
		// balancer's nil check passes it on to Validate.
		{(*scoring.LLM)(nil), "scoring.LLM is nil"},
		{(*scoring.Latency)(nil), "scoring.Latency is nil"},
		{(*scoring.LeastLoaded)(nil), "scoring.LeastLoaded is nil"},
	} {
		err := tc.s.Validate()
		if tc.want == "" {
			assert.NoError(t, err, "%+v", tc.s)
			continue
		}
		if assert.Error(t, err, "%+v", tc.s) {
			assert.Contains(t, err.Error(), tc.want)
			assert.ErrorIs(t, err, scoring.ErrInvalid)
			assert.Regexp(t, `^inferlb: `, err.Error())
		}
	}
}

// A MaxKVPressure under 1, which Validate refuses, caps the KV factor below
// its floor: an endpoint reporting a nearly full KV cache costs less than
// one that reports nothing, and pressure no longer tells them apart.
func TestMaxKVPressureUnderOneInverts(t *testing.T) {
	l := &scoring.LLM{MaxKVPressure: 0.5}
	silent := scoring.State{Now: now, Weight: 1}
	idle := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.KVCacheUsage), 0.1)
	full := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.KVCacheUsage), 0.99)
	assert.Less(t, l.Cost(nil, full), l.Cost(nil, silent))
	assert.Equal(t, l.Cost(nil, idle), l.Cost(nil, full))
	assert.Error(t, l.Validate())
}
