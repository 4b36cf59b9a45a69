package cache

import (
	"math"
	"slices"
	"testing"
)

// TestWalkMatchesBruteForce checks the bucket index against the textbook
// ring lookup: the first point at or after the key, by binary search over
// the decoded positions.
func TestWalkMatchesBruteForce(t *testing.T) {
	for _, n := range []int{1, 2, 8, 100, 1000} {
		ms := members(n)
		p := NewPlacement(ms, 7)
		pos := positions(p)
		for k := range uint64(20000) {
			key := mix64(k)
			w := p.Walk(key)
			got, ok := w.Next()
			if !ok {
				t.Fatalf("n=%d: no owner", n)
			}
			kp := mix64(key ^ p.salt)
			res := 64 - p.shift + subBits
			j, _ := slices.BinarySearch(pos, kp>>(64-res))
			want := int(uint16(p.points[j%len(pos)]))
			if got != want {
				t.Fatalf("n=%d key %x: owner %d, brute force %d", n, key, got, want)
			}
		}
	}
}

// positions decodes the ring positions at the resolution the index keeps.
func positions(p *Placement) []uint64 {
	pos := make([]uint64, len(p.points))
	for b := 0; b+1 < len(p.index); b++ {
		for i := p.index[b]; i < p.index[b+1]; i++ {
			pos[i] = uint64(b)<<subBits | uint64(p.points[i]>>memberBits)
		}
	}
	return pos
}

// TestOwnersFollowArcShares checks the key mixing: keys as poorly spread as
// 0, 1, 2, ... must still land on each member in proportion to the ring arcs
// it owns. Pearson's chi-square of the owner counts against the exact arc
// shares has n-1 degrees of freedom; z is its distance from that mean in
// standard deviations (|z| was under 1 for these seeds).
func TestOwnersFollowArcShares(t *testing.T) {
	const keys = 400_000
	for _, n := range []int{8, 64, 500} {
		ms := members(n)
		for i := range ms {
			ms[i].Weight = float64(1 + i%4)
		}
		p := NewPlacement(ms, 11)
		share := arcShares(p)
		count := make([]float64, n)
		for k := range uint64(keys) {
			w := p.Walk(k)
			m, _ := w.Next()
			count[m]++
		}
		chi := 0.0
		for i := range n {
			want := share[i] * keys
			chi += (count[i] - want) * (count[i] - want) / want
		}
		z := (chi - float64(n-1)) / math.Sqrt(2*float64(n-1))
		if math.Abs(z) > 4 {
			t.Errorf("n=%d: chi-square %.1f with %d degrees of freedom (z = %.1f): owners do not follow the arcs", n, chi, n-1, z)
		}
	}
}

// arcShares returns each member's exact share of the key space: the arcs
// that end at its points, at the resolution the index keeps.
func arcShares(p *Placement) []float64 {
	pos := positions(p)
	res := 64 - p.shift + subBits
	share := make([]float64, p.n)
	for j := range pos {
		prev := pos[len(pos)-1] - 1<<res // the last point, one turn back
		if j > 0 {
			prev = pos[j-1]
		}
		share[uint16(p.points[j])] += float64(pos[j]-prev) / float64(uint64(1)<<res)
	}
	return share
}
