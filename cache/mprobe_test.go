package cache

import (
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// mprobe is multi-probe consistent hashing (Appleton and O'Reilly 2015) over
// a ring with perWeight points per unit weight, kept for measurement.
type mprobe struct {
	salt   uint64
	k      int
	points []uint64
	index  []uint32
	shift  uint
}

func newMprobe(members []Member, seed uint64, perWeight, k int) *mprobe {
	p := &mprobe{salt: mix64(seed ^ 0x243f6a8885a308d3), k: k}
	for i, m := range members {
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.WriteString("member\x00")
		_, _ = d.WriteString(m.ID)
		h := d.Sum64()
		for j := range pointsFor(m.Weight, perWeight) {
			p.points = append(p.points, mix64(h+uint64(j)*0x9e3779b97f4a7c15)&posMask|uint64(i))
		}
	}
	slices.Sort(p.points)
	buckets := 1
	for buckets*4 < len(p.points) {
		buckets <<= 1
	}
	p.shift = uint(64 - bits.TrailingZeros(uint(buckets)))
	p.index = make([]uint32, buckets+1)
	b := 0
	for i, f := range p.points {
		for b < buckets && f>>p.shift >= uint64(b) {
			p.index[b] = uint32(i)
			b++
		}
	}
	for ; b <= buckets; b++ {
		p.index[b] = uint32(len(p.points))
	}
	return p
}

func (p *mprobe) owner(key uint64) int {
	k := mix64(key ^ p.salt)
	best, bestD := 0, ^uint64(0)
	for j := range p.k {
		q := mix64(k+uint64(j)*0x9e3779b97f4a7c15) & posMask
		i, end := p.index[q>>p.shift], p.index[q>>p.shift+1]
		for i < end && p.points[i]&posMask < q {
			i++
		}
		if int(i) == len(p.points) {
			i = 0
		}
		if d := (p.points[i] & posMask) - q; d < bestD {
			best, bestD = int(uint16(p.points[i])), d
		}
	}
	return best
}
