package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Slow start is relative to the member furthest along when every member
// ramps: a serving pool whose whole set is replaced (a blue/green switch,
// every address new from discovery) or whose connections all come back
// after an outage has no member at full weight to take more. Admitted at
// their absolute factor, owners at 0.1 kept 15% of their keys in the
// first seconds (48% at half the window), scattering the rest over caches
// that had none of them, and the load bound, dividing by the ramped
// weights, gave each owner ten fair shares.
func TestKeysStayWithOwnersWhenEveryMemberRamps(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(41)})
	fresh := make([]inferlb.Endpoint, 8)
	for i := range fresh {
		fresh[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.9.0.%d:8000", i+1)}
	}
	require.NoError(t, b.Update(fresh)) // a serving pool: every one ramps
	require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, fresh[0].Addr).RampFactor, 1e-9)
	plain := balancer.New(balancer.Options{AffinitySeed: seed, MinKeyReuse: -1, Rand: testutil.NewRand(41)})
	require.NoError(t, plain.Update(fresh))

	const keys = 200
	start := clock.Now()
	for _, at := range []time.Duration{0, 5 * time.Second, 15 * time.Second} {
		clock.Set(start.Add(at))
		kept := 0
		for k := uint64(1); k <= keys; k++ {
			key := k * 0x9e3779b97f4a7c15
			if owner(t, b, key) == owner(t, plain, key) {
				kept++
			}
		}
		assert.Equal(t, keys, kept, "at %v: keys at their owner", at)
	}

	// The bound is the fleet's: an owner takes what it would at full weight.
	key := uint64(0x5bd1e9955bd1e995)
	home := owner(t, plain, key)
	want := ownerTakes(t, plain, key, home, 40)
	assert.Less(t, want, int64(40), "the bound spills some of 40 calls")
	assert.InDelta(t, want, ownerTakes(t, b, key, home, 40), 1, "the owner's bound while every member ramps")
}

// A member at full weight that takes no calls (cooling down after an
// overload) leaves the others ramping together: relative to the lead, as
// when it is not there. Its return ends that (the others ramp as joiners
// again), which the cached standing notices at the cooldown's end.
func TestKeysStayWithOwnersWhenTheMemberAtFullWeightIsExcluded(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(43)})
	warm := endpoints(1)[0]
	all := []inferlb.Endpoint{warm}
	for i := range 8 {
		all = append(all, inferlb.Endpoint{Addr: fmt.Sprintf("10.9.0.%d:8000", i+1)})
	}
	require.NoError(t, b.Update(all)) // eight join the warm one: they ramp
	serial, ok := b.Serial(warm.Addr)
	require.True(t, ok)
	p, err := b.PickAt(&inferlb.Request{}, serial)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: 20 * time.Second})
	require.NotZero(t, stat(t, b, warm.Addr).ExcludedUntil)

	plain := balancer.New(balancer.Options{AffinitySeed: seed, MinKeyReuse: -1, Rand: testutil.NewRand(43)})
	require.NoError(t, plain.Update(all))
	const keys = 200
	// kept counts, of the first keys owned by a joiner, those its owner
	// takes (the warm member's keys go elsewhere while it cools down).
	kept := func() int {
		n := 0
		for k, counted := uint64(1), 0; counted < keys; k++ {
			key := k * 0x9e3779b97f4a7c15
			if home := owner(t, plain, key); home != warm.Addr {
				counted++
				if owner(t, b, key) == home {
					n++
				}
			}
		}
		return n
	}
	assert.Equal(t, keys, kept(), "keys at their owner while the member at full weight is excluded")

	clock.Advance(21 * time.Second) // back: the rest ramp as joiners of a serving member again
	assert.Less(t, kept(), keys*9/10, "joiners at 0.7 of their ramp keep only part of their keys")
}

// In panic routing (fewer members in good standing than PanicThreshold of
// the ready ones) every ready member takes calls, those excluded at full
// weight too, so a ramping member in good standing is not the lead of a
// pool ramping together: it takes calls at its own factor. The lead was
// found among the members in good standing whenever one was, so a joiner
// next to three warm members cooling down took a full share (156 of 1,000
// calls against 39) at a tenth of its ramp.
func TestPanicRoutingRampsAJoinerAtItsFactor(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(43)})
	warm := endpoints(3)
	joiner := inferlb.Endpoint{Addr: "10.9.0.1:8000"}
	require.NoError(t, b.Update(append(append([]inferlb.Endpoint{}, warm...), joiner))) // it ramps
	for _, w := range warm {
		serial, ok := b.Serial(w.Addr)
		require.True(t, ok)
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: 20 * time.Second})
		require.NotZero(t, stat(t, b, w.Addr).ExcludedUntil)
	}
	require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, joiner.Addr).RampFactor, 1e-9)
	// One of four in good standing, below the default threshold of half:
	// panic routing, the three warm ones at full weight among the picks.
	const calls = 1000
	took := 0
	for range calls {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		if p.ID() == joiner.Addr {
			took++
		}
		p.Done(inferlb.Outcome{})
	}
	assert.Less(t, took, calls/10, "a joiner at 0.1 of its ramp takes calls at that factor, not a quarter of them")
}
