package cache_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

const testKeys = 100_000

// randomKeys are the keys the placement properties are measured on: a fixed
// seed makes every run check the same ones.
func randomKeys() []uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, testKeys)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	return keys
}

func ownerID(p *cache.Placement, ms []cache.Member, key uint64) string {
	w := p.Walk(key)
	m, ok := w.Next()
	if !ok {
		return ""
	}
	return ms[m].ID
}

func TestPlacementRemoveOneMovesOnlyItsKeys(t *testing.T) {
	ms := membersN(16)
	p := cache.NewPlacement(ms, 9)
	keys := randomKeys()
	for gone := range ms {
		rest := slices.Delete(slices.Clone(ms), gone, gone+1)
		q := cache.NewPlacement(rest, 9)
		moved := 0
		for _, k := range keys {
			before, after := ownerID(p, ms, k), ownerID(q, rest, k)
			if before != after {
				moved++
				require.Equal(t, ms[gone].ID, before, "only the removed member's keys may move")
			}
		}
		assert.LessOrEqual(t, float64(moved), 1.3/16*testKeys, "removing member %d moved %d keys", gone, moved)
	}
}

func TestPlacementAddOneMovesOnlyToIt(t *testing.T) {
	ms := membersN(17)
	old := ms[:16]
	p, q := cache.NewPlacement(old, 9), cache.NewPlacement(ms, 9)
	moved := 0
	for _, k := range randomKeys() {
		before, after := ownerID(p, old, k), ownerID(q, ms, k)
		if before != after {
			moved++
			require.Equal(t, ms[16].ID, after, "keys may only move to the new member")
		}
	}
	assert.LessOrEqual(t, float64(moved), 1.3/17*testKeys)
	assert.Greater(t, moved, 0)
}

func TestPlacementAgreesAcrossProcesses(t *testing.T) {
	ms := membersN(64)
	shuffled := slices.Clone(ms)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	a, b := cache.NewPlacement(ms, 77), cache.NewPlacement(shuffled, 77)
	for i, k := range randomKeys() {
		wa, wb := a.Walk(k), b.Walk(k)
		// The whole spill order agrees, not only the owner; check the first
		// few for every key and the full walk for some.
		depth := 4
		if i%1000 == 0 {
			depth = 1 << 30
		}
		for range depth {
			ma, oka := wa.Next()
			mb, okb := wb.Next()
			require.Equal(t, oka, okb)
			if !oka {
				break
			}
			require.Equal(t, ms[ma].ID, shuffled[mb].ID, "key %x", k)
		}
	}
}

func TestPlacementSeedsDisagree(t *testing.T) {
	ms := membersN(16)
	a, b := cache.NewPlacement(ms, 1), cache.NewPlacement(ms, 2)
	same := 0
	for _, k := range randomKeys() {
		if ownerID(a, ms, k) == ownerID(b, ms, k) {
			same++
		}
	}
	// Independent placements agree on about 1/16 of keys.
	assert.Less(t, float64(same), 0.1*testKeys, "agreement %d of %d", same, testKeys)
}

func TestPlacementWeights(t *testing.T) {
	// With PointsPerWeight points per unit weight a member's share deviates
	// from its weight by about 1/sqrt(100*w): 7% for w = 2, 10% for w = 1,
	// 14% for w = 0.5, on top of 1% of sampling noise. The mean of 13
	// weight-1 members is within 3%, so a ratio within 25% of the weights'
	// ratio is three standard deviations for every member here.
	ms := membersN(16)
	ms[0].Weight, ms[1].Weight, ms[2].Weight = 2, 4, 0.5
	p := cache.NewPlacement(ms, 11)
	count := make([]float64, len(ms))
	for _, k := range randomKeys() {
		w := p.Walk(k)
		m, _ := w.Next()
		count[m]++
	}
	unit := 0.0
	for _, c := range count[3:] {
		unit += c
	}
	unit /= float64(len(ms) - 3)
	for i, want := range []float64{2, 4, 0.5} {
		got := count[i] / unit
		assert.InDelta(t, want, got, 0.25*want, "member %d of weight %v owns %.2fx a weight-1 member", i, want, got)
	}
}

// A member's points depend on its own weight and the ring's scale only,
// whatever the others weigh: when the heaviest member of a fleet weighted
// in hundreds leaves (it crashed, say), only its keys move. Scaling every
// weight by the heaviest one moved 77% of the others' keys here; the
// ring is scaled only past max(MaxRingPoints, PointsPerWeight*n) points,
// and this fleet stays below it.
func TestPlacementHeaviestLeavingMovesOnlyItsKeys(t *testing.T) {
	ms := membersN(16)
	for i := range ms {
		ms[i].Weight = 100
	}
	ms[0].Weight = 800
	p := cache.NewPlacement(ms, 9)
	rest := slices.Delete(slices.Clone(ms), 0, 1)
	q := cache.NewPlacement(rest, 9)
	for _, k := range randomKeys() {
		if before, after := ownerID(p, ms, k), ownerID(q, rest, k); before != after {
			require.Equal(t, ms[0].ID, before, "only the removed member's keys may move")
		}
	}
}

