package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// scanMarks is tenantMarks as it was before it found the tenant's marked
// pairs from their sets: a look at each member of g. It also returns how
// many members c allows the memory passes over for the tenant.
func (b *Balancer) scanMarks(tenant string, g *group, c *cand) (all bool, marked int) {
	t := b.refused.Load()
	if t == nil {
		return false, 0
	}
	key, now := b.keyer.Tenant(tenant), lackNow(c.nowNs)
	tsets, ttag := refusalSets(t.tenants[:], key, false)
	ts, tw := refusalFind(tsets, ttag, now, t.horizon, false)
	if ts == nil || tw&refusalMarked == 0 || tw&lackTimeMask <= now+t.hold {
		return false, 0
	}
	other := false
	for _, e := range g.members {
		if !c.ok(e) {
			continue
		}
		if t.marked(e, key, now) {
			marked++
		} else {
			other = true
		}
	}
	if marked == 0 || marked > max(int(b.cfg.maxEjected*float64(len(g.members))+1e-9), 1) {
		return false, marked
	}
	if !other {
		return true, marked
	}
	c.refused, c.tenant, c.tenantKeep = t, key, tw&lackKept == 0
	return false, marked
}

// tenantMarks counts the members a pick of a tenant's would pass over
// from the sets of the tenant's marked pairs (refusalTable.marks), not by
// a look at each member: its verdict must be a look's, whatever happened
// to the marks. Random runs over 24 endpoints, at most a quarter of them
// passed over (MaxEjectedFraction), of tenants whose runs of refusals mark
// endpoints, interleaved with: marks ending by time (ErrorDecay), a
// success of the tenant's on the endpoint, the clock stepping back, an
// Update that removes endpoints while marked (and adds them back, new),
// endpoints turning not ready, floods of made-up tenants evicting
// entries, and a tenant that shares another's bucket. After each step,
// every tenant's verdict, with and without a member excluded (a
// failover), is compared with scanMarks'; the runs must have passed
// members over, passed over every member allowed, and hit the cap.
func TestTenantMarksCountAsALookAtEachMember(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), MaxEjectedFraction: 0.25, AffinitySeed: 5})
	t.Cleanup(b.Close)
	addrs := make([]string, 24)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("e%d", i)
	}
	listed := func(keep func(i int) bool) []inferlb.Endpoint {
		var eps []inferlb.Endpoint
		for i, a := range addrs {
			if keep(i) {
				eps = append(eps, inferlb.Endpoint{Addr: a})
			}
		}
		return eps
	}
	require.NoError(t, b.Update(listed(func(int) bool { return true })))
	tenants := []string{"A", "B", "C", "D"}
	for i := 0; ; i++ { // a tenant in A's bucket
		name := fmt.Sprintf("x%d", i)
		if refusalBucket(b.keyer.Tenant(name)) == refusalBucket(b.keyer.Tenant("A")) {
			tenants = append(tenants, name)
			break
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	nowNs := func() int64 { return clock.Now().UnixNano() }
	members := func() []*endpoint { return b.def.snap.Load().groupFor("").members }
	marked := func(e *endpoint, tenant string) bool {
		tb := b.refused.Load()
		return tb != nil && tb.marked(e, b.keyer.Tenant(tenant), lackNow(nowNs()))
	}
	// mark refuses tenant's calls on e until the memory marks it, with
	// the tenant's calls served on endpoints not marked for it between,
	// to hold its share of client errors down.
	mark := func(tenant string, e *endpoint) {
		ms := members()
		for range 40 {
			for range 4 {
				if o := ms[rng.IntN(len(ms))]; o != e && !marked(o, tenant) {
					b.tenantServed(o, tenant, nowNs(), false)
				}
			}
			b.tenantRefused(e, tenant, nowNs())
			if marked(e, tenant) {
				return
			}
		}
	}
	var steered, everyone, capped int
	check := func(step int, what string) {
		g := b.def.snap.Load().groupFor("")
		limit := max(int(b.cfg.maxEjected*float64(len(g.members))+1e-9), 1)
		for _, tenant := range tenants {
			for _, exclude := range []string{"", g.members[rng.IntN(len(g.members))].id} {
				got := cand{nowNs: nowNs(), bit: b.def.bit, exclude: exclude, failover: exclude != ""}
				want := got
				gotAll := b.tenantMarks(tenant, g, &got)
				wantAll, n := b.scanMarks(tenant, g, &want)
				require.Equal(t, wantAll, gotAll, "step %d (%s): tenant %s, excluding %q, %d of %d passed over: all", step, what, tenant, exclude, n, len(g.members))
				require.Equal(t, want.refused != nil, got.refused != nil, "step %d (%s): tenant %s, excluding %q, %d of %d passed over: steered", step, what, tenant, exclude, n, len(g.members))
				require.Equal(t, want.tenant, got.tenant)
				require.Equal(t, want.tenantKeep, got.tenantKeep)
				switch {
				case wantAll:
					everyone++
				case want.refused != nil:
					steered++
				case n > limit:
					capped++
				}
			}
		}
	}
	for step := range 3000 {
		ms := members()
		tenant := tenants[rng.IntN(len(tenants))]
		var what string
		switch op := rng.IntN(100); {
		case op < 35:
			what = "mark"
			mark(tenant, ms[rng.IntN(len(ms))])
		case op < 45:
			what = "served"
			b.tenantServed(ms[rng.IntN(len(ms))], tenant, nowNs(), rng.IntN(2) == 0)
		case op < 70:
			what = "time"
			clock.Advance(time.Duration(rng.Int64N(int64(DefaultErrorDecay) * 2 / 3)))
		case op < 74:
			what = "step back"
			clock.Set(clock.Now().Add(-time.Duration(rng.Int64N(int64(DefaultErrorDecay)))))
		case op < 82:
			what = "update"
			drop := rng.IntN(len(addrs))
			require.NoError(t, b.Update(listed(func(i int) bool { return i%len(addrs) != drop && (i+1)%len(addrs) != drop })))
			if rng.IntN(2) == 0 {
				require.NoError(t, b.Update(listed(func(int) bool { return true })))
			}
		case op < 92:
			what = "ready" // n of the members, at random
			n := rng.IntN(len(ms) + 1)
			for i, j := range rng.Perm(len(ms)) {
				b.SetReady(ms[j].id, i < n)
			}
		default:
			what = "flood"
			for i := range 40 {
				b.tenantRefused(ms[rng.IntN(len(ms))], fmt.Sprintf("made-up-%d-%d", step, i), nowNs())
			}
		}
		check(step, what)
	}
	t.Logf("verdicts: %d steered, %d with every member allowed passed over, %d capped", steered, everyone, capped)
	assert.Positive(t, steered, "picks the memory steered")
	assert.Positive(t, everyone, "picks whose every allowed member was passed over")
	assert.Positive(t, capped, "picks with more passed over than MaxEjectedFraction")
}

// The cap follows the marks, step by step: over 8 endpoints with
// MaxEjectedFraction 0.3 (2 of 8 or 7, 1 of 6), tenant A's picks pass its
// marked endpoints over while there are at most 2 of them, and nothing
// over with 3; a success ends a mark, an Update that removes a marked
// endpoint drops its mark from the count, a member a pick cannot take
// anyway (not ready, excluded) is not counted, and marks that end with
// time (ErrorDecay after their last refusal) or come back at a clock
// stepped back are counted as the picks read them (scanMarks agrees at
// each step).
func TestTenantMarksCapFollowsTheMarks(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), MaxEjectedFraction: 0.3})
	t.Cleanup(b.Close)
	all := []inferlb.Endpoint{{Addr: "e0"}, {Addr: "e1"}, {Addr: "e2"}, {Addr: "e3"}, {Addr: "e4"}, {Addr: "e5"}, {Addr: "e6"}, {Addr: "e7"}}
	require.NoError(t, b.Update(all))
	nowNs := func() int64 { return clock.Now().UnixNano() }
	mark := func(id string) {
		t.Helper()
		for range 40 {
			b.tenantServed(b.eps["e7"], "A", nowNs(), false)
			b.tenantServed(b.eps["e6"], "A", nowNs(), false)
			b.tenantRefused(b.eps[id], "A", nowNs())
			if b.refused.Load().marked(b.eps[id], b.keyer.Tenant("A"), lackNow(nowNs())) {
				return
			}
		}
		t.Fatalf("%s not marked for A", id)
	}
	verdict := func(exclude string) string {
		t.Helper()
		g := b.def.snap.Load().groupFor("")
		got := cand{nowNs: nowNs(), bit: b.def.bit, exclude: exclude, failover: exclude != ""}
		want := got
		gotAll := b.tenantMarks("A", g, &got)
		wantAll, _ := b.scanMarks("A", g, &want)
		require.Equal(t, wantAll, gotAll)
		require.Equal(t, want.refused != nil, got.refused != nil)
		switch {
		case gotAll:
			return "every one"
		case got.refused != nil:
			return "passed over"
		}
		return "none"
	}
	mark("e0")
	mark("e1")
	assert.Equal(t, "passed over", verdict(""), "e0 and e1 marked: 2 of 8")
	mark("e2")
	assert.Equal(t, "none", verdict(""), "e0, e1 and e2 marked: 3 of 8")
	b.tenantServed(b.eps["e2"], "A", nowNs(), false)
	assert.Equal(t, "passed over", verdict(""), "e2 served A")
	mark("e2")
	require.Equal(t, "none", verdict(""))
	require.NoError(t, b.Update(slices.Delete(slices.Clone(all), 2, 3)))
	assert.Equal(t, "passed over", verdict(""), "e2 removed: 2 of 7")
	require.NoError(t, b.Update(slices.Delete(slices.Clone(all), 1, 3)))
	assert.Equal(t, "passed over", verdict(""), "e1 and e2 removed: e0, 1 of 6")
	mark("e3")
	assert.Equal(t, "none", verdict(""), "e0 and e3: 2 of 6")
	b.tenantServed(b.eps["e3"], "A", nowNs(), false)
	require.NoError(t, b.Update(all))
	assert.Equal(t, "passed over", verdict(""), "e1 and e2 back, new endpoints: e0, 1 of 8")
	mark("e1")
	assert.Equal(t, "passed over", verdict(""), "e0 and e1: 2 of 8")
	for _, id := range []string{"e3", "e4", "e5", "e6", "e7"} {
		require.True(t, b.SetReady(id, false))
	}
	assert.Equal(t, "passed over", verdict(""), "e2 is ready and not marked")
	assert.Equal(t, "every one", verdict("e2"), "a failover from e2")
	require.True(t, b.SetReady("e2", false))
	assert.Equal(t, "every one", verdict(""), "e0 and e1, both marked, are the only ready members")
	for _, id := range []string{"e2", "e3", "e4", "e5", "e6", "e7"} {
		require.True(t, b.SetReady(id, true))
	}
	clock.Advance(20 * time.Second)
	mark("e2")
	assert.Equal(t, "none", verdict(""), "3 of 8")
	require.True(t, b.SetReady("e2", false))
	assert.Equal(t, "passed over", verdict(""), "e2 not ready: 2 of 8 a pick could take")
	require.True(t, b.SetReady("e2", true))
	assert.Equal(t, "passed over", verdict("e1"), "a failover from e1: 2 of 8 it could take")
	clock.Advance(15 * time.Second)
	assert.Equal(t, "passed over", verdict(""), "e0's and e1's marks ended, 35 s after their last refusal")
	clock.Set(clock.Now().Add(-10 * time.Second))
	assert.Equal(t, "none", verdict(""), "the clock stepped back 10 s: e0's and e1's marks hold again")
	clock.Advance(40 * time.Second)
	assert.Equal(t, "none", verdict(""), "every mark ended")
}
