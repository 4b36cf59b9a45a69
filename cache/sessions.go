package cache

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// Session table defaults. Both limits bind at the defaults: 65,536 entries of
// SessionEntryBytes bytes each is 2 MiB.
const (
	DefaultMaxSessions     = 1 << 16
	DefaultMaxSessionBytes = 2 << 20
	// DefaultSessionTTL is how long an idle session stays sticky: about as
	// long as engines and hosted APIs keep an unused prefix cached, after
	// which stickiness no longer buys a cache hit.
	DefaultSessionTTL = 5 * time.Minute

	// SessionEntryBytes is the memory of one entry. It is fixed, because the
	// table stores 64-bit keys, never the session IDs themselves.
	SessionEntryBytes = 32

	// MaxSessions bounds the table NewSessions allocates (up front:
	// 16,777,216 entries are 512 MiB), so a mistyped limit fails as a
	// setting, not as an allocation that takes the process down.
	MaxSessions = 1 << 24

	// sessionWays is the associativity: a key may live in any of the ways of
	// one set, and eviction picks the least recently used of them.
	sessionWays = 8
)

// ErrSessionOptions reports invalid SessionOptions; NewSessions wraps it with
// the field and the rule.
var ErrSessionOptions = errors.New("inferlb: invalid session options")

// Clock tells the time. Tests and the simulator inject a fake one; it has
// the method set of balancer.Clock, so the balancer can pass its own.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

var _ Clock = wallClock{}

// SessionOptions configure a Sessions table. The zero value gives the
// defaults.
type SessionOptions struct {
	// MaxEntries bounds the number of sessions; 0 leaves the bound to
	// MaxBytes, or to the default (see MaxBytes). The entries it allows
	// must not pass MaxSessions, and a negative value is refused.
	MaxEntries int
	// MaxBytes bounds the table's memory, in bytes (negative is refused;
	// what it allows must not pass MaxSessions entries). The table holds
	// min(MaxEntries, MaxBytes/SessionEntryBytes) entries, rounded down to
	// a power of two (at least 8), allocated up front. A limit left at 0
	// does not bind when the other is set; with both 0 the table holds
	// DefaultMaxSessions entries (DefaultMaxSessionBytes).
	MaxBytes int
	// TTL is how long a session stays after its last Put or its last Get
	// that refreshed it (a Get refreshes an entry only when that moves its
	// expiry by more than TTL/8, so an idle session can go up to TTL/8
	// early); 0 means DefaultSessionTTL, and a negative TTL is refused.
	TTL time.Duration
	// Clock is the time source; nil means the wall clock.
	Clock Clock
}

// Sessions is a bounded, expiring map from session keys (Keyer.Session) to
// a 64-bit value, typically the member a session was placed on, so that a
// session stays where its cache is even when load or membership would place
// it elsewhere.
//
// The table is set-associative, like a CPU cache: a key hashes to one set of
// 8 slots and evicts the least recently used (or an expired) slot of that set
// when the set is full. Session IDs are request data: an attacker who does
// not know the Keyer seed cannot aim keys at one set, and however many IDs
// arrive the table never grows.
//
// Sessions is safe for concurrent use and never blocks: each slot is a
// seqlock of atomics. Get only reads (and refreshes the expiry with one
// compare-and-swap), so it suits a picker that must not lock. A Get racing a
// Put on the same slot reports a miss; two Puts of one new key racing may
// store it in two slots, of which Get returns either until one is evicted.
type Sessions struct {
	clock Clock         // immutable
	ttl   int64         // immutable, nanoseconds
	mask  uint64        // immutable: number of sets - 1
	slots []sessionSlot // immutable slice; slots are atomic
}

