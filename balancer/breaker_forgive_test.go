package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestBreakerForgivenessStartsFromTheCap: a breaker that trips again after
// a recovery is forgiven one doubling per EjectionTime of good standing,
// but every failed probe counted one more open, past those that reach
// MaxEjectionTime. After an hour-long outage (30 failed probes), two good
// minutes forgave 12 of 31 opens, and one failure held the endpoint out
// for the full 2 minutes, as if it had just flapped; the five opens that
// reach the cap are all forgiven by then.
func TestBreakerForgivenessStartsFromTheCap(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), PanicThreshold: -1,
		BreakerFailures: 1, BreakerProbes: 1, OutlierInterval: -1})
	bad := endpoints(2)[0].Addr
	call, held := pinnedCalls(t, b, clock, bad)

	call(errDown)
	for range 30 { // down for about an hour: every probe fails
		clock.Advance(held())
		call(errDown)
	}
	assert.Equal(t, balancer.DefaultMaxEjectionTime, held())
	clock.Advance(held())
	call(nil) // recovered
	clock.Advance(4 * balancer.DefaultEjectionTime)
	call(errDown)
	assert.Equal(t, 2*balancer.DefaultEjectionTime, held(), "four of the five opens that count are forgiven")
	clock.Advance(held())
	call(nil)
	clock.Advance(2 * time.Minute)
	call(errDown)
	assert.Equal(t, balancer.DefaultEjectionTime, held(), "two good minutes forgive the rest")
}
