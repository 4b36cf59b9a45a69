package cache

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// maglev is the lookup table of Eisenbud et al. 2016 with weights taken as
// turns per round, kept for measurement.
type maglev struct {
	salt  uint64
	n     int
	table []uint16
}

func newMaglev(members []Member, seed uint64, m int) *maglev {
	g := &maglev{salt: mix64(seed ^ 0x243f6a8885a308d3), n: len(members), table: make([]uint16, m)}
	type mem struct {
		idx          int
		h            uint64
		off, skip, j uint64
		w, credit    float64
	}
	ms := make([]mem, len(members))
	wmax := 0.0
	for i, x := range members {
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.WriteString("member\x00")
		_, _ = d.WriteString(x.ID)
		h := d.Sum64()
		w := float64(pointsFor(x.Weight, PointsPerWeight)) / PointsPerWeight
		wmax = max(wmax, w)
		ms[i] = mem{idx: i, h: h, off: mix64(h) % uint64(m), skip: mix64(h+1)%uint64(m-1) + 1, w: w}
	}
	slices.SortFunc(ms, func(a, b mem) int { return cmp.Compare(a.h, b.h) })
	filled := make([]bool, m)
	left := m
	for left > 0 {
		for k := range ms {
			x := &ms[k]
			x.credit += x.w / wmax
			for x.credit >= 1 && left > 0 {
				x.credit--
				for {
					s := (x.off + x.j*x.skip) % uint64(m)
					x.j++
					if !filled[s] {
						filled[s] = true
						g.table[s] = uint16(x.idx)
						left--
						break
					}
				}
			}
		}
	}
	return g
}

func (g *maglev) owner(key uint64) int {
	k := mix64(key ^ g.salt)
	hi, _ := mulhi(k, uint64(len(g.table)))
	return int(g.table[hi])
}

func mulhi(a, b uint64) (uint64, uint64) {
	// bits.Mul64 without the import cycle in benchmarks' eyes.
	const mask32 = 1<<32 - 1
	a0, a1 := a&mask32, a>>32
	b0, b1 := b&mask32, b>>32
	w0 := a0 * b0
	t := a1*b0 + w0>>32
	w1 := t&mask32 + a0*b1
	return a1*b1 + t>>32 + w1>>32, a * b
}