// sessionSlot is one entry. ver is a sequence lock: a writer makes it odd,
// writes the fields, and makes it even again; a reader that sees ver odd or
// changed across its reads ignores what it read. exp is the Unix time in
// nanoseconds when the entry expires; key 0 marks a free slot.
type sessionSlot struct {
	ver atomic.Uint64
	key atomic.Uint64
	val atomic.Uint64
	exp atomic.Int64
}

// maxTTL bounds a session's TTL (about 146 years), so now + TTL cannot
// overflow and store every entry already expired.
const maxTTL = time.Duration(1 << 62)

// NewSessions returns an empty table, or an error wrapping ErrSessionOptions
// when a limit is negative, the limits allow more than MaxSessions entries,
// or the TTL is negative. A TTL above about 146 years is read as that.
func NewSessions(opts SessionOptions) (*Sessions, error) {
	switch {
	case opts.MaxEntries < 0:
		return nil, fmt.Errorf("%w: MaxEntries %d must be >= 0", ErrSessionOptions, opts.MaxEntries)
	case opts.MaxBytes < 0:
		return nil, fmt.Errorf("%w: MaxBytes %d must be >= 0", ErrSessionOptions, opts.MaxBytes)
	case opts.TTL < 0:
		return nil, fmt.Errorf("%w: TTL %v must be >= 0", ErrSessionOptions, opts.TTL)
	}
	// A limit given alone is the bound: the other's default would cut it
	// without a word (a sticky table asked for a million entries held
	// 65,536).
	entries := min(DefaultMaxSessions, DefaultMaxSessionBytes/SessionEntryBytes)
	switch {
	case opts.MaxEntries > 0 && opts.MaxBytes > 0:
		entries = min(opts.MaxEntries, opts.MaxBytes/SessionEntryBytes)
	case opts.MaxEntries > 0:
		entries = opts.MaxEntries
	case opts.MaxBytes > 0:
		entries = opts.MaxBytes / SessionEntryBytes
	}
	if entries > MaxSessions {
		field, v := "MaxEntries", opts.MaxEntries
		if opts.MaxEntries == 0 || opts.MaxBytes > 0 && opts.MaxBytes/SessionEntryBytes < opts.MaxEntries {
			field, v = "MaxBytes", opts.MaxBytes
		}
		return nil, fmt.Errorf("%w: %s %d allows %d entries, more than MaxSessions (%d)", ErrSessionOptions, field, v, entries, MaxSessions)
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultSessionTTL
	}
	if opts.Clock == nil {
		opts.Clock = wallClock{}
	}
	sets := max(entries/sessionWays, 1)
	sets = 1 << (bits.Len(uint(sets)) - 1) // round down to a power of two
	return &Sessions{
		clock: opts.Clock,
		ttl:   int64(min(opts.TTL, maxTTL)),
		mask:  uint64(sets - 1),
		slots: make([]sessionSlot, sets*sessionWays),
	}, nil
}

// Cap returns the number of entries the table holds at most.
func (s *Sessions) Cap() int { return len(s.slots) }

func (s *Sessions) set(key uint64) []sessionSlot {
	// Mixing makes any caller key spread over the sets; Keyer keys already
	// do, but a test's small integers would otherwise share one set.
	i := (mix64(key) & s.mask) * sessionWays
	return s.slots[i : i+sessionWays : i+sessionWays]
}

// Get returns the value stored for key and whether it was found and not
// expired. A hit restarts the session's TTL, to a resolution of TTL/8: an
// entry refreshed less than TTL/8 ago is not written again. Key 0 is never
// stored.
func (s *Sessions) Get(key uint64) (val uint64, ok bool) {
	if key == 0 {
		return 0, false
	}
	now := s.clock.Now().UnixNano()
	set := s.set(key)
	for i := range set {
		e := &set[i]
		v := e.ver.Load()
		if v&1 != 0 || e.key.Load() != key {
			continue
		}
		val, exp := e.val.Load(), e.exp.Load()
		if e.ver.Load() != v || !s.live(exp, now) {
			continue
		}
		// Refresh only when it moves the expiry noticeably, so that a hot
		// session read from many cores does not bounce its cache line on
		// every Get. A lost race leaves the expiry a writer just set.
		if next := now + s.ttl; next-exp > s.ttl>>3 {
			e.exp.CompareAndSwap(exp, next)
		}
		return val, true
	}
	return 0, false
}

