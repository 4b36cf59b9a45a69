package cache

import (
	"fmt"
	"testing"
)

var sink int

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255)}
	}
	return ms
}

// BenchmarkPlacementWalk measures a lookup (Walk plus the first Next, the
// owner) for uniformly random keys, the worst case for caches, for both
// schemes measured for Placement.
func BenchmarkPlacementWalk(b *testing.B) {
	for _, n := range []int{8, 64, 512, 4096} {
		ms := members(n)
		b.Run(fmt.Sprintf("ring/n=%d", n), func(b *testing.B) {
			p := NewPlacement(ms, 42)
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				k += 0x9e3779b97f4a7c15
				w := p.Walk(mix64(k))
				m, _ := w.Next()
				sink += m
			}
		})
		b.Run(fmt.Sprintf("rendezvous/n=%d", n), func(b *testing.B) {
			r := newRendezvous(ms, 42)
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				k += 0x9e3779b97f4a7c15
				w := r.Walk(mix64(k))
				m, _ := w.Next()
				sink += m
			}
		})
	}
}
