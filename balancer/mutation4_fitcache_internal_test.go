package balancer

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// Mutation sample 4 over the affinity bound's fit views (fitView,
// fitCache, fitLoad): each test names the mutant it kills.

// fitAgrees reports the fit view a call with filter c reads from g's
// cache at now, and asserts that it is the view summed afresh.
func fitAgrees(t *testing.T, b *Balancer, g *group, now time.Time, c *cand, what string) fleetSum {
	t.Helper()
	v, _ := fitRead(t, b, g, now, c, what)
	return v
}

// fitRead is fitAgrees, which also reports whether the view was summed
// anew rather than read from the cache.
func fitRead(t *testing.T, b *Balancer, g *group, now time.Time, c *cand, what string) (fleetSum, bool) {
	t.Helper()
	st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
	v, summed := g.fitLoad(b.cfg, st, now, c)
	r := needRange{lo: -1, hi: math.MaxInt64, plo: -1, phi: math.MaxInt64}
	fresh := g.sumReported(b.cfg, st, now, c, &r)
	assert.Equal(t, fresh.ok, v.ok, "%s: ok", what)
	assert.Equal(t, []float64{fresh.weight, fresh.passed, float64(fresh.aside)}, []float64{v.weight, v.passed, float64(v.aside)}, "%s: weight, passed, aside", what)
	if fresh.ok && v.ok {
		assert.Equal(t, fresh.total, v.total, "%s: total", what)
	}
	return v, summed
}

// windowCand is the filter of a call of tokens prompt tokens for model at
// now, as windowFilter sets it up.
func windowCand(t *testing.T, b *Balancer, g *group, model string, tokens int, now time.Time) cand {
	t.Helper()
	c := cand{nowNs: now.UnixNano(), bit: b.def.bit}
	require.False(t, b.windowFilter(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, PromptTokens: tokens}, g, &c, false))
	require.NotZero(t, c.windowNeed, "%d tokens: filtered", tokens)
	return c
}

// Two tenants' fit views of one group do not mix: A's call passes over
// ep-0 (weight 1), B's ep-2 (weight 2). Kills fitLoad leaving the tenant
// out of the view's key and its tag both (tenant not taken from c): B's
// call read A's view, 1 passed over.
func TestFitCacheKeepsTenantsApart(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), MaxEjectedFraction: 0.5, AffinitySeed: 3})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "e0", Weight: 1}, {Addr: "e1", Weight: 1}, {Addr: "e2", Weight: 2}, {Addr: "e3", Weight: 2}}))
	f := &marksFleet{t: t, b: b, clock: clock, looks: new(atomic.Int64)}
	const tenantB = "B"
	f.mark("A", f.ep(0), f.ep(1), f.ep(3))
	f.mark(tenantB, f.ep(2), f.ep(1), f.ep(3))
	g, now := f.group(), clock.Now()
	for _, tc := range []struct {
		tenant string
		passed float64
	}{{"A", 1}, {tenantB, 2}, {"A", 1}} {
		c := cand{nowNs: now.UnixNano(), bit: b.def.bit}
		require.False(t, b.tenantMarks(tc.tenant, g, &c))
		require.NotNil(t, c.refused, "%s steered", tc.tenant)
		v := fitAgrees(t, b, g, now, &c, tc.tenant)
		assert.Equal(t, tc.passed, v.passed, "%s: the weight passed over", tc.tenant)
	}
}

// A reader that finds a writer at work on the slot (its sequence odd)
// sums the view afresh rather than read the half-written one. Kills
// fitLoad reading a slot whose sequence is odd: it returned the writer's
// half-written sums.
func TestFitCacheMissesWhileAWriterWrites(t *testing.T) {
	const model = "llama"
	b, g, _, now := threeWindowFleet(t, model)
	c := windowCand(t, b, g, model, 6000, now)
	fitAgrees(t, b, g, now, &c, "cached")
	_, summed := fitRead(t, b, g, now, &c, "cached")
	require.False(t, summed, "the view is cached")
	for i := range g.fits { // a writer begins, on whichever slot holds it...
		f := &g.fits[i]
		f.seq.Add(1)
		f.sums.store(fleetSum{total: 1e6, weight: 1e6, passed: 1e6, aside: 1e6, ok: true})
	}
	v, summed := fitRead(t, b, g, now, &c, "while a writer writes")
	assert.True(t, summed, "summed afresh")
	assert.Equal(t, 2.0, v.passed)
}

// A member leaving rotation (a new eligibility epoch) shows in the cached
// view at once, as in the group's own (fleetLoad). Kills fitLoad not
// comparing the view's epoch: the view of six ready members stood.
func TestFitCacheFollowsEligibility(t *testing.T) {
	const model = "llama"
	b, g, _, now := threeWindowFleet(t, model)
	c := windowCand(t, b, g, model, 6000, now)
	assert.Equal(t, 4.0, fitAgrees(t, b, g, now, &c, "six ready").weight)
	require.True(t, b.SetReady("ep-5", false))
	assert.Equal(t, 3.0, fitAgrees(t, b, g, now, &c, "ep-5 not ready").weight)
}

