package balancer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A cap set alone below its base's default is the caller's bound, and
// the default base gives way to it, as a base set alone above its cap's
// default raises the cap. Before, the cap was raised to the default base
// without a word: MaxCooldown 500ms let an overload answer with a
// Retry-After of a minute hold the endpoint out for DefaultCooldown (1s),
// and MaxEjectionTime 5s let a breaker hold it out for DefaultEjectionTime
// (10s), twice the cap the caller set.
func TestCapSetAloneBoundsTheDefaultBase(t *testing.T) {
	t.Run("MaxCooldown", func(t *testing.T) {
		clock := testutil.NewClock()
		b := newBalancer(t, 1, balancer.Options{Clock: clock, MaxCooldown: 500 * time.Millisecond, PanicThreshold: -1})
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
		clock.Advance(500 * time.Millisecond)
		_, err = b.Pick(&inferlb.Request{})
		assert.NoError(t, err, "a Retry-After of a minute is capped at MaxCooldown")
		p, err = b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Overloaded: true}) // no hint: DefaultCooldown, within the cap
		clock.Advance(500 * time.Millisecond)
		_, err = b.Pick(&inferlb.Request{})
		assert.NoError(t, err, "the default cooldown is within MaxCooldown")
	})
	t.Run("MaxEjectionTime", func(t *testing.T) {
		clock := testutil.NewClock()
		var trips []balancer.Event
		b := newBalancer(t, 1, balancer.Options{Clock: clock, BreakerFailures: 1, MaxEjectionTime: 5 * time.Second, PanicThreshold: -1,
			OnEvent: func(ev balancer.Event) {
				if ev.Kind == balancer.EventTripped || ev.Kind == balancer.EventProbeFailed {
					trips = append(trips, ev)
				}
			}})
		for range 3 {
			p, err := b.Pick(&inferlb.Request{})
			require.NoError(t, err)
			p.Done(inferlb.Outcome{Err: errors.New("500")})
			_, err = b.Pick(&inferlb.Request{})
			require.ErrorIs(t, err, balancer.ErrNoEndpoints, "held out")
			clock.Advance(5 * time.Second)
		}
		require.Len(t, trips, 3)
		for _, ev := range trips {
			assert.Equal(t, 5*time.Second, ev.Until.Sub(ev.At), "%v: held out no longer than MaxEjectionTime", ev.Kind)
		}
	})
}
