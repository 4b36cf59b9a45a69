package balancer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// adapterFleet is n endpoints serving "base", and adapters LoRA adapters
// each on 2 or 3 of them, chosen at random: groups of different members.
func adapterFleet(n, adapters int, seed uint64) []inferlb.Endpoint {
	rng := rand.New(rand.NewPCG(seed, 7))
	lists := make([][]string, n)
	for i := range lists {
		lists[i] = []string{"base"}
	}
	for a := range adapters {
		for _, k := range rng.Perm(n)[:2+a%2] {
			lists[k] = append(lists[k], fmt.Sprintf("adapter-%d", a))
		}
	}
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.0.0.%d:8000", i), Labels: map[string]string{"model": strings.Join(lists[i], ",")}}
	}
	return eps
}

// A call counts on one counter per group its endpoint is in that keeps
// one. With LoRA adapters each on 2 or 3 of 32 replicas, every endpoint
// was in a group per adapter set it held (about 16 with 200 adapters, 160
// with 2,000) and a pick and its Done counted on each: 1.7 us a call with
// 2,000 adapters. Small groups keep no counter: the bound sums their
// members' calls, which is the same number.
func TestSmallModelGroupsKeepNoCounter(t *testing.T) {
	b := New(Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update(adapterFleet(32, 200, 1)))
	snap := b.def.snap.Load()
	b.mu.Lock()
	assert.Len(t, b.def.loads, 1, "only the whole fleet's group (base) keeps a counter")
	for _, e := range b.def.members {
		assert.Len(t, e.groupLoads.Load().counters, 1, "counters a call on %s counts on", e.id)
		assert.Greater(t, len(b.def.poolsOf[e]), 1, "%s still counts in each of its groups' pools", e.id)
	}
	b.mu.Unlock()

	var held []Pick
	for i := range 300 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("adapter-%d", i%7), AffinityKey: uint64(i%5 + 1)})
		require.NoError(t, err)
		held = append(held, p)
	}
	for name, g := range snap.byModel {
		var sum int64
		for _, e := range g.members {
			sum += e.inFlight.Load()
		}
		assert.Equal(t, sum, g.inFlight(), "calls in flight on %s's group", name)
	}
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	for name, g := range snap.byModel {
		assert.Zero(t, g.inFlight(), "%s's group after every Done", name)
	}
}

// Routing is the same whether a small group counts its calls or sums its
// members': the same seeded sequence of keyed picks (which the load bound
// spills once an owner holds too many), Dones, readiness changes and
// Updates picks the same endpoints with every group counted
// (countedGroup 0) as with small ones summed.
func TestSmallModelGroupsRouteAsCountedOnes(t *testing.T) {
	run := func(counted int) []string {
		defer func(n int) { countedGroup = n }(countedGroup)
		countedGroup = counted
		clock := testutil.NewClock()
		b := New(Options{Clock: clock, Rand: testutil.NewRand(3), AffinitySeed: 5})
		defer b.Close()
		eps := adapterFleet(12, 20, 2)
		require.NoError(t, b.Update(eps))
		rng := rand.New(rand.NewPCG(9, 9))
		var held []Pick
		var got []string
		for step := range 3000 {
			switch r := rng.IntN(20); {
			case r < 12:
				req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("adapter-%d", rng.IntN(6)), AffinityKey: uint64(rng.IntN(4) + 1), PromptTokens: 100}
				if r == 0 {
					req.Model = "base"
				}
				p, err := b.Pick(req)
				if err != nil {
					got = append(got, err.Error())
					continue
				}
				got = append(got, p.ID())
				held = append(held, p)
			case r < 17 && len(held) > 0:
				k := rng.IntN(len(held))
				held[k].Done(inferlb.Outcome{})
				held = append(held[:k], held[k+1:]...)
			case r == 17:
				b.SetReady(eps[rng.IntN(len(eps))].Addr, rng.IntN(3) != 0)
			case r == 18 && step%5 == 0:
				eps[rng.IntN(len(eps))].Weight = float64(1 + rng.IntN(3))
				require.NoError(t, b.Update(eps))
			default:
				clock.Advance(10e6)
			}
		}
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
		return got
	}
	summed, counted := run(countedGroup), run(0)
	require.Len(t, summed, len(counted))
	spread := map[string]bool{}
	for i := range summed {
		require.Equal(t, counted[i], summed[i], "pick %d", i)
		spread[summed[i]] = true
	}
	assert.Greater(t, len(spread), 6, "the bound spread keys over the fleet")
}
