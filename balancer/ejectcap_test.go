package balancer_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
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

// TestMaxEjectedFractionIsPerModel: the cap keeps enough of a pool in
// rotation to carry its traffic, and each model's endpoints are their own
// pool (their own affinity ring, load bound and panic threshold): the
// big model's endpoints cannot serve the small model's calls. Counted over
// the whole fleet, the cap let every endpoint of a small model go, held
// out more than the fraction of a big one, and refused a small model its
// one ejection because a big model's endpoint was out.
func TestMaxEjectedFractionIsPerModel(t *testing.T) {
	fleet := func(big, small int) []inferlb.Endpoint {
		var eps []inferlb.Endpoint
		for i := range big {
			eps = append(eps, inferlb.Endpoint{Addr: fmt.Sprintf("big-%d", i), Labels: map[string]string{"model": "big"}})
		}
		for i := range small {
			eps = append(eps, inferlb.Endpoint{Addr: fmt.Sprintf("small-%d", i), Labels: map[string]string{"model": "small"}})
		}
		return eps
	}
	for _, tc := range []struct {
		name     string
		fraction float64
		fail     []string
		want     []string // breaker open afterwards
	}{
		// Fleet-wide: 2 of 10 is within half; both small ones went.
		{"a small model keeps half", 0.5, []string{"small-0", "small-1"}, []string{"small-0"}},
		// Fleet-wide: 5 of 10 is within half; 5 of the big model's 8 went.
		{"a big model keeps half", 0.5, []string{"big-0", "big-1", "big-2", "big-3", "big-4"},
			[]string{"big-0", "big-1", "big-2", "big-3"}},
		// Fleet-wide: 0.1 of 10 is one, and big-0 was it.
		{"one per model is always allowed", 0.1, []string{"big-0", "small-0"}, []string{"big-0", "small-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			b := balancer.New(balancer.Options{
				Clock: testutil.NewClock(), Rand: testutil.NewRand(1), OnEvent: rec.record, Scorers: constantScorers(),
				OutlierInterval: -1, BreakerFailures: 1, PanicThreshold: -1, MaxEjectedFraction: tc.fraction,
			})
			require.NoError(t, b.Update(fleet(8, 2)))
			for _, id := range tc.fail {
				p := pickOn(t, b, id)
				p.Done(inferlb.Outcome{Err: errDown})
			}
			var open []string
			for _, s := range b.Stats() {
				if s.BreakerOpen {
					open = append(open, s.ID)
				}
			}
			assert.Equal(t, tc.want, open, "events %v", rec.kinds())
		})
	}
}

// TestMaxEjectedFractionIsPerMembership: two channels to two fleets may
// share one Balancer, each with its Membership; each fleet is a pool of
// its own, as a model's endpoints are.
func TestMaxEjectedFractionIsPerMembership(t *testing.T) {
	b := balancer.New(balancer.Options{
		Clock: testutil.NewClock(), Rand: testutil.NewRand(2), Scorers: constantScorers(),
		OutlierInterval: -1, BreakerFailures: 1, PanicThreshold: -1,
	})
	require.NoError(t, b.Update(endpoints(8)))
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update([]inferlb.Endpoint{{Addr: "other-0"}, {Addr: "other-1"}}))
	for _, id := range []string{"other-0", "other-1"} {
		for {
			p, err := m.Pick(&inferlb.Request{})
			require.NoError(t, err)
			if p.ID() == id {
				p.Done(inferlb.Outcome{Err: errDown})
				break
			}
			p.Done(inferlb.Outcome{})
		}
	}
	assert.True(t, stat(t, b, "other-0").BreakerOpen)
	assert.False(t, stat(t, b, "other-1").BreakerOpen, "the other fleet keeps half")
}
