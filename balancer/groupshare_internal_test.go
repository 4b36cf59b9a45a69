package balancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Models served by the same endpoints share one group: one ring, one load
// counter. A fleet listing a base model and its LoRA adapters on every
// endpoint built a group per name, and each call counted on every one of
// them (a pick and its Done cost 25 us with 2,000 names listed,
// BenchmarkPickManyModels). Models served by different endpoints keep
// groups of their own, and each counter still holds the calls in flight
// on its members, across an Update that moves a model.
func TestModelsOfTheSameEndpointsShareAGroup(t *testing.T) {
	// Every group keeps a counter here, small as these are (countedGroup).
	defer func(n int) { countedGroup = n }(countedGroup)
	countedGroup = 0
	b := New(Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	full, part := map[string]string{"model": "base,lora1,lora2"}, map[string]string{"model": "base, lora1"}
	eps := []inferlb.Endpoint{{Addr: "a:1", Labels: full}, {Addr: "b:1", Labels: full}, {Addr: "c:1", Labels: part}, {Addr: "d:1", Labels: part}, {Addr: "e:1"}}
	require.NoError(t, b.Update(eps))

	snap := b.def.snap.Load()
	base, lora1, lora2 := snap.byModel["base"], snap.byModel["lora1"], snap.byModel["lora2"]
	assert.Same(t, base, lora1, "base and lora1 are served by the same endpoints")
	assert.Same(t, snap.all, base, "every endpoint serves base (e, unlabelled, serves any model)")
	assert.NotSame(t, base, lora2)
	assert.Len(t, lora2.members, 3, "a, b and the unlabelled e")
	assert.Len(t, snap.anyModel.members, 1)
	b.mu.Lock()
	assert.Len(t, b.def.loads, 3, "counters: every endpoint's, lora2's, the unlabelled's")
	for _, e := range b.def.members {
		want := map[string]int{"a:1": 2, "b:1": 2, "c:1": 1, "d:1": 1, "e:1": 3}[e.id]
		assert.Len(t, b.def.groupsOf[e], want, "counters of %s", e.id)
		assert.Len(t, b.def.poolsOf[e], want, "pools of %s", e.id)
	}
	b.mu.Unlock()

	// Counters hold the calls in flight on their members.
	var held []Pick
	for i := range 40 {
		model := []string{"base", "lora1", "lora2", "unknown"}[i%4]
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, PromptTokens: 10})
		require.NoError(t, err)
		held = append(held, p)
	}
	checkCounters := func(when string) {
		t.Helper()
		b.mu.Lock()
		defer b.mu.Unlock()
		s := b.def.snap.Load()
		for _, g := range append([]*group{s.all, s.anyModel}, s.byModel["lora2"]) {
			sum := int64(0)
			for _, e := range g.members {
				sum += e.inFlight.Load()
			}
			assert.Equal(t, sum, g.load.Load(), "%s: the counter of a group of %d", when, len(g.members))
		}
	}
	checkCounters("after the picks")

	// c comes to serve lora2: lora2's group grows, the others stay.
	eps[2].Labels = full
	require.NoError(t, b.Update(eps))
	snap = b.def.snap.Load()
	assert.Len(t, snap.byModel["lora2"].members, 4)
	assert.Same(t, snap.all, snap.byModel["lora1"])
	checkCounters("after the Update")
	for i, p := range held {
		p.Done(inferlb.Outcome{})
		if i == len(held)/2 {
			checkCounters("halfway through the Done calls")
		}
	}
	checkCounters("after every Done")
	b.mu.Lock()
	for k, c := range b.def.loads {
		assert.Zero(t, c.Load(), "counter %q", k)
	}
	b.mu.Unlock()
}

// Groups are shared by the set of their members, whatever the members'
// IDs hold. Named by IDs joined with a NUL, the set of the one endpoint
// "a\x00b" and the set of "a" and "b" were one: model x, served by the
// first only, was routed to a and b, which do not serve it.
func TestSharedGroupsAreTheirMembersWhateverTheirIDs(t *testing.T) {
	b := New(Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{
		{ID: "a", Addr: "a:1", Labels: map[string]string{"model": "y"}},
		{ID: "b", Addr: "b:1", Labels: map[string]string{"model": "y"}},
		{ID: "a\x00b", Addr: "c:1", Labels: map[string]string{"model": "x"}},
	}))
	for range 20 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "x"})
		require.NoError(t, err)
		assert.Equal(t, "a\x00b", p.ID(), "x is served by one endpoint")
		p.Done(inferlb.Outcome{})
		p, err = b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "y"})
		require.NoError(t, err)
		assert.Contains(t, []string{"a", "b"}, p.ID(), "y is served by a and b")
		p.Done(inferlb.Outcome{})
	}
	snap := b.def.snap.Load()
	assert.NotSame(t, snap.byModel["x"], snap.byModel["y"])
}
