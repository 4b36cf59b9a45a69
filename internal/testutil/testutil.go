// Package testutil holds test helpers: a fake clock, deterministic random
// sources, and loopback ports held for a test (PortHold). It is for tests
// only.
package testutil

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"time"
)

// Epoch is where fake clocks start: a fixed, realistic instant.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a manually advanced clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at Epoch.
func NewClock() *Clock { return &Clock{now: Epoch} }

// Now returns the current fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// MonoClock is a Clock that also reads a monotonic clock
// (balancer.MonotonicClock): Advance moves both readings, as time passing
// does; Step moves the wall reading alone, as an NTP step or an operator
// moves a host's wall clock.
type MonoClock struct {
	Clock
	mono time.Duration // guarded by Clock.mu
}

// NewMonoClock returns a MonoClock at Epoch, its monotonic reading 0.
func NewMonoClock() *MonoClock { return &MonoClock{Clock: Clock{now: Epoch}} }

// Monotonic returns the time Advance has moved the clock by in all.
func (c *MonoClock) Monotonic() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Advance moves both readings forward by d.
func (c *MonoClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.mono += d
}

// Step moves the wall reading by d (back when negative), the monotonic
// one not at all.
func (c *MonoClock) Step(d time.Duration) { c.Clock.Advance(d) }

// Rand is a seeded PCG source behind a mutex, so one deterministic source can
// serve concurrent callers.
type Rand struct {
	mu  sync.Mutex
	src *rand.PCG
}

// NewRand returns a deterministic source for seed.
func NewRand(seed uint64) *Rand { return &Rand{src: rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)} }

// Uint64 implements rand.Source.
func (r *Rand) Uint64() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.src.Uint64()
}

// Script replays fixed values in order, then repeats the last one. It lets a
// test dictate exactly which endpoints P2C samples.
type Script struct {
	mu   sync.Mutex
	vals []uint64
	i    int
}

// NewScript returns a source that yields vals in order.
func NewScript(vals ...uint64) *Script { return &Script{vals: vals} }

// Uint64 implements rand.Source.
func (s *Script) Uint64() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.vals) == 0 {
		return 0
	}
	v := s.vals[min(s.i, len(s.vals)-1)]
	s.i++
	return v
}

// Index returns the random value that makes a uniform n-way draw (the
// balancer's multiply-shift of the high 32 bits) land on i.
func Index(i, n int) uint64 {
	// Middle of i's bucket in [0, 2^32).
	hi := (uint64(i)<<32 + 1<<31) / uint64(n)
	return hi<<32 | 0xffffffff
}

// Allocated returns the bytes f allocates, process-wide: call it with no
// other goroutine at work (tests that are not parallel, goleak-checked
// packages).
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
