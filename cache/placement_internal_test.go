package cache

import (
	"testing"
)

// ringOwner is the textbook ring lookup, a binary search over the full
// positions, against which the bucket index is checked.
func TestWalkMatchesBruteForce(t *testing.T) {
	for _, n := range []int{1, 2, 8, 100, 1000} {
		ms := members(n)
		p := NewPlacement(ms, 7)
		for k := range uint64(20000) {
			key := mix64(k)
			w := p.Walk(key)
			got, ok := w.Next()
			if !ok {
				t.Fatalf("n=%d: no owner", n)
			}
			kp := mix64(key ^ p.salt)
			want := bruteOwner(p, kp)
			if got != want {
				t.Fatalf("n=%d key %x: owner %d, brute force %d", n, key, got, want)
			}
		}
	}
}

func bruteOwner(p *Placement, k uint64) int {
	res := uint(64 - p.shift + subBits)
	kq := k >> (64 - res)
	for b := 0; b+1 < len(p.index); b++ {
		for i := p.index[b]; i < p.index[b+1]; i++ {
			pq := uint64(b)<<subBits | uint64(p.points[i]>>memberBits)
			if pq >= kq {
				return int(uint16(p.points[i]))
			}
		}
	}
	return int(uint16(p.points[0]))
}
