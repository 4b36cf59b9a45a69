package balancer

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Mutation sample 4 over the tenants' refusals memory's marks
// (refusalTable.marks, tenantMarks, markedMember): each test names the
// mutant it kills.

// marksFleet is a Balancer on a fake clock over n endpoints e0..e(n-1),
// with MaxEjectedFraction frac, and helpers on its tenants' memory.
type marksFleet struct {
	t     *testing.T
	b     *Balancer
	clock *testutil.Clock
	looks *atomic.Int64
}

func newMarksFleet(t *testing.T, n int, frac float64) *marksFleet {
	t.Helper()
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), MaxEjectedFraction: frac, AffinitySeed: 9})
	t.Cleanup(b.Close)
	looks := new(atomic.Int64)
	b.tenantLooks.Store(looks) // before the memory is allocated
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("e%d", i)}
	}
	require.NoError(t, b.Update(eps))
	return &marksFleet{t: t, b: b, clock: clock, looks: looks}
}

func (f *marksFleet) nowNs() int64             { return f.clock.Now().UnixNano() }
func (f *marksFleet) ep(i int) *endpoint       { return f.b.eps[fmt.Sprintf("e%d", i)] }
func (f *marksFleet) group() *group            { return f.b.def.snap.Load().groupFor("") }
func (f *marksFleet) key(tenant string) uint64 { return f.b.keyer.Tenant(tenant) }

func (f *marksFleet) marked(e *endpoint, tenant string) bool {
	t := f.b.refused.Load()
	return t != nil && t.marked(e, f.key(tenant), lackNow(f.nowNs()))
}

// mark refuses tenant's calls on e until the memory marks the pair, with
// calls of the tenant's served on the endpoints in served between, to
// hold its share of client errors down.
func (f *marksFleet) mark(tenant string, e *endpoint, served ...*endpoint) {
	f.t.Helper()
	for range 40 {
		for _, o := range served {
			f.b.tenantServed(o, tenant, f.nowNs(), false)
		}
		f.b.tenantRefused(e, tenant, f.nowNs())
		if f.marked(e, tenant) {
			return
		}
	}
	f.t.Fatalf("%s not marked for %s", e.id, tenant)
}

// picks returns the endpoints n picks of tenant's embedding calls took.
func (f *marksFleet) picks(tenant string, n int) map[string]int {
	f.t.Helper()
	got := map[string]int{}
	for range n {
		p, err := f.b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tenant})
		require.NoError(f.t, err)
		got[p.ID()]++
		p.Done(inferlb.Outcome{}) // names no tenant: the memory stays as it is
	}
	return got
}

// The memory passes at least one endpoint over for a tenant, however
// small MaxEjectedFraction times the pool: with 0.1 of 4 endpoints (0.4),
// A's picks avoid the one that refuses it. Kills the cap's floor of 1
// (max(..., 1) in tenantMarks) lowered to 0: nothing was passed over.
func TestTenantMarksPassOneOverBelowAWholeFraction(t *testing.T) {
	f := newMarksFleet(t, 4, 0.1)
	f.mark("A", f.ep(0), f.ep(1), f.ep(2))
	got := f.picks("A", 60)
	assert.Zero(t, got["e0"], "A's picks of e0, which refuses it: %v", got)
	assert.Len(t, got, 3, "A's picks spread over the others: %v", got)
}

// The cap is MaxEjectedFraction of the pool as a whole number, even
// where the product rounds below it: 0.58 of 50 is 28.999999999999996 in
// floating point, and 29 endpoints marked for A are passed over, 30 are
// not (every endpoint is then a candidate). Kills tenantMarks' limit
// without its 1e-9: 28, and nothing passed over at 29.
func TestTenantMarksCapIsAWholeFractionOfThePool(t *testing.T) {
	f := newMarksFleet(t, 50, 0.58)
	require.Less(t, f.b.cfg.maxEjected*50, 29.0, "the premise: the product rounds below 29")
	served := []*endpoint{f.ep(40), f.ep(41), f.ep(42), f.ep(43)}
	for i := range 29 {
		f.mark("A", f.ep(i), served...)
	}
	got := f.picks("A", 100)
	for i := range 29 {
		assert.Zero(t, got[fmt.Sprintf("e%d", i)], "29 of 50 marked: A's picks of e%d: %v", i, got)
	}
	f.mark("A", f.ep(29), served...)
	got = f.picks("A", 100)
	onMarked := 0
	for i := range 30 {
		onMarked += got[fmt.Sprintf("e%d", i)]
	}
	assert.Positive(t, onMarked, "30 of 50 marked, past the cap: nothing is passed over: %v", got)
}

