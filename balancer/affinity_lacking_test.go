package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A key's order for a model passes over the endpoints remembered not to
// serve it (walkAffine), and so must the endpoints a slow owner hands its
// keys to (fasterSpill): they are the next ones in that order. Two of four
// endpoints answered that they do not serve "m" (a LoRA adapter the fleet
// does not label); the slow owner's keys whose ring order runs on through
// those two before the fast one were all kept by the slow owner, since the
// look at the next two endpoints found only the two passed over: about
// 30% of its keys kept instead of (1.5/4)^2 = 14%.
func TestSlowOwnerYieldsKeysPastEndpointsWithoutTheModel(t *testing.T) {
	const model = "m"
	eps := endpoints(4)
	slow, fast := eps[0].Addr, eps[3].Addr
	lacking := []string{eps[1].Addr, eps[2].Addr}
	b := affine(t, 4, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(4), SlowStartWindow: -1})
	keyOf := map[string]uint64{}
	for k := uint64(1); len(keyOf) < 4; k++ {
		if id := owner(t, b, k*0x9e3779b97f4a7c15|1); keyOf[id] == 0 {
			keyOf[id] = k*0x9e3779b97f4a7c15 | 1
		}
	}
	pickM := func(key uint64) balancer.Pick {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: key})
		require.NoError(t, err)
		return p
	}
	for _, id := range lacking {
		p := pickM(keyOf[id])
		require.Equal(t, id, p.ID())
		p.Done(inferlb.Outcome{NotServedModel: model, Latency: time.Millisecond})
	}
	const keys = 6000
	owners := make([]string, keys)
	for k := range owners {
		p := pickM(uint64(k)*0x9e3779b97f4a7c15 | 1)
		require.NotContains(t, lacking, p.ID(), "passed over")
		owners[k] = p.ID()
		p.Done(inferlb.Outcome{Model: model})
	}
	// Each endpoint learns its speed from one streamed call.
	for _, e := range eps {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: keyOf[e.Addr]})
		require.NoError(t, err)
		require.Equal(t, e.Addr, p.ID())
		if e.Addr == slow {
			decodeAt(p, 40*time.Millisecond)
		} else {
			decodeAt(p, 10*time.Millisecond)
		}
	}
	var slowKeys, kept, fastMoved int
	for k := range owners {
		p := pickM(uint64(k)*0x9e3779b97f4a7c15 | 1)
		got := p.ID()
		p.Done(inferlb.Outcome{Model: model})
		if owners[k] != slow {
			if got != owners[k] {
				fastMoved++
			}
			continue
		}
		slowKeys++
		switch got {
		case slow:
			kept++
		default:
			assert.Equal(t, fast, got, "the slow owner's keys go to the only fast endpoint with the model")
		}
	}
	require.Greater(t, slowKeys, 1000)
	assert.InDelta(t, (1.5/4)*(1.5/4), float64(kept)/float64(slowKeys), 0.05, "kept %d of %d", kept, slowKeys)
	assert.Zero(t, fastMoved, "keys of owners of normal speed moved")
}

// A key spilled past its owner stays where it is cached while the owner is
// above its share (stayAway), looking at the next endpoints in the key's
// order for the call's model: those remembered not to serve the model are
// not in it. The key's ring order here runs from its owner through the two
// endpoints without the model to the one it spilled to; the look at the
// next two endpoints found only the two passed over, and the key went
// home, so the fleet cached its prefix twice.
func TestSpilledKeyStaysWarmPastEndpointsWithoutTheModel(t *testing.T) {
	const model = "m"
	eps := endpoints(4)
	ms := make([]cache.Member, len(eps))
	for i, e := range eps {
		ms[i] = cache.Member{ID: e.Addr, Weight: 1}
	}
	ring := cache.NewPlacement(ms, seed)
	// A key whose ring order is home, the two endpoints without the
	// model, then the only other one: the spill target.
	key := uint64(4242)
	w := ring.Walk(key)
	var order []string
	for m, ok := w.Next(); ok; m, ok = w.Next() {
		order = append(order, ms[m].ID)
	}
	require.Len(t, order, 4)
	home, lacking, warm := order[0], order[1:3], order[3]

	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), SlowStartWindow: -1})
	keyOf := map[string]uint64{}
	for k := uint64(1); len(keyOf) < 4; k++ {
		if id := owner(t, b, k); keyOf[id] == 0 {
			keyOf[id] = k
		}
	}
	pick := func(key uint64, model string) balancer.Pick {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: key})
		require.NoError(t, err)
		return p
	}
	for _, id := range lacking {
		p := pick(keyOf[id], model)
		require.Equal(t, id, p.ID())
		p.Done(inferlb.Outcome{NotServedModel: model, Latency: time.Millisecond})
	}
	// The owner at its bound, two calls (the two endpoints without the
	// model share none of the model's load, see fitView, which shows the
	// second "not served" answer after fleetViewTTL): the key spills to
	// the warm endpoint.
	clock.Advance(time.Second)
	var held []balancer.Pick
	for range 2 {
		held = append(held, pick(key, model))
		require.Equal(t, home, held[len(held)-1].ID())
	}
	p := pick(key, model)
	require.Equal(t, warm, p.ID(), "the key spills past the endpoints without its model")
	p.Done(inferlb.Outcome{Model: model})
	for _, h := range held {
		h.Done(inferlb.Outcome{Model: model})
	}

	// 16 calls in flight: the owner holds 5, the warm endpoint 3, the two
	// others (without the model) 4 each. With the next call the owner and
	// the warm endpoint share 9: the fair share is 4.5 and the bound
	// ceil(1.25 x 4.5) = 6: the owner is within its bound but above its
	// share, the warm endpoint below it.
	want := map[string]int{home: 5, warm: 3, lacking[0]: 4, lacking[1]: 4}
	var calls []balancer.Pick
	for placed := true; placed; {
		placed = false
		for id, n := range want { // one round at a time: never past a bound
			if n == 0 {
				continue
			}
			p := pick(keyOf[id], "")
			require.Equal(t, id, p.ID(), "a call placed on its key's owner")
			calls = append(calls, p)
			want[id]--
			placed = true
		}
	}
	require.Len(t, calls, 16)
	clock.Advance(time.Second) // past the cached view (fitCache)
	p = pick(key, model)
	assert.Equal(t, warm, p.ID(), "an owner above its share leaves the key where it is cached")
	p.Done(inferlb.Outcome{Model: model})
	for i := range calls {
		calls[i].Done(inferlb.Outcome{})
	}
}