// Put stores val for key with a fresh TTL, replacing the key's old value or,
// when its set is full, the least recently used entry of the set. Put is
// best effort: if other writers hold the chosen slots it gives up after a
// few tries, which costs at most one future miss. Key 0 is ignored.
func (s *Sessions) Put(key, val uint64) {
	if key == 0 {
		return
	}
	now := s.clock.Now().UnixNano()
	set := s.set(key)
	for range 4 {
		e := s.victim(set, key, now)
		v := e.ver.Load()
		if v&1 != 0 || !e.ver.CompareAndSwap(v, v+1) {
			continue
		}
		e.key.Store(key)
		e.val.Store(val)
		e.exp.Store(now + s.ttl)
		e.ver.Store(v + 2)
		return
	}
}

// live reports whether an entry that expires at exp is live at now. An
// expiry more than two TTLs ahead was set before the clock stepped back by
// more than a TTL: the entry's age is unknown, and kept it would outlive
// its TTL by the length of the step (and, expiring last, be evicted last).
// A shorter step, or a race between two clock readings, keeps it.
func (s *Sessions) live(exp, now int64) bool {
	return exp > now && exp-now-s.ttl <= s.ttl
}

// victim picks the slot for key: its own, else a free or expired one, else
// the one that expires first, which with sliding TTLs is the least recently
// used.
func (s *Sessions) victim(set []sessionSlot, key uint64, now int64) *sessionSlot {
	var free, lru *sessionSlot
	lruExp := int64(0)
	for i := range set {
		e := &set[i]
		k, exp := e.key.Load(), e.exp.Load()
		switch {
		case k == key:
			return e
		case k == 0 || !s.live(exp, now):
			if free == nil {
				free = e
			}
		case lru == nil || exp < lruExp:
			lru, lruExp = e, exp
		}
	}
	if free != nil {
		return free
	}
	return lru
}

// Delete forgets key, if present.
func (s *Sessions) Delete(key uint64) {
	if key == 0 {
		return
	}
	set := s.set(key)
	for i := range set {
		e := &set[i]
		v := e.ver.Load()
		if v&1 != 0 || e.key.Load() != key || !e.ver.CompareAndSwap(v, v+1) {
			continue
		}
		if e.key.Load() == key {
			e.key.Store(0)
			e.exp.Store(0)
		}
		e.ver.Store(v + 2)
	}
}

// CompareAndDelete forgets key if its value is still old, and reports
// whether it did: a caller that read a value and judged it stale does not
// delete the fresh one another Put stored since.
func (s *Sessions) CompareAndDelete(key, old uint64) bool {
	if key == 0 {
		return false
	}
	set := s.set(key)
	for i := range set {
		e := &set[i]
		v := e.ver.Load()
		if v&1 != 0 || e.key.Load() != key || e.val.Load() != old || !e.ver.CompareAndSwap(v, v+1) {
			continue
		}
		// Under the slot's version: nothing else writes it now.
		deleted := e.key.Load() == key && e.val.Load() == old
		if deleted {
			e.key.Store(0)
			e.exp.Store(0)
		}
		e.ver.Store(v + 2)
		return deleted
	}
	return false
}

// Len returns the number of live (stored and unexpired) sessions. It scans
// the whole table, so it is for tests and metrics, not for the request path.
func (s *Sessions) Len() int {
	now := s.clock.Now().UnixNano()
	n := 0
	for i := range s.slots {
		if s.slots[i].key.Load() != 0 && s.live(s.slots[i].exp.Load(), now) {
			n++
		}
	}
	return n
}