// A view cached at a time the clock then stepped back before is summed
// afresh: the readings it counted are from the future now (more than
// TelemetryMaxAge ahead), and the members have none. Kills fitLoad not
// comparing the view's start with now: the view stood with its load.
func TestFitCacheAtAClockSteppedBack(t *testing.T) {
	const model = "llama"
	b, g, now := threeWindowFleetWith(t, model, Options{TelemetryMaxAge: 500 * time.Millisecond}, false)
	for i := range 6 {
		var s telemetry.Sample
		require.True(t, s.Set(telemetry.Running, 2))
		require.True(t, s.Set(telemetry.Waiting, 0))
		s.Time = now
		b.Publish(fmt.Sprintf("ep-%d", i), s)
	}
	c := windowCand(t, b, g, model, 6000, now)
	v := fitAgrees(t, b, g, now, &c, "with readings")
	require.True(t, v.ok)
	assert.Equal(t, 8.0, v.total, "4 members the call fits, 2 running on each")
	// Back less than the windows' step tolerance (they still hold), more
	// than TelemetryMaxAge (the readings do not).
	back := now.Add(-800 * time.Millisecond)
	c = windowCand(t, b, g, model, 6000, back)
	v = fitAgrees(t, b, g, back, &c, "0.8 s back")
	assert.False(t, v.ok, "no member has a reading at the time stepped back to")
}

// A view lapses fleetViewTTL after it was summed: a window learnt
// meanwhile shows from then on (not a moment later). Kills fitCache.live
// holding a view at its end (now-from <= fleetViewTTL): the window stood
// unseen at fleetViewTTL.
func TestFitCacheLapsesAtItsTTL(t *testing.T) {
	const model = "llama"
	b, g, _, now := threeWindowFleet(t, model)
	c := windowCand(t, b, g, model, 6000, now)
	assert.Equal(t, 2.0, fitAgrees(t, b, g, now, &c, "summed").passed)
	b.rememberWindow(g.members[4], model, 5000, false, now.UnixNano())
	st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
	before := now.Add(fleetViewTTL - 1)
	c = windowCand(t, b, g, model, 6000, before)
	v, summed := g.fitLoad(b.cfg, st, before, &c)
	assert.Equal(t, 2.0, v.passed, "within the view's life: the view as cached")
	assert.False(t, summed, "within the view's life: read from the cache")
	at := now.Add(fleetViewTTL)
	c = windowCand(t, b, g, model, 6000, at)
	assert.Equal(t, 3.0, fitAgrees(t, b, g, at, &c, "at fleetViewTTL").passed, "ep-4's window of 5,000 tokens")
}

// The prompt side of the cache's range: calls whose prompts lie between
// the prompt windows of the members passed over and those not read one
// view, up to the smallest window not passed over (inclusive). Kills
// fitLoad's needP <= phi as needP < phi: a call of exactly that prompt
// summed its view again.
func TestFitCacheHoldsForPromptsUpToTheWindow(t *testing.T) {
	const model = "llama"
	b, g, now := threeWindowFleetWith(t, model, Options{}, true)
	for _, step := range []struct {
		tokens int
		passed float64
		cached bool
	}{
		{6000, 2, false},
		{7000, 2, true},
		{8192, 2, true},
		{8193, 4, false},
	} {
		c := windowCand(t, b, g, model, step.tokens, now)
		require.NotZero(t, c.promptNeed)
		v, summed := fitRead(t, b, g, now, &c, fmt.Sprintf("%d tokens", step.tokens))
		assert.Equal(t, step.passed, v.passed, "%d tokens: the weight passed over", step.tokens)
		assert.Equal(t, step.cached, !summed, "%d tokens: read from the cache", step.tokens)
	}
}

// The affinity bound of a tenant's call leaves out the members that
// refuse the tenant (tenantrefusal.go), as it does those too small for a
// call or without its model: over 5 replicas, 2 passed over for A, the
// key's owner with 4 of the 9 calls in flight keeps A's next call of the
// key (10 calls shared by 3: a bound of 5), where shared by all 5 it
// would spill it (a bound of 3). Kills the pick setting up its fit view
// (c.fit) only for the model and window filters.
func TestAffinityBoundOfATenantLeavesOutItsRefusers(t *testing.T) {
	const key = 0x1234567890abcdef
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: 0x5eed, MinKeyReuse: -1, MaxEjectedFraction: 0.4})
	t.Cleanup(b.Close)
	eps := make([]inferlb.Endpoint, 5)
	for i := range eps {
		eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("e%d", i)}
	}
	require.NoError(t, b.Update(eps))
	f := &marksFleet{t: t, b: b, clock: clock, looks: new(atomic.Int64)}
	req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key, Tenant: "A"}
	p, err := b.Pick(req)
	require.NoError(t, err)
	home := b.eps[p.ID()]
	p.Done(inferlb.Outcome{})
	var rest []*endpoint
	for i := range 5 {
		if e := f.ep(i); e != home {
			rest = append(rest, e)
		}
	}
	smalls, others := rest[:2], rest[2:]
	for _, e := range smalls {
		f.mark("A", e, append([]*endpoint{home}, others...)...)
	}
	var held []Pick
	for e, n := range map[*endpoint]int{home: 4, others[0]: 3, others[1]: 2} {
		for range n {
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, e.serial)
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	p, err = b.Pick(req)
	require.NoError(t, err)
	assert.Equal(t, home.id, p.ID(), "the owner, with 4 calls of 9 shared by the 3 that take A's calls")
	p.Done(inferlb.Outcome{})
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
}
