package balancer_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
)

// TestFailingModelWithEjectionForever: an EjectionTime, MaxEjectionTime or
// ErrorDecay meant as "for ever" (the largest Duration, which exclusions
// saturate) must not turn the model-failure runs off. runLife
// (MaxEjectionTime + ErrorDecay) wrapped to a time below zero, so every
// failure began a run of its own and none was held against its model:
// model x's failures on endpoint 0 counted against the endpoint, as if no
// outcome named a model. And a pass-over as long as the largest Duration
// ended before it began (now + d wrapped), so x's calls went on failing
// there.
func TestFailingModelWithEjectionForever(t *testing.T) {
	broken := func(i, e int, m string) bool { return i >= 1000 && e == 0 && m == "x" }
	for _, tc := range []struct {
		name  string
		opts  balancer.Options
		first time.Duration // the first pass-over
	}{
		{"MaxEjectionTime", balancer.Options{MaxEjectionTime: math.MaxInt64}, balancer.DefaultEjectionTime},
		{"ErrorDecay", balancer.Options{ErrorDecay: math.MaxInt64}, balancer.DefaultEjectionTime},
		{"EjectionTime", balancer.Options{EjectionTime: math.MaxInt64, MaxEjectionTime: math.MaxInt64}, 1 << 61},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := twoModelFleet(t, tc.opts, 16, false, broken)
			trips, ejections, modelFailures, _ := r.held()
			assert.Zero(t, trips)
			assert.Zero(t, ejections)
			assert.Positive(t, modelFailures, "x's failures are held against x")
			assert.LessOrEqual(t, r.failed["x"], 1, "x's calls go where it works")
			d := r.modelEvents(0, "x")
			require.NotEmpty(t, d, "a pass-over began")
			assert.Equal(t, tc.first, d[0])
		})
	}
}
