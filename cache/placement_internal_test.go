package cache

import (
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
