package cache_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

// offeredBy walks key's whole preference order and returns the members in
// the order offered.
func offeredBy(p *cache.Placement, key uint64) []int {
	w := p.Walk(key)
	var order []int
	for m, ok := w.Next(); ok; m, ok = w.Next() {
		order = append(order, m)
	}
	return order
}

// A member of very small weight still gets a point, on a ring at
// PointsPerWeight (its weight x 100 rounds to 0) and on a ring scaled down
// to MaxRingPoints (its share of the cap rounds to 0): without one it is
// never offered, and a key could never reach it even as a spill.
func TestSmallestWeightStillGetsAPoint(t *testing.T) {
	for name, ms := range map[string][]cache.Member{
		"unscaled": {{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "tiny", Weight: 0.001}},
		"scaled":   {{ID: "a", Weight: cache.MaxWeight}, {ID: "b", Weight: 1}, {ID: "tiny", Weight: 0.3}},
	} {
		t.Run(name, func(t *testing.T) {
			p := cache.NewPlacement(ms, 7)
			for _, k := range randomKeys()[:20] {
				assert.Contains(t, offeredBy(p, k), 2, "the tiny member is offered")
			}
		})
	}
}

// Past DistinctOffers a member may be offered again, but never twice in a
// row from its adjacent ring points: a caller skipping an unacceptable
// member would meet it again at once, spending its walk on one member.
func TestWalkNeverOffersAMemberTwiceInARow(t *testing.T) {
	ms := membersN(40)
	p := cache.NewPlacement(ms, 5)
	for _, k := range randomKeys()[:200] {
		order := offeredBy(p, k)
		require.Greater(t, len(order), cache.DistinctOffers)
		for i := 1; i < len(order); i++ {
			require.NotEqual(t, order[i-1], order[i], "key %d: offer %d repeats the one before", k, i)
		}
	}
}
