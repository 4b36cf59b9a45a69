package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestRampSurvivesAClockStepBackThenAnUpdate: an Update right after the
// clock stepped back (a discovery refresh, a resolver update) builds new
// groups, whose standing has no reading from before the step to tell it
// by. A ramp's start set before the step then stayed an hour ahead: the
// endpoint that had just joined was held at the minimum weight for the
// hour, as the ramp that had begun an hour "later" never got going.
func TestRampSurvivesAClockStepBackThenAnUpdate(t *testing.T) {
	clock := testutil.NewClock()
	b := resilient(t, clock, &recorder{}, 4)
	eps := endpoints(5)
	require.NoError(t, b.Update(eps)) // eps[4] joins and ramps
	clock.Advance(-time.Hour)
	require.NoError(t, b.Update(eps))
	spread(t, b, &inferlb.Request{}, 10)
	clock.Advance(balancer.DefaultSlowStartWindow)
	assert.Equal(t, 1.0, stat(t, b, eps[4].Addr).RampFactor, "a ramp ends")
}

// TestOverdueProbesSurviveAClockStepBackThenAnUpdate: the same for the
// deadline of a half-open breaker's probes, all out, taken long after its
// exclusion ended (a model rarely called): an hour ahead, the endpoint got
// no probe for the hour.
func TestOverdueProbesSurviveAClockStepBackThenAnUpdate(t *testing.T) {
	clock := testutil.NewClock()
	b := resilient(t, clock, &recorder{}, 4)
	bad := endpoints(4)[0].Addr
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	clock.Advance(balancer.DefaultEjectionTime + time.Hour)
	require.Len(t, holdOn(t, b, bad, 2000), balancer.DefaultBreakerProbes) // all out, for good
	clock.Advance(-time.Hour)
	require.NoError(t, b.Update(endpoints(4)))
	assert.Len(t, holdOn(t, b, bad, 400), 1, "the probes out are overdue at once")
}
