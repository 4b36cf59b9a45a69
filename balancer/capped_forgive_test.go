package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A breaker that closes forgives the error rate because its probes
// passed: BreakerProbes successes in a row after an exclusion, or, for a
// capped breaker, after EjectionTime without a failure (armCappedProbes).
// But a capped breaker stays in rotation, and gobreaker, whose open
// timeout here is a nanosecond, counts its next ordinary calls as
// half-open ones: three successes right after the failures that capped
// it closed it, and the close wiped an error rate of 0.41 to 0. An
// endpoint failing in bursts had its rate wiped after every burst, and
// was priced as clean as its healthy peers. Its rate now stands until
// its probes were due; the close itself still ends the capped episode.
func TestCappedBreakerClosedAtOnceKeepsItsErrorRate(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record})
	eps := endpoints(4)
	for _, ep := range eps[:3] {
		call, _ := pinnedCalls(t, b, clock, ep.Addr)
		for range balancer.DefaultBreakerFailures {
			call(errDown)
		}
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventTripped, balancer.EventCapped}, rec.kinds())
	capped := eps[2].Addr
	call, _ := pinnedCalls(t, b, clock, capped)
	for range balancer.DefaultBreakerProbes {
		call(nil)
	}
	assert.Greater(t, stat(t, b, capped).ErrorRate, 0.25, "three successes right after five failures")

	// Once it has gone EjectionTime without a failure, its probes are due,
	// and a close then forgives the rate, as TestCappedEndpointReturnsAfterThePoolRecovers
	// relies on.
	for range balancer.DefaultBreakerFailures { // capped again
		call(errDown)
	}
	require.Equal(t, balancer.EventCapped, rec.last().Kind)
	require.Greater(t, stat(t, b, capped).ErrorRate, 0.25)
	clock.Advance(balancer.DefaultEjectionTime)
	for range balancer.DefaultBreakerProbes {
		call(nil)
	}
	assert.Zero(t, stat(t, b, capped).ErrorRate, "probes due and passed")
}
