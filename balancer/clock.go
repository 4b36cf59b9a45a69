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

// MonotonicClock is a Clock that also reads a clock that never steps. With
// one, the balancer measures the time a call was out, pick to Done (its
// latency, or the wait of a call given up on), as the shorter of the two
// clocks' measures: a forward step of Now's (an NTP step, an operator
// setting the time) counts as no time, and a step back shortens it as it
// did. Measured by Now alone, every call out at a step an hour forward had
// waited an hour: two generation calls given up on just after it priced
// their healthy replica as hung (scoring.State.Abandoned), and an
// embedding's raised its endpoint's latency to the hour
// (TestForwardClockStepIsNoWait). The default clock is one. An adapter
// that times a whole call, or its wait for the response headers, reads
// Pick.Elapsed, which measures the same way (the HTTP transport with
// OnResult set, and its embedding and rerank calls, read Now and counted
// a step: TestForwardClockStepIsNoWaitWithOnResult and
// TestForwardClockStepIsNoEmbeddingLatency in httpbalancer). So do the
// times within a call: the HTTP transport stamps a stream's events as
// the pick's time plus Elapsed, and StreamTiming (grpcbalancer) a
// stream's messages with Stamp, so a step is no time to the first token
// nor between tokens (read from Now, a step of an hour before a stream's
// first token made the endpoint's TTFT an hour, and one between its
// tokens its time per output token a quarter of an hour:
// TestForwardClockStepIsNoStreamTiming in httpbalancer,
// TestForwardClockStepIsNoStreamTimingOverGRPC in grpcbalancer). (Stamp
// is the monotonic reading alone: there a step back counts as no time
// either.) What decays with time (the latency and error EWMAs, the
// prefill estimate) goes by Now: a step forward ages it by its length.
// So does the time an endpoint's calls have gone unanswered
// (scoring.State.Pending, which the Latency scorer prices): after an hour
// forward, the embedding or rerank endpoints with calls out read an hour
// pending until each answers (milliseconds for such calls); measuring it
// on the monotonic clock too cost every Pick and Done two more atomic
// stores, 5-12 ns.
type MonotonicClock interface {
	Clock
	// Monotonic returns the time since a fixed instant of the clock's
	// choosing; it never goes back, and moves only as time passes.
	Monotonic() time.Duration
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
	wall, _ := c.read()
	return wall
}

// read returns the clock's reading, unix ns, and the monotonic time since
// base it was made at (ns).
func (c *monoClock) read() (wall, mono int64) {
	m := int64(time.Since(c.base))
	s := &c.slots[c.cur.Load()]
	wall, at := s.wall.Load(), s.mono.Load()
	if m-at < int64(reanchorEvery) || !c.writing.CompareAndSwap(false, true) {
		return wall + (m - at), m
	}
	now := time.Now()
	m = int64(now.Sub(c.base))
	next := 1 - c.cur.Load()
	c.slots[next].wall.Store(now.UnixNano())
	c.slots[next].mono.Store(m)
	c.cur.Store(next)
	c.writing.Store(false)
	return now.UnixNano(), m
}

// Monotonic is the monotonic time since the clock was made
// (MonotonicClock).
func (c *monoClock) Monotonic() time.Duration { return time.Since(c.base) }

func (c *monoClock) Now() time.Time { return time.Unix(0, c.unixNano()) }

// nowNs reads the configured clock as Unix nanoseconds, through the cheap
// path when it is the default clock.
func (c *config) nowNs() int64 {
	if c.mono != nil {
		return c.mono.unixNano()
	}
	return c.clock.Now().UnixNano()
}

// readNs is nowNs with the monotonic reading (ns) of a MonotonicClock (0
// without one), for a call's wait (see waited).
func (c *config) readNs() (nowNs, monoNs int64) {
	switch {
	case c.mono != nil:
		return c.mono.read()
	case c.monoSrc != nil:
		return c.clock.Now().UnixNano(), int64(c.monoSrc.Monotonic())
	}
	return c.clock.Now().UnixNano(), 0
}

// waited is how long a call picked at startNs (monoNs: the monotonic
// reading then, see readNs) had been out at nowNs (monoNow): the shorter
// of the two clocks' measures with a MonotonicClock (see there).
func (c *config) waited(startNs, monoNs, nowNs, monoNow int64) time.Duration {
	d := nowNs - startNs
	if c.mono != nil || c.monoSrc != nil {
		d = min(d, monoNow-monoNs)
	}
	return time.Duration(d)
}

// Stamp reads the Balancer's clock for timing events within a call
// against each other and against their pick's Pick.Stamped (a stream's
// first and last tokens): with a MonotonicClock (the default clock is
// one) its monotonic reading, which no step of the wall clock moves;
// else Now's, unix ns. Only differences of stamps mean anything. One
// clock read, as Now is.
func (b *Balancer) Stamp() int64 {
	c := b.cfg
	switch {
	case c.mono != nil:
		return int64(c.mono.Monotonic())
	case c.monoSrc != nil:
		return int64(c.monoSrc.Monotonic())
	}
	return c.clock.Now().UnixNano()
}

// Stamped is the pick's reading of its Balancer's clock as Stamp reads
// it. 0 for an empty Pick.
func (p *Pick) Stamped() int64 {
	if p.e == nil {
		return 0
	}
	if c := p.e.b.cfg; c.mono != nil || c.monoSrc != nil {
		return p.mono
	}
	return p.start
}
