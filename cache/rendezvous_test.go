package cache

import (
	"math"

	"github.com/cespare/xxhash/v2"
)

// rendezvous is weighted rendezvous (highest random weight) hashing (Thaler
// and Ravishankar 1998; the weighted score -ln(u)/w of Schindelhauer and
// Schomaker 2005), the scheme Placement was measured against. It lives in a
// test file: it is exact in weight and minimal in disruption, but a lookup
// costs O(n), which BenchmarkPlacementWalk shows at n = 4096.
type rendezvous struct {
	salt    uint64
	hashes  []uint64  // per member: hash of (seed, ID)
	invW    []float64 // per member: 1/weight
	uniform bool      // all weights equal: compare hashes, skip the logarithm
}

func newRendezvous(members []Member, seed uint64) *rendezvous {
	r := &rendezvous{salt: mix64(seed ^ 0x243f6a8885a308d3), uniform: true}
	for i, m := range members {
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.WriteString("member\x00")
		_, _ = d.WriteString(m.ID)
		r.hashes = append(r.hashes, d.Sum64())
		w := min(float64(pointsFor(m.Weight, PointsPerWeight))/PointsPerWeight, MaxWeight)
		r.invW = append(r.invW, 1/w)
		if i > 0 && r.invW[i] != r.invW[0] {
			r.uniform = false
		}
	}
	return r
}

// score orders members for a key: lower is preferred. With equal weights the
// inverted hash gives the same order as -ln(u)/w without a logarithm.
func (r *rendezvous) score(k uint64, i int) float64 {
	h := mix64(k ^ r.hashes[i])
	if r.uniform {
		return float64(^h >> 11)
	}
	u := (float64(h>>11) + 0.5) / (1 << 53)
	return -math.Log(u) * r.invW[i]
}

func (r *rendezvous) Walk(key uint64) rwalk {
	return rwalk{r: r, k: mix64(key ^ r.salt), last: -1}
}

// rwalk offers members in increasing (score, hash) order: each Next is a
// fresh O(n) scan for the smallest pair above the last one offered, so the
// walk needs no memory and never repeats a member.
type rwalk struct {
	r         *rendezvous
	k         uint64
	last      int
	lastScore float64
}

func (w *rwalk) Next() (int, bool) {
	best, bestScore := -1, math.Inf(1)
	for i := range w.r.hashes {
		s := w.r.score(w.k, i)
		if w.last >= 0 && (s < w.lastScore || s == w.lastScore && w.r.hashes[i] <= w.r.hashes[w.last]) {
			continue
		}
		if best < 0 || s < bestScore || s == bestScore && w.r.hashes[i] < w.r.hashes[best] {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return 0, false
	}
	w.last, w.lastScore = best, bestScore
	return best, true
}
