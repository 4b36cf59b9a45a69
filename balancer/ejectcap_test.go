package balancer_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestConcurrentTripsRespectMaxEjectedFraction: when a whole fleet fails at
// once (a network blip), breakers trip on many goroutines together. Each
// checked the cap and then marked its endpoint out, so trips racing
// between the two each saw room for one more and together held out more
// than MaxEjectedFraction, just when the cap matters.
func TestConcurrentTripsRespectMaxEjectedFraction(t *testing.T) {
	const n = 8
	for round := range 100 {
		b := newBalancer(t, n, balancer.Options{
			Clock: testutil.NewClock(), Rand: testutil.NewRand(uint64(round)),
			Scorers: constantScorers(), OutlierInterval: -1, BreakerFailures: 1,
		})
		picks := make([]balancer.Pick, n)
		for i, ep := range endpoints(n) {
			picks[i] = pickOn(t, b, ep.Addr)
		}
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range picks {
			wg.Go(func() {
				start.Wait()
				picks[i].Done(inferlb.Outcome{Err: errDown})
			})
		}
		start.Done()
		wg.Wait()
		open := 0
		for _, s := range b.Stats() {
			if s.BreakerOpen {
				open++
			}
		}
		require.LessOrEqual(t, open, n/2, "round %d: MaxEjectedFraction 0.5 of %d", round, n)
	}
}

// TestAnEjectedEndpointCanTrip: the cap counts the endpoints held out
// besides the one to hold out. An endpoint that outlier detection has
// already ejected, and whose calls still in flight then fail, counted
// itself: its breaker's trip was capped, and when the ejection ended it
// went straight back into rotation, with no half-open probes.
func TestAnEjectedEndpointCanTrip(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(3), OnEvent: rec.record, Scorers: constantScorers(),
		OutlierMinRequests: 5,
	})
	eps := endpoints(4)
	a, c := eps[0].Addr, eps[1].Addr
	var stragglers []balancer.Pick
	for range balancer.DefaultBreakerFailures {
		stragglers = append(stragglers, pickOn(t, b, a))
	}
	// An interval in which a fails every other call: ejected.
	failEveryOther(t, b, clock, a, 400, balancer.DefaultOutlierInterval/200)
	require.Equal(t, []balancer.EventKind{balancer.EventEjected}, rec.kinds())
	for range balancer.DefaultBreakerFailures { // c trips: two of four out
		p := pickOn(t, b, c)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	for _, p := range stragglers {
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventEjected, balancer.EventTripped, balancer.EventTripped}, rec.kinds())
}