func TestWalkOffersEveryMemberAndEnds(t *testing.T) {
	for _, n := range []int{1, 2, 5, 16, 17, 40} {
		ms := membersN(n)
		ms[0].Weight = 3
		p := cache.NewPlacement(ms, 5)
		require.Equal(t, n, p.Len())
		for _, k := range randomKeys()[:200] {
			w := p.Walk(k)
			offered := map[int]int{}
			var order []int
			for {
				m, ok := w.Next()
				if !ok {
					break
				}
				// In int64: the bound passes a 32-bit int.
				require.Less(t, int64(len(order)), int64(n)*cache.PointsPerWeight*cache.MaxWeight, "walk did not end")
				offered[m]++
				order = append(order, m)
			}
			require.Len(t, offered, n, "every member is offered")
			distinct := min(n, cache.DistinctOffers)
			assert.Len(t, dedupe(order[:distinct]), distinct, "the first offers are distinct")
			if n <= cache.DistinctOffers {
				assert.Len(t, order, n, "few members: each offered exactly once")
			}
			_, ok := w.Next()
			assert.False(t, ok, "an ended walk stays ended")
		}
	}
}

func dedupe(xs []int) []int {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return slices.Compact(xs)
}

func TestPlacementSpillsSpread(t *testing.T) {
	// The keys of one member spill to the successors of its 100 points, so
	// a hot member's overflow spreads over much of the fleet instead of
	// landing on one neighbor.
	ms := membersN(64)
	p := cache.NewPlacement(ms, 13)
	second := map[int]int{}
	for _, k := range randomKeys() {
		w := p.Walk(k)
		if m, _ := w.Next(); m != 0 {
			continue
		}
		m, _ := w.Next()
		second[m]++
	}
	assert.Greater(t, len(second), 40, "member 0 spills to %d members", len(second))
}

func TestPlacementEdgeCases(t *testing.T) {
	empty := cache.NewPlacement(nil, 1)
	assert.Zero(t, empty.Len())
	w := empty.Walk(123)
	_, ok := w.Next()
	assert.False(t, ok)
	var zero cache.Walk
	_, ok = zero.Next()
	assert.False(t, ok, "the zero Walk is empty")

	dup := []cache.Member{{ID: "a"}, {ID: "b"}, {ID: "a", Weight: 50}}
	p := cache.NewPlacement(dup, 1)
	assert.Equal(t, 2, p.Len(), "a duplicate ID is placed once")
	for _, k := range randomKeys()[:1000] {
		w := p.Walk(k)
		for m, ok := w.Next(); ok; m, ok = w.Next() {
			require.NotEqual(t, 2, m, "the duplicate is never offered")
		}
	}

	// Odd weights are read as 1 and do not break the ring.
	odd := []cache.Member{{ID: "a", Weight: -1}, {ID: "b", Weight: 1e300}, {ID: "c", Weight: 1e-9}}
	p = cache.NewPlacement(odd, 1)
	w = p.Walk(1)
	_, ok = w.Next()
	assert.True(t, ok)
}

func TestWalkDoesNotAllocate(t *testing.T) {
	p := cache.NewPlacement(membersN(512), 1)
	k := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		k++
		w := p.Walk(k)
		_, _ = w.Next()
		_, _ = w.Next()
	})
	assert.Zero(t, allocs)
}

// A member's points are numbered from its own hash, so changing its weight
// adds or removes points of its own only: a reweighted member (slow start
// finished, an operator's correction) gains or loses keys, and no key moves
// between two other members.
func TestPlacementWeightChangeMovesOnlyThatMembersKeys(t *testing.T) {
	assertWeightChangeMovesOnlyItsKeys(t, membersN(32), 2.5, 0.3)
}

// assertWeightChangeMovesOnlyItsKeys changes member 5's weight in ms to
// each of ws (first above its weight, then below) and asserts that every
// key that moved went to it (weight up) or came from it (weight down).
func assertWeightChangeMovesOnlyItsKeys(t *testing.T, ms []cache.Member, ws ...float64) {
	t.Helper()
	p := cache.NewPlacement(ms, 3)
	old := ms[5].Weight
	if old <= 0 {
		old = 1 // a weight of 0 counts as 1
	}
	for _, w := range ws {
		changed := slices.Clone(ms)
		changed[5].Weight = w
		q := cache.NewPlacement(changed, 3)
		moved := 0
		for _, k := range randomKeys() {
			before, after := ownerID(p, ms, k), ownerID(q, changed, k)
			if before == after {
				continue
			}
			moved++
			if w > old {
				require.Equal(t, ms[5].ID, after, "weight %v: a key moved from %s to %s", w, before, after)
			} else {
				require.Equal(t, ms[5].ID, before, "weight %v: a key moved from %s to %s", w, before, after)
			}
		}
		assert.Positive(t, moved, "weight %v moved no key", w)
	}
}

// On a ring scaled down to MaxRingPoints, a small weight change moves
// only that member's keys: 4,096 members of weight 64 have 256 points
// each, and one of them going to 128 or 16 changes the others' counts by
// less than rounding does, and their bucket index not at all.
func TestPlacementScaledRingWeightChangeMovesOnlyThatMembersKeys(t *testing.T) {
	ms := membersN(4096)
	for i := range ms {
		ms[i].Weight = 64
	}
	assertWeightChangeMovesOnlyItsKeys(t, ms, 128, 16)
}
