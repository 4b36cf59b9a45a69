package balancer

import (
	"sync/atomic"
	"time"
)

// Clock tells the balancer the time. Tests and the fleet simulator inject a
// fake one; the zero Options use the wall clock.
type Clock interface {
	Now() time.Time
}

// reanchorEvery bounds how far the default clock may drift from the wall
// clock (NTP slews and steps) before it reads the wall clock again.
const reanchorEvery = time.Second

// monoClock is the default Clock: a wall-clock reading advanced by the
// monotonic clock, which is about half the price of time.Now (one clock read
// instead of two) on the Pick and Done paths. Every reanchorEvery it reads the
// wall clock again, so telemetry stamped by other processes with time.Now
// stays comparable.
//
// Concurrency: base is immutable. The anchor is double-buffered: a writer
// (whoever wins the CAS on writing) fills the inactive slot, then publishes
// it through cur, so readers never wait and never see a torn pair unless two
// re-anchors (a second apart) overtake one read.
type monoClock struct {
	base    time.Time // carries the monotonic reading all offsets are from
	cur     atomic.Uint32
	writing atomic.Bool
	slots   [2]struct{ wall, mono atomic.Int64 }
}

func newMonoClock() *monoClock {
	c := &monoClock{base: time.Now()}
	c.slots[0].wall.Store(c.base.UnixNano())
	return c
}

func (c *monoClock) unixNano() int64 {
	m := int64(time.Since(c.base))
	s := &c.slots[c.cur.Load()]
	wall, at := s.wall.Load(), s.mono.Load()
	if m-at < int64(reanchorEvery) || !c.writing.CompareAndSwap(false, true) {
		return wall + (m - at)
	}
	now := time.Now()
	next := 1 - c.cur.Load()
	c.slots[next].wall.Store(now.UnixNano())
	c.slots[next].mono.Store(int64(now.Sub(c.base)))
	c.cur.Store(next)
	c.writing.Store(false)
	return now.UnixNano()
}

func (c *monoClock) Now() time.Time { return time.Unix(0, c.unixNano()) }

// nowNs reads the configured clock as Unix nanoseconds, through the cheap
// path when it is the default clock.
func (c *config) nowNs() int64 {
	if c.mono != nil {
		return c.mono.unixNano()
	}
	return c.clock.Now().UnixNano()
}