// A tenant whose entry a flood of made-up tenants evicted keeps its
// marked pairs, but they pass nothing over until its new entry is marked
// (refusedTenants, refusalTable.marks): a single refusal of A's
// elsewhere, which takes a new entry and marks nothing, leaves e0 a
// candidate again. Kills tenantMarks not checking that the tenant's
// entry is marked (tw&refusalMarked): the old pair passed e0 over.
func TestEvictedTenantsOldMarksPassNothingOver(t *testing.T) {
	f := newMarksFleet(t, 4, 0.5)
	f.mark("A", f.ep(0), f.ep(1), f.ep(2), f.ep(3))
	require.Zero(t, f.picks("A", 40)["e0"], "A's picks of e0 while it is marked")
	tb := f.b.refused.Load()
	entry := func() bool {
		sets, tag := refusalSets(tb.tenants[:], f.key("A"), false)
		s, _ := refusalFind(sets, tag, lackNow(f.nowNs()), tb.horizon, false)
		return s != nil
	}
	for i := 0; entry(); i++ {
		require.Less(t, i, 10000, "A's entry was never evicted")
		f.b.tenantRefused(f.ep(1+i%3), fmt.Sprintf("made-up-%d", i), f.nowNs())
	}
	require.True(t, f.marked(f.ep(0), "A"), "the premise: A's pair on e0 outlived its entry")
	f.b.tenantRefused(f.ep(1), "A", f.nowNs())
	require.True(t, entry())
	got := f.picks("A", 40)
	assert.Positive(t, got["e0"], "A's picks of e0, its marks from before its entry was evicted: %v", got)
}

// A tenant's pick looks at the sets of pairs its own bucket of tenants
// noted (refusalTable.marks), not at those of other tenants' marked
// pairs: 30 tenants of other buckets each refused on an endpoint of 64
// leave A's pick looking at one set's four slots and a member or two.
// Kills refusalBucket giving every tenant one bucket: A's pick looked at
// every set holding a marked pair, about 30 times as many.
func TestTenantPickLooksOnlyAtItsBucketsMarks(t *testing.T) {
	f := newMarksFleet(t, 64, 0.5)
	served := []*endpoint{f.ep(60), f.ep(61), f.ep(62), f.ep(63)}
	f.mark("A", f.ep(0), served...)
	for i := range 30 { // with this AffinitySeed, none in A's bucket
		f.mark(fmt.Sprintf("x%d", i), f.ep(1+i), served...)
	}
	g := f.group()
	c := cand{nowNs: f.nowNs(), bit: f.b.def.bit}
	before := f.looks.Load()
	require.False(t, f.b.tenantMarks("A", g, &c))
	looks := f.looks.Load() - before
	require.NotNil(t, c.refused, "e0 passed over for A")
	t.Logf("A's verdict took %d looks", looks)
	assert.LessOrEqual(t, looks, int64(2*lackWays+2), "looks for A's verdict, 30 other tenants' pairs marked")
}

// noted returns the sets of pairs marks notes for bucket bkt, and those
// that hold a marked pair of one of its tenants (lapsed or not).
func noted(tb *refusalTable, bkt int) (bitsSet, holding map[int]bool) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	bitsSet, holding = map[int]bool{}, map[int]bool{}
	for wi := range tb.marks[bkt] {
		for m := tb.marks[bkt][wi].Load(); m != 0; m &= m - 1 {
			bitsSet[wi*64+bits.TrailingZeros64(m)] = true
		}
	}
	for set := range refusalPairSets {
		if tb.holdsMark(bkt, set) {
			holding[set] = true
		}
	}
	return bitsSet, holding
}

// A refusal that marks no pair notes no set: the bits are the sets that
// hold (or held since their bucket's last mark) a marked pair. Kills
// tenantRefused noting the pair's set whether or not it marked it.
func TestTenantRefusalThatMarksNothingNotesNoSet(t *testing.T) {
	f := newMarksFleet(t, 8, 0.5)
	for i := range 8 {
		f.b.tenantRefused(f.ep(i), fmt.Sprintf("t%d", i), f.nowNs())
	}
	tb := f.b.refused.Load()
	for bkt := range refusalBuckets {
		got, _ := noted(tb, bkt)
		assert.Empty(t, got, "bucket %d: sets noted with nothing marked", bkt)
	}
}

