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

// An endpoint that fails every other call through an outlier interval and
// then answers one call "overloaded" is cooling down when the interval is
// judged. The evaluation passed it over and dropped the interval's counts
// with the rest: it came back from its cooldown in good standing, and one
// that was overloaded again by each evaluation was never ejected. A
// cooldown says the server is busy, not that it is sound: the outlier is
// ejected, from the end of its cooldown on, when that is later.
func TestOutlierInCooldownIsStillJudged(t *testing.T) {
	for _, retryAfter := range []time.Duration{2 * time.Second, time.Minute} {
		t.Run(retryAfter.String(), func(t *testing.T) {
			clock := testutil.NewClock()
			rec := &recorder{}
			b := newBalancer(t, 4, balancer.Options{
				Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, Scorers: constantScorers(),
				BreakerFailures: -1, PanicThreshold: -1, MaxCooldown: time.Minute,
			})
			bad := endpoints(4)[0].Addr
			step := balancer.DefaultOutlierInterval / 500
			failEveryOther(t, b, clock, bad, 499, step)
			require.Empty(t, rec.kinds(), "nothing judged within the interval")
			hot := pickOn(t, b, bad)
			hot.Done(inferlb.Outcome{Overloaded: true, RetryAfter: retryAfter})
			require.Equal(t, []balancer.EventKind{balancer.EventCooldown}, rec.kinds())
			cooled := stat(t, b, bad).ExcludedUntil

			clock.Set(testutil.Epoch.Add(balancer.DefaultOutlierInterval)) // the interval ends: the next call has it judged
			p, err := b.Pick(&inferlb.Request{})
			require.NoError(t, err)
			require.NotEqual(t, bad, p.ID(), "cooling down")
			p.Done(inferlb.Outcome{})

			require.Equal(t, []balancer.EventKind{balancer.EventCooldown, balancer.EventEjected}, rec.kinds(),
				"an outlier while cooling down")
			ev := rec.last()
			assert.Equal(t, bad, ev.Endpoint)
			want := clock.Now().Add(balancer.DefaultEjectionTime)
			if cooled.After(want) {
				want = cooled
			}
			assert.WithinDuration(t, want, ev.Until, 0, "out until its ejection or its cooldown ends, whichever is later")
			assert.WithinDuration(t, want, stat(t, b, bad).ExcludedUntil, 0)
		})
	}
}
