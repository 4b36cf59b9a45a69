package cache

import (
	"cmp"
	"math"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

const (
	// PointsPerWeight is how many points a member of weight 1 puts on the
	// ring while the ring is within MaxRingPoints (always, in a fleet whose
	// weights are all 1 or less). The ownership share of a member deviates
	// from its weight by about 1/sqrt(points) (one standard deviation); see
	// the package doc for the measured balance and memory.
	PointsPerWeight = 100

	// MaxRingPoints bounds the ring's size, whatever the weights: a ring
	// of n members holds at most max(MaxRingPoints, PointsPerWeight*n) + n
	// points (4 bytes each, and 8 while it is built). A ring that would be
	// larger at PointsPerWeight points per unit of weight gives every
	// member the same fraction of its points instead, the one that fits
	// (rounded, at least one), so the mean member has MaxRingPoints/n or
	// PointsPerWeight points, whichever is more. n counts distinct IDs. See
	// Placement for what a change of that fraction moves.
	MaxRingPoints = 1 << 20

	// MaxWeight caps a member's weight, which keeps the total weight
	// finite; the ring's size is bounded by MaxRingPoints, not by this.
	// Weights keep their ratios on the ring within [1/s, MaxWeight], where
	// s is the ring's points per unit of weight (PointsPerWeight unless
	// the ring was scaled down): a member of less weight still gets one
	// point.
	MaxWeight = 1e6

	// MaxMembers is the largest placement: member indices are packed into 16
	// bits of each ring point. Members beyond it are never offered by Walk.
	MaxMembers = 1 << memberBits

	// DistinctOffers is how many members a Walk remembers to avoid offering
	// one twice; see Walk.Next.
	DistinctOffers = 16
)

const (
	memberBits = 16
	memberMask = 1<<memberBits - 1
	posMask    = ^uint64(memberMask) // the high 48 bits of a point: its ring position
	subBits    = 16                  // position bits kept per point below the bucket bits

	// pointsPerBucket is the mean number of ring points per bucket of the
	// index: a lookup reads one index entry and scans about this many
	// contiguous 4-byte points (64 bytes) by binary search. Measured against
	// 8 and 32 at n = 4096: fewer makes the index, read first at a random
	// place, too large to stay cached; more lengthens the search.
	pointsPerBucket = 16
)

// Member is one placement target. ID must be the same string in every
// process that should agree (inferlb.Endpoint.Key). Weight is the relative
// capacity; 0 (or any non-positive or non-finite value) means 1.
type Member struct {
	ID     string
	Weight float64
}

// Placement maps affinity keys to members by consistent hashing on a ring
// (Karger et al. 1997) with PointsPerWeight virtual points per unit weight,
// and an O(1) bucket index over the sorted points.
//
// Where a point lands depends only on (seed, member ID, weight, the ring's
// scale), never on the order of the members, so two processes with the
// same seed and members place every key identically, and a membership or
// weight change moves only the keys of the arcs that changed hands: about
// 1/n of them for one member of n joining or leaving, and only keys to (or
// from) a member whose weight rose (or fell). Two exceptions:
//
//   - Positions compare at a precision set by the bucket count (below),
//     which follows the total number of points (on a scaled ring, below,
//     its cap), so a change that takes it across a power of two also moves
//     the few keys closer to a point than that precision: removing one of
//     41 to 5,243 members moved 6 to 8 keys in 100,000 between members
//     that stayed.
//   - The ring's scale: a ring whose points at PointsPerWeight per unit of
//     weight would exceed limit = max(MaxRingPoints, PointsPerWeight*n)
//     gives each member that count times limit/(its total), rounded.
//     Every member keeps the first of its own points, so a change that
//     moves the total also moves the keys of the points each member drops
//     (or adds): about the total's relative change of the keys, between
//     members that stayed, on top of the changed member's own. One of 20
//     members of weight 1,000 joining moved 4.0% of the keys between the
//     other 20 (TestAutoscalerStepOnAScaledRingMovesFewKeys), about as
//     many as went to it; in a large fleet a small change moves none,
//     rounding keeping every count (4,096 members of weight 64 hold 256
//     points each, and one going to 128 or 16 moves only its own keys).
//     This is the price of a bounded ring: points that followed absolute
//     weights grew without bound (4,096 members of weight 64 put 26
//     million points on the ring, which took 4.2 s and 323 MB to build).
//     Scaling by the least power of two that fits, tried first, moved no
//     key between unchanged members until the total crossed a threshold,
//     and then half of them: 44% of the keys at that 20 -> 21 step, at
//     every step of an autoscaler moving between the two. A ring within
//     the cap (every ring whose weights are all 1 or less) is not scaled,
//     and moves only the changed member's keys.
//
// A Placement is immutable and safe for concurrent use; build a new one when
// the members change.
type Placement struct {
	n      int      // members placed (at most MaxMembers)
	salt   uint64   // mixed into keys so the seed moves every key's position
	points []uint32 // in ring order; high 16 bits position within bucket, low 16 member index
	index  []uint32 // bucket b: first point in bucket b or later; len = buckets+1
	shift  uint     // 64 - log2(buckets)
}

// NewPlacement places members on a ring keyed by seed. Members are
// identified by ID: of duplicate IDs only the first is placed, and members
// after the first MaxMembers are not placed at all. An empty member list
// gives a Placement whose walks offer nothing.
func NewPlacement(members []Member, seed uint64) *Placement {
	return newPlacement(members, seed, PointsPerWeight)
}

func newPlacement(members []Member, seed uint64, perWeight int) *Placement {
	n := min(len(members), MaxMembers)
	p := &Placement{salt: mix64(seed ^ 0x243f6a8885a308d3)}

	ids := make(map[string]struct{}, n)
	hashes := make([]uint64, n) // per-member hash of (seed, ID)
	counts := make([]int, n)    // ring points per member; 0 for duplicates
	var units int64             // the ring's points at perWeight per unit (int64: up to 6.6e12)
	for i, m := range members[:n] {
		if _, dup := ids[m.ID]; dup {
			continue
		}
		ids[m.ID] = struct{}{}
		p.n++
		counts[i] = pointsFor(m.Weight, perWeight)
		units += int64(counts[i])
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.WriteString("member\x00")
		_, _ = d.WriteString(m.ID)
		hashes[i] = d.Sum64()
	}
	// A ring over its cap gives every member the same fraction of its
	// points. The integer sum does not depend on member order (a float one
	// may, in its last bit), so every process picks the same counts.
	limit := max(MaxRingPoints, perWeight*p.n)
	total := 0
	for i, c := range counts {
		if c > 0 {
			counts[i] = scaledPoints(c, limit, units)
			total += counts[i]
		}
	}

	full := make([]uint64, 0, total) // 48-bit positions | member index
	for i := range members[:n] {
		// A member's points come from its hash of (seed, ID) alone: the same
		// in every process, whatever the member's index.
		for j := range counts[i] {
			pos := mix64(hashes[i]+uint64(j)*0x9e3779b97f4a7c15) & posMask
			full = append(full, pos|uint64(i))
		}
	}
	slices.Sort(full)
	// Equal positions (about P^2/2^49 of them: none in practice) sort by
	// member index, which depends on member order; re-sort such runs by ID
	// hash so the ring stays independent of order.
	for lo := 0; lo < len(full); {
		hi := lo + 1
		for hi < len(full) && full[hi]&posMask == full[lo]&posMask {
			hi++
		}
		if hi-lo > 1 {
			slices.SortFunc(full[lo:hi], func(a, b uint64) int {
				return cmp.Compare(hashes[a&memberMask], hashes[b&memberMask])
			})
		}
		lo = hi
	}

	// The bucket index splits the ring into a power-of-two number of equal
	// buckets; the bucket number gives a point's high position bits, so each
	// point keeps only the next subBits of position beside its member index,
	// which halves the memory a lookup touches. Positions compare at
	// log2(buckets)+subBits bits: keys closer than that to a point resolve
	// the same way in every process with the same members. A scaled ring
	// sizes its index by the cap, not by its points, which rounding puts a
	// few above or below it: a ring at the cap would otherwise double or
	// halve its buckets, and so the precision, as a weight changed
	// anywhere in the fleet. Below it too: a cap of PointsPerWeight*n need
	// not be a power of two times pointsPerBucket, and a ring rounded a
	// few points under it fell below one (TestScaledRingBelowItsCapKeepsItsBuckets).
	size := len(full)
	if units > int64(limit) {
		size = limit
	}
	buckets := 1
	for buckets*pointsPerBucket < size {
		buckets <<= 1
	}
	// With one bucket the shift is 64, and Go defines x >> 64 == 0.
	p.shift = uint(64 - bits.TrailingZeros(uint(buckets)))
	p.index = make([]uint32, buckets+1)
	p.points = make([]uint32, len(full))
	b := 0
	for i, f := range full {
		for b < buckets && f>>p.shift >= uint64(b) {
			p.index[b] = uint32(i)
			b++
		}
		p.points[i] = uint32(f>>(p.shift-subBits))<<memberBits | uint32(f&memberMask)
	}
	for ; b <= buckets; b++ {
		p.index[b] = uint32(len(full))
	}
	return p
}

// pointsFor is a member's points before the ring is scaled to its cap.
func pointsFor(w float64, perWeight int) int {
	if !(w > 0) || math.IsInf(w, 0) {
		w = 1
	}
	w = min(w, MaxWeight)
	return max(1, int(math.Round(w*float64(perWeight))))
}

// scaledPoints is a member's points on a ring of units points at
// PointsPerWeight a unit of weight, fitted to limit: c while the ring is
// within it, else c x limit/units rounded (half up), and at least one.
// A member's points are numbered from 0, so a ring scaled down keeps a
// prefix of each member's points: what a change of scale moves is only the
// keys of the points it drops or adds, the relative change of the scale of
// every member's points. The products fit an int64: c is at most
// MaxWeight x PointsPerWeight (1e8), limit at most
// PointsPerWeight x MaxMembers (6.6 million).
func scaledPoints(c, limit int, units int64) int {
	if units <= int64(limit) {
		return c
	}
	return max(1, int((int64(c)*int64(limit)+units/2)/units))
}

// Len returns the number of members placed.
func (p *Placement) Len() int { return p.n }

// Walk returns the key's preference order over the members: its owner
// first, then the members that take its spills. It does not allocate.
func (p *Placement) Walk(key uint64) Walk {
	w := Walk{p: p}
	if len(p.points) == 0 {
		return w
	}
	k := mix64(key ^ p.salt)
	b := k >> p.shift
	sub := uint32(k>>(p.shift-subBits)) & memberMask
	// Lower bound of sub in the bucket by binary search. The trip count
	// depends only on the bucket's size, and each step is arithmetic (both
	// sides are 16-bit, so the difference's sign says which is less): no
	// branch waits on the likely uncached points only to be mispredicted.
	i, n := p.index[b], p.index[b+1]-p.index[b]
	for n > 1 {
		half := n / 2
		i += half & lessMask(p.points[i+half-1]>>memberBits, sub)
		n -= half
	}
	if n == 1 {
		i += 1 & lessMask(p.points[i]>>memberBits, sub)
	}
	// Past the bucket's last point the successor is the next bucket's first
	// point, which is the next in the array; past the last one, the first.
	if int(i) == len(p.points) {
		i = 0
	}
	w.i = int32(i)
	w.left = int32(len(p.points))
	return w
}

// Walk is one key's preference order over a Placement's members, consumed
// with Next. It is a small value; copying it forks the walk.
type Walk struct {
	p     *Placement
	i     int32 // next ring point to visit
	left  int32 // ring points not yet visited
	nseen int32
	seen  [DistinctOffers]uint16 // members offered so far (the first DistinctOffers)
	last  uint16                 // the member offered last
}

// Next returns the next member index (into the members slice given to
// NewPlacement) in the key's preference order, and false when the walk is
// over. The first member is the key's owner; the following ones are its
// spill order, the clockwise successors on the ring, as in the bounded-load
// algorithm of Mirrokni, Thorup and Zadimoghaddam.
//
// The first DistinctOffers members are distinct (so with at most that many
// members every member is offered exactly once); after that a member may be
// offered again, though never twice in a row. The walk ends after one turn of the ring, by which time every
// member has been offered at least once. Next does not allocate.
func (w *Walk) Next() (member int, ok bool) {
	if w.left <= 0 {
		return 0, false
	}
	pts := w.p.points
	if w.nseen == 0 {
		// The owner: nothing to skip yet.
		m := uint16(pts[w.i])
		w.step(len(pts))
		w.seen[0], w.nseen, w.last = m, 1, m
		return int(m), true
	}
	// With few members the walk remembers them all and can stop as soon as
	// each has been offered, instead of finishing the turn.
	for w.left > 0 && (w.p.n > DistinctOffers || int(w.nseen) < w.p.n) {
		m := uint16(pts[w.i])
		w.step(len(pts))
		// Past DistinctOffers a member may come again, but not twice in a
		// row from its own adjacent points.
		if m == w.last || slices.Contains(w.seen[:w.nseen], m) {
			continue
		}
		if w.nseen < DistinctOffers {
			w.seen[w.nseen] = m
			w.nseen++
		}
		w.last = m
		return int(m), true
	}
	w.left = 0
	return 0, false
}

// step moves the walk one point clockwise.
func (w *Walk) step(npoints int) {
	w.i++
	if int(w.i) == npoints {
		w.i = 0
	}
	w.left--
}

// lessMask returns all ones when a < b and zero otherwise, for a, b < 2^16.
func lessMask(a, b uint32) uint32 {
	return uint32(int32(a-b) >> 31)
}

// mix64 is the SplitMix64 finalizer (Steele, Lea and Flood 2014): a cheap
// bijection whose output bits each depend on every input bit, so sequential
// point numbers and poorly mixed caller keys still land uniformly.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