// After each mark, the sets noted for the tenant's bucket are exactly
// those that hold a marked pair of one of its tenants, and at every step
// every set that holds one is noted. Random runs over 64 endpoints and
// 24 tenants (so that sets hold pairs of several buckets), of marks and
// of successes that end them. Kills noteMark keeping the sets that no
// longer hold a mark of the bucket (no clearing) and holdsMark reading
// a marked pair of any bucket as the bucket's; the run must have dropped
// a set that still held another bucket's mark.
func TestTenantMarkBitsAreTheSetsHoldingMarks(t *testing.T) {
	t.Parallel()
	f := newMarksFleet(t, 64, 0.5)
	tenants := make([]string, 24)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("t%d", i)
	}
	rng := rand.New(rand.NewPCG(4, 5))
	served := []*endpoint{f.ep(60), f.ep(61), f.ep(62), f.ep(63)}
	prev := map[int]map[int]bool{} // bucket -> sets noted before the step
	droppedShared := 0
	for step := range 1500 {
		tenant := tenants[rng.IntN(len(tenants))]
		bkt := refusalBucket(f.key(tenant))
		e := f.ep(rng.IntN(60))
		if rng.IntN(3) == 0 {
			f.b.tenantServed(e, tenant, f.nowNs(), false)
		} else {
			f.mark(tenant, e, served...)
			tb := f.b.refused.Load()
			got, holding := noted(tb, bkt)
			require.Equal(t, holding, got, "step %d: sets noted for bucket %d after a mark of %s", step, bkt, tenant)
			for set := range prev[bkt] {
				if !got[set] && setHoldsAnyMark(tb, set) {
					droppedShared++
				}
			}
		}
		tb := f.b.refused.Load()
		if tb == nil {
			continue // nothing refused yet
		}
		for _, tn := range tenants {
			b := refusalBucket(f.key(tn))
			got, holding := noted(tb, b)
			for set := range holding {
				require.True(t, got[set], "step %d: set %d holds a mark of bucket %d, not noted", step, set, b)
			}
			prev[b] = got
		}
	}
	t.Logf("%d sets dropped from a bucket's while holding another bucket's mark", droppedShared)
	assert.Positive(t, droppedShared, "sets dropped while they held another bucket's mark")
}

func setHoldsAnyMark(tb *refusalTable, set int) bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for i := set * lackWays; i < (set+1)*lackWays; i++ {
		if tb.pairs[i].Load()&refusalMarked != 0 {
			return true
		}
	}
	return false
}

// A pair that stands in two slots (a copy a clock stepped back may bring
// back to life beside its successor) is counted once: markedMember
// counts the slot that marked reads for the pair, not any slot with its
// tag. With 4 endpoints at MaxEjectedFraction 0.25 (one), A's marked e0
// held in two slots is still passed over. Kills markedMember taking any
// live slot with the pair's tag: e0 counted twice passed the cap, and
// nothing was passed over.
func TestTenantPairInTwoSlotsCountsOnce(t *testing.T) {
	f := newMarksFleet(t, 4, 0.25)
	var e *endpoint
	key := f.key("A")
	for i := range 4 { // an endpoint whose pair with A has two sets
		if s, _ := refusalSets(make([]atomic.Uint64, refusalPairs), pairKey(f.ep(i).serial, key), true); s[1] != nil {
			e = f.ep(i)
			break
		}
	}
	require.NotNil(t, e)
	var others []*endpoint
	for i := range 4 {
		if f.ep(i) != e {
			others = append(others, f.ep(i))
		}
	}
	f.mark("A", e, others...)
	tb := f.b.refused.Load()
	now := lackNow(f.nowNs())
	sets, tag := refusalSets(tb.pairs[:], pairKey(e.serial, key), true)
	s, w := refusalFind(sets, tag, now, tb.horizon, true)
	require.NotNil(t, s)
	index := func(p *atomic.Uint64) int {
		for i := range tb.pairs {
			if &tb.pairs[i] == p {
				return i
			}
		}
		return -1
	}
	// The copy: in the other set, after the pair's slot.
	copyAt := -1
	for k := range sets {
		if index(&sets[k][0]) == index(s)/lackWays*lackWays {
			continue
		}
		for i := range sets[k] {
			if sets[k][i].Load() == 0 {
				copyAt = index(&sets[k][i])
				break
			}
		}
	}
	require.GreaterOrEqual(t, copyAt, 0)
	tb.mu.Lock()
	tb.own(pairKey(e.serial, key), &tb.pairs[copyAt], e.serial, refusalBucket(key))
	tb.pairs[copyAt].Store(w)
	tb.noteMark(refusalBucket(key), copyAt/lackWays)
	tb.mu.Unlock()
	g := f.group()
	read, _ := refusalFind(sets, tag, now, tb.horizon, true) // the slot marked reads
	other := copyAt
	if index(read) == copyAt {
		other = index(s)
	}
	assert.Nil(t, tb.markedMember(other, key, now, g), "the slot marked does not read")
	assert.Equal(t, e, tb.markedMember(index(read), key, now, g))
	c := cand{nowNs: f.nowNs(), bit: f.b.def.bit}
	require.False(t, f.b.tenantMarks("A", g, &c))
	assert.NotNil(t, c.refused, "%s, marked for A, passed over", e.id)
}
