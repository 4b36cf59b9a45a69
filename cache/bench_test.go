package cache

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var sink int

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255)}
	}
	return ms
}

// BenchmarkPlacementWalk measures the latency of a lookup, Walk plus the
// first Next (the owner), as a picker sees it: each key depends on the
// previous owner, so lookups cannot overlap, and keys are pseudo-random, so
// the large rings are read at random places as real keys would read them.
// Both schemes measured for Placement run: the ring and weighted rendezvous.
func BenchmarkPlacementWalk(b *testing.B) {
	for _, n := range []int{8, 64, 512, 4096} {
		ms := members(n)
		b.Run(fmt.Sprintf("ring/n=%d", n), func(b *testing.B) {
			p := NewPlacement(ms, 42)
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				w := p.Walk(k)
				m, _ := w.Next()
				k += uint64(m) + 0x9e3779b97f4a7c15
			}
		})
		b.Run(fmt.Sprintf("rendezvous/n=%d", n), func(b *testing.B) {
			r := newRendezvous(ms, 42)
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				w := r.Walk(k)
				m, _ := w.Next()
				k += uint64(m) + 0x9e3779b97f4a7c15
			}
		})
	}
}

// BenchmarkPlacementWalkIndependent is the ring lookup with independent
// keys: throughput, where the processor overlaps consecutive lookups, which
// helps the small rings (all in L1) more than the large ones (cache misses).
func BenchmarkPlacementWalkIndependent(b *testing.B) {
	for _, n := range []int{8, 64, 512, 4096} {
		p := NewPlacement(members(n), 42)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				k += 0x9e3779b97f4a7c15
				w := p.Walk(k)
				m, _ := w.Next()
				sink += m
			}
		})
	}
}

// BenchmarkPlacementSpill is a lookup that spills three times: the owner
// and its next three members.
func BenchmarkPlacementSpill(b *testing.B) {
	for _, n := range []int{8, 64, 512, 4096} {
		p := NewPlacement(members(n), 42)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var k uint64
			for b.Loop() {
				k += 0x9e3779b97f4a7c15
				w := p.Walk(k)
				for range 4 {
					m, _ := w.Next()
					sink += m
				}
			}
		})
	}
}

// BenchmarkNewPlacement is the cost of a membership change.
func BenchmarkNewPlacement(b *testing.B) {
	for _, n := range []int{8, 64, 512, 4096} {
		ms := members(n)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink += NewPlacement(ms, 42).Len()
			}
		})
	}
}

// BenchmarkNewPlacementWeighted is a membership change in a fleet weighted
// in large units (tokens per second, say, or a weight far above the others
// from a misconfiguration): the ring's size, and so the time and memory a
// change costs, is bounded by MaxRingPoints whatever the weights.
func BenchmarkNewPlacementWeighted(b *testing.B) {
	for _, n := range []int{512, 4096} {
		for _, w := range []float64{64, 1e6} {
			ms := members(n)
			for i := range ms {
				ms[i].Weight = w
			}
			b.Run(fmt.Sprintf("n=%d/w=%g", n, w), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					sink += NewPlacement(ms, 42).Len()
				}
			})
		}
	}
}

func BenchmarkKeys(b *testing.B) {
	k := NewKeyer(1)
	for _, size := range []int{4 << 10, 32 << 10} {
		prompt := strings.Repeat("All work and no play makes Jack a dull boy. ", size/44+1)[:size]
		dst := make([]uint64, 0, size/BlockChars+1)
		// No SetBytes: the key reads only the first Depth bytes.
		b.Run(fmt.Sprintf("Prompt/%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink += int(k.Prompt("m", prompt) & 1)
			}
		})
		b.Run(fmt.Sprintf("PromptBlocks/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				dst = k.PromptBlocks("m", prompt, dst[:0])
			}
		})
	}
	// A 10-turn conversation behind a 4 KiB system prompt: the key reads
	// the system prompt and first user turn only, Blocks reads it all.
	msgs := []Message{{Role: "system", Content: strings.Repeat("You are a helpful agent. ", 160)}}
	for i := range 10 {
		msgs = append(msgs,
			Message{Role: "user", Content: strings.Repeat(fmt.Sprintf("question %d ", i), 40)},
			Message{Role: "assistant", Content: strings.Repeat(fmt.Sprintf("answer %d ", i), 150)})
	}
	size := 0
	for _, m := range msgs {
		size += len(m.Content)
	}
	dst := make([]uint64, 0, size/BlockChars+len(msgs))
	b.Run(fmt.Sprintf("Chat/10turns-%dKiB", size>>10), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink += int(k.Chat("m", msgs) & 1)
		}
	})
	b.Run(fmt.Sprintf("Blocks/10turns-%dKiB", size>>10), func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			dst = k.Blocks("m", msgs, dst[:0])
		}
	})
	small := []Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "What is the capital of France?"}}
	b.Run("Chat/small", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink += int(k.Chat("llama-3-8b", small) & 1)
		}
	})
	b.Run("Session", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink += int(k.Session("0f8e3c2a-5b7d-4e1f-9a6b-2c3d4e5f6a7b") & 1)
		}
	})
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func BenchmarkSessions(b *testing.B) {
	s, _ := NewSessions(SessionOptions{Clock: fixedClock{time.Unix(1e9, 0)}})
	for k := range uint64(s.Cap() / 2) {
		s.Put(mix64(k+1), k)
	}
	b.Run("Get", func(b *testing.B) {
		b.ReportAllocs()
		var k uint64
		for b.Loop() {
			v, _ := s.Get(mix64(k%uint64(s.Cap()/2) + 1))
			sink += int(v & 1)
			k++
		}
	})
	b.Run("Put", func(b *testing.B) {
		b.ReportAllocs()
		var k uint64
		for b.Loop() {
			k++
			s.Put(mix64(k), k)
		}
	})
	b.Run("GetParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var k uint64
			for pb.Next() {
				_, _ = s.Get(mix64(k%1024 + 1))
				k++
			}
		})
	})
}
