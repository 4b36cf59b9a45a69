package balancer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// An adapter counts in one of its two entries; a third adapter whose two
// entries both hold others' calls is not counted (and reads as rare), and
// an entry is free again once its calls end.
func TestAdapterCountsEntries(t *testing.T) {
	a := &adapterCounts{seed: 99}
	h := modelID("sql")
	i, j := a.entries(h)
	assert.NotEqual(t, i, j, "two entries (for this name and seed)")
	e1 := a.add(h)
	e2 := a.add(h)
	assert.NotZero(t, e1)
	assert.Equal(t, e1, e2, "a second call counts in the same entry")
	assert.EqualValues(t, 2, a.count(h))

	// Two other adapters that take h's entries (found by search: the
	// table has 64 entries).
	var others []uint64
	for k := 0; len(others) < 2 && k < 1_000_000; k++ {
		o := modelID(string(rune('a'+k%26)) + string(rune(k)))
		oi, oj := a.entries(o)
		if loraTag(o) == loraTag(h) {
			continue
		}
		if (len(others) == 0 && oi == j) || (len(others) == 1 && oi == int(e1)-1 && oj != j) {
			others = append(others, o)
		}
	}
	if len(others) < 2 {
		t.Skip("no colliding names found")
	}
	a.flight[e1-1].Add(^uint64(0))
	a.flight[e1-1].Add(^uint64(0)) // h's calls end: its entry is free
	assert.Zero(t, a.count(h))
	o1 := a.add(others[0])
	o2 := a.add(others[1])
	assert.NotZero(t, o1)
	assert.NotZero(t, o2)
	assert.Zero(t, a.add(h), "both of h's entries hold others' calls")
	assert.Zero(t, a.count(h))
	a.flight[o1-1].Add(^uint64(0))
	assert.NotZero(t, a.add(h), "one of them is free again")
	assert.EqualValues(t, 1, a.count(h))
}

// A call sent to its adapter's home adds its prompt to the endpoint's
// prefill estimate, as any call that its key did not send after a cached
// prefix does: the home holds the adapter, not this prompt's prefix. A
// call that followed its own prompt key adds nothing (it is likely
// cached there).
func TestAdapterHomeCountsThePrefill(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(3), MinKeyReuse: -1})
	t.Cleanup(b.Close)
	var eps []inferlb.Endpoint
	for i := range 4 {
		eps = append(eps, inferlb.Endpoint{Addr: fmt.Sprintf("10.0.0.%d:8000", i)})
	}
	require.NoError(t, b.Update(eps))
	prefill := func(model string, homes bool) float64 {
		for _, ep := range eps { // a fresh reading of the slots
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, 0)
			s.Set(telemetry.Waiting, 0)
			s.SetAdapters(4, &telemetry.Adapters{Base: "llama"})
			b.Publish(ep.Addr, s)
		}
		b.cfg.adapterHomes = -1
		if homes {
			b.cfg.adapterHomes = 1
		}
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: 12345, PromptTokens: 4000})
		require.NoError(t, err)
		got := p.e.prefill.at(clock.Now().UnixNano())
		p.Done(inferlb.Outcome{})
		clock.Advance(time.Minute) // the estimate decays away
		return got
	}
	assert.Zero(t, prefill("sql", false), "its prompt key sent it")
	assert.InDelta(t, 4000, prefill("sql", true), 1, "its adapter's home")
	assert.Zero(t, prefill("llama", true), "the base model follows its key")
}

// Adapter homes are keyed picks: with affinity off, nothing reads the
// Balancer's adapter counts, and a pick leaves them alone.
func TestAdapterCountsIdleWithoutAffinity(t *testing.T) {
	clock := testutil.NewClock()
	for _, affinity := range []AffinityMode{AffinityPrefer, AffinityOff} {
		b := New(Options{Clock: clock, Rand: testutil.NewRand(3), Affinity: affinity})
		t.Cleanup(b.Close)
		ep := inferlb.Endpoint{Addr: "10.0.0.1:8000"}
		require.NoError(t, b.Update([]inferlb.Endpoint{ep}))
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 0)
		s.SetAdapters(4, &telemetry.Adapters{Base: "llama"})
		b.Publish(ep.Addr, s)
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "sql"})
		require.NoError(t, err)
		want := int64(1)
		if affinity == AffinityOff {
			want = 0
		}
		assert.Equal(t, want, b.adapters.count(adapterID("sql", b.adapters.seed)), "affinity %v: the adapter's calls counted", affinity)
		p.Done(inferlb.Outcome{})
		assert.Zero(t, b.adapters.count(adapterID("sql", b.adapters.seed)))
	}
}
