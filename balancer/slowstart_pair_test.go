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

// One serving endpoint and two that join it together: every second
// candidate drawn against the old one is a joiner. A joiner turned down was
// remembered alone, so the other could be drawn again, and after drawTries
// the scan took whichever joiner was not the last turned down, unramped:
// the old endpoint always had a joiner to compare with, and idle joiners
// took over half the calls from their first second, as a joiner of a fleet
// of two did before. Their share must follow their ramps: at 0.1 each,
// first candidates a sixth of the time, second ones against the old
// endpoint 0.19 of the time, about 0.2 of the calls at first.
func TestSlowStartRampsJoinersThatAreAllTheSecondCandidates(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		clock := testutil.NewClock()
		b := newBalancer(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(seed), SlowStartWindow: 60 * time.Second})
		eps := endpoints(3)
		require.NoError(t, b.Update(eps))
		require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, eps[1].Addr).RampFactor, 1e-9)
		got := spread(t, b, &inferlb.Request{}, 4000)
		joiners := float64(got[eps[1].Addr]+got[eps[2].Addr]) / 4000
		t.Logf("seed %d: %v; the joiners' share %.3f", seed, got, joiners)
		assert.InDelta(t, 0.2, joiners, 0.05, "two fresh joiners take about their ramps' share")
	}
}
