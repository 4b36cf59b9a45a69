package balancer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A half-open breaker whose probes are all out is breaker-open, not in
// good standing, for panic routing as for the pick itself. It used to count
// as good once its exclusion ended, so when the exclusions of most of a
// fleet ended, with a probe out on each, panic routing stopped: the
// survivors took all the traffic, and with the whole fleet half-open every
// call but the probes failed with ErrNoEndpoints until the probes
// answered (a long generation's worth of time), though panic routing had
// served them all through the exclusion.
func TestHalfOpenWithoutProbeSlotsIsNotGoodStanding(t *testing.T) {
	// tripThenProbe trips the breakers of eps, lets their exclusions end
	// and takes the one probe each has, leaving it out.
	tripThenProbe := func(t *testing.T, n int, tripped int) (*balancer.Balancer, []balancer.Pick) {
		clock := testutil.NewClock()
		b := newBalancer(t, n, balancer.Options{
			Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: -1,
			BreakerFailures: 1, BreakerProbes: 1, MaxEjectedFraction: 1,
			Scorers: constantScorers(),
		})
		eps := endpoints(n)[:tripped]
		for _, ep := range eps {
			p := pickOn(t, b, ep.Addr)
			p.Done(inferlb.Outcome{Err: errDown})
			require.True(t, stat(t, b, ep.Addr).BreakerOpen)
		}
		clock.Advance(balancer.DefaultEjectionTime)
		// Picks of the wrong endpoint are canceled: a success would be
		// a probe's verdict and close its breaker.
		var probes []balancer.Pick
		for _, ep := range eps {
			for {
				p, err := b.Pick(&inferlb.Request{})
				require.NoError(t, err)
				if p.ID() == ep.Addr {
					probes = append(probes, p)
					break
				}
				p.Done(inferlb.Outcome{Err: context.Canceled})
			}
		}
		for _, ep := range eps {
			require.True(t, stat(t, b, ep.Addr).BreakerOpen)
		}
		return b, probes
	}

	t.Run("most of the fleet", func(t *testing.T) {
		b, _ := tripThenProbe(t, 4, 3)
		// One of four good: panic routing spreads. (A panic-routed call
		// that succeeds on a half-open endpoint closes its breaker, which
		// ends the panic once two of four are good.)
		assert.Greater(t, len(spread(t, b, &inferlb.Request{}, 400)), 1, "the survivor takes everything")
	})
	t.Run("the whole fleet", func(t *testing.T) {
		b, probes := tripThenProbe(t, 2, 2)
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err, "panic routing, not ErrNoEndpoints")
		p.Done(inferlb.Outcome{})
		for i := range probes {
			probes[i].Done(inferlb.Outcome{})
		}
		for _, ep := range endpoints(2) {
			assert.False(t, stat(t, b, ep.Addr).BreakerOpen, ep.Addr)
		}
	})
}
