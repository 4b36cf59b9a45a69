package balancer

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestMonoClockTracksTheWallClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newMonoClock()
		for _, step := range []time.Duration{0, time.Millisecond, 700 * time.Millisecond, 2 * time.Second, time.Hour} {
			time.Sleep(step)
			if got, want := c.unixNano(), time.Now().UnixNano(); got != want {
				t.Fatalf("after %v: clock %d, wall %d", step, got, want)
			}
			if !c.Now().Equal(time.Now()) {
				t.Fatalf("Now disagrees with the wall clock")
			}
		}
		if c.cur.Load() == 0 && c.slots[0].mono.Load() == 0 {
			t.Fatal("never re-anchored after an hour")
		}
	})
}

func TestMonoClockDoesNotAllocate(t *testing.T) {
	c := newMonoClock()
	if a := testing.AllocsPerRun(1000, func() { c.unixNano() }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}

// BenchmarkClock prices one reading of the default clock, which Pick and
// Done make once each (the latency of a call is measured from its pick),
// next to time.Now, which reads the wall and the monotonic clock.
func BenchmarkClock(b *testing.B) {
	c := newMonoClock()
	var sink int64
	b.Run("monoClock", func(b *testing.B) {
		for b.Loop() {
			sink += c.unixNano()
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			sink += time.Now().UnixNano()
		}
	})
	if sink == 42 {
		b.Log(sink) // keeps the reads
	}
}
