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

func countKind(rec *recorder, k balancer.EventKind) int {
	n := 0
	for _, got := range rec.kinds() {
		if got == k {
			n++
		}
	}
	return n
}

// EventCapped marks the change, as every event does: a breaker that trips
// under the cap stays capped (gobreaker holds it open, and each later
// failure opens it again) and reported EventCapped on every failure, a
// capped outlier on every evaluation, so an observer counting them
// counted failures, not endpoints the cap kept in rotation. It comes once
// per episode: again after the breaker closed (or outlier detection found
// the endpoint healthy) and it was capped anew.
func TestCappedIsReportedOncePerEpisode(t *testing.T) {
	t.Run("breaker", func(t *testing.T) {
		clock := testutil.NewClock()
		rec := &recorder{}
		b := resilient(t, clock, rec, 4)
		for i := range 2 {
			for range balancer.DefaultBreakerFailures {
				p := pickOn(t, b, endpoints(4)[i].Addr)
				p.Done(inferlb.Outcome{Err: errDown})
			}
		}
		capped := endpoints(4)[2].Addr
		fail := func(n int) {
			for range n {
				p := pickOn(t, b, capped)
				p.Done(inferlb.Outcome{Err: errDown})
			}
		}
		fail(balancer.DefaultBreakerFailures)
		require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventTripped, balancer.EventCapped}, rec.kinds())
		fail(10)
		assert.Equal(t, 1, countKind(rec, balancer.EventCapped), "one capped trip, reported per failure")
		assert.False(t, stat(t, b, capped).BreakerOpen, "kept in rotation")

		for range balancer.DefaultBreakerProbes { // its breaker closes
			p := pickOn(t, b, capped)
			p.Done(inferlb.Outcome{})
		}
		fail(balancer.DefaultBreakerFailures - 1)
		assert.Equal(t, 1, countKind(rec, balancer.EventCapped), "closed, it needs a streak to trip again")
		fail(1)
		assert.Equal(t, 2, countKind(rec, balancer.EventCapped), "a new capped trip")
	})
	t.Run("outlier", func(t *testing.T) {
		clock := testutil.NewClock()
		rec := &recorder{}
		b := newBalancer(t, 4, balancer.Options{
			Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record, Scorers: constantScorers(),
			MaxEjectedFraction: 0.25, EjectionTime: time.Hour, MaxEjectionTime: time.Hour, OutlierMinRequests: 5,
		})
		for range balancer.DefaultBreakerFailures { // one of four out: the cap
			p := pickOn(t, b, endpoints(4)[0].Addr)
			p.Done(inferlb.Outcome{Err: errDown})
		}
		require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
		bad := endpoints(4)[1].Addr
		step := balancer.DefaultOutlierInterval / 500
		failEveryOther(t, b, clock, bad, 2000, step) // four evaluations find it an outlier
		assert.Equal(t, 1, countKind(rec, balancer.EventCapped), "one capped outlier, reported per evaluation")
		assert.Zero(t, countKind(rec, balancer.EventEjected))

		failEveryOther(t, b, clock, "none", 1000, step) // healthy again
		assert.Equal(t, 1, countKind(rec, balancer.EventCapped))
		failEveryOther(t, b, clock, bad, 1000, step)
		assert.Equal(t, 2, countKind(rec, balancer.EventCapped), "an outlier again")
	})
}
