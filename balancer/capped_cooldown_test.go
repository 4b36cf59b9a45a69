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

// A capped breaker's probes win their comparisons (armCappedProbes), as a
// half-open breaker's do; but not while its endpoint cools down after an
// overload answer: that endpoint said it is busy. Panic routing (or a
// tenant's shard that is all cooling down) offers cooling endpoints as
// candidates, and there a capped endpoint whose probes were due won every
// comparison it was in, the pick no probe at all (acquire saw it out of
// standing), so its probe slots never ran out: with calls held, it drew
// 202 of 400 calls in a pool of four while it was cooling down (58 now). A
// half-open breaker is probed only once its exclusion, a cooldown
// included, has ended, and so now is a capped one.
func TestCappedEndpointCoolingDownIsNoProbe(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OnEvent: rec.record})
	eps := endpoints(4)
	var holds []func()
	for _, ep := range eps[:2] { // two tripped: the cap (half of four) is reached
		call, _ := pinnedCalls(t, b, clock, ep.Addr)
		for range balancer.DefaultBreakerFailures {
			call(errDown)
		}
	}
	clock.Advance(balancer.DefaultEjectionTime / 2)
	capped := eps[2].Addr
	call, _ := pinnedCalls(t, b, clock, capped)
	for range balancer.DefaultBreakerFailures {
		call(errDown)
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventTripped, balancer.EventCapped}, rec.kinds())

	// The tripped two become half-open; their probes go out and hang, so
	// they are out of good standing until the probes are overdue (one
	// more EjectionTime).
	clock.Advance(balancer.DefaultEjectionTime / 2)
	for _, ep := range eps[:2] {
		serial, ok := b.Serial(ep.Addr)
		require.True(t, ok)
		for range balancer.DefaultBreakerProbes {
			p, err := b.PickAt(&inferlb.Request{}, serial)
			require.NoError(t, err)
			require.Equal(t, ep.Addr, p.ID())
			holds = append(holds, func() { p.Done(inferlb.Outcome{}) })
		}
	}
	// The capped endpoint's probes are due; it answers an overload with a
	// minute's Retry-After, and cools down.
	clock.Advance(balancer.DefaultEjectionTime/2 + time.Millisecond)
	serial, ok := b.Serial(capped)
	require.True(t, ok)
	p, err := b.PickAt(&inferlb.Request{}, serial)
	require.NoError(t, err)
	require.Equal(t, capped, p.ID())
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
	require.True(t, stat(t, b, capped).ExcludedUntil.After(clock.Now()), "cooling down")

	// One endpoint of four in good standing: panic routing, over all four.
	const calls = 400
	drew := map[string]int{}
	for range calls {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		drew[p.ID()]++
		holds = append(holds, func() { p.Done(inferlb.Outcome{}) })
	}
	t.Logf("calls held, in panic routing: %v (capped and cooling down: %s)", drew, capped)
	assert.Less(t, drew[capped], calls*3/10, "calls the cooling capped endpoint drew, of %d", calls)
	for _, h := range holds {
		h()
	}
}
