package telemetry

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Sink receives samples. Store implements it; adapters that learn load on the
// request path (ORCA reports, vLLM's endpoint-load-metrics header) and Sources
// publish into one.
type Sink interface {
	Publish(endpointID string, s Sample)
}

// DefaultMaxEndpoints bounds a Store's table: samples for further unknown IDs
// are dropped and counted.
const DefaultMaxEndpoints = 65536

// Store keeps, per endpoint ID, the latest value of every field together with
// the time it was observed, so a fresh field from one source (say vLLM's queue
// depth) is not hidden by a stale one from another (say DCGM's memory).
//
// Readers never lock: Slot returns a durable per-endpoint handle whose
// LoadInto is one atomic pointer read. The Store's mutex is taken only to
// create a slot the first time an ID is seen. The table is bounded
// (MaxEndpoints); when it is full, a holder's new slot (Hold) takes the room
// of the slots nobody holds.
//
// The zero Store is ready to use and safe for concurrent use.
type Store struct {
	// MaxEndpoints bounds the number of IDs tracked; 0 means DefaultMaxEndpoints.
	// Set it before first use.
	MaxEndpoints int
	// Clock tells the Store the time now, to recognise samples from the
	// future (see Publish); nil means the wall clock. Set it before first use.
	Clock Clock

	mu    sync.Mutex // serializes slot creation so the bound holds
	slots sync.Map   // string -> *Slot; lock-free reads
	n     atomic.Int64
	held  int // slots with holders (Hold); guarded by mu

	adaptersAt     atomic.Int64 // newest observation time of a merged Adapters, unix ns
	asleepAt       atomic.Int64 // newest observation time of a merged Asleep of 1, unix ns
	accepted       atomic.Uint64
	droppedEmpty   atomic.Uint64 // no valid field
	partial        atomic.Uint64 // published with malformed fields left out (CountPartial)
	droppedOld     atomic.Uint64 // older than what is held
	droppedFull    atomic.Uint64 // table full
	droppedUnknown atomic.Uint64 // PublishKnown for an ID without a slot
	arrivedStale   atomic.Uint64 // merged, but older than the reader's max age (PublishKnownWithin, ReadWithin)
	readMaxAge     atomic.Int64  // largest max age declared by ReadWithin, ns; 0 none, -1 a reader that keeps every field
	lastUnknown    atomic.Pointer[string]

	// expired is the channel Expired handed out, closed and cleared by the
	// next Expire that drops a field; nil while nobody waits.
	expired atomic.Pointer[chan struct{}]
}

// ExpiryNotifier is a Sink that drops readings of its own (Store.Expire,
// on a reconnect or a failure exclusion: the server may be a new process).
// Expired returns a channel closed at the next such drop, as
// Store.Expired does. A Poller whose Sink is one (a Store, a
// balancer.Balancer) runs its next round early after a drop, so the
// readings come back after one scrape instead of up to an Interval later.
type ExpiryNotifier interface {
	Expired() <-chan struct{}
}

var (
	_ Sink           = (*Store)(nil)
	_ ExpiryNotifier = (*Store)(nil)
	_ AgingSink      = (*Store)(nil)
)

// Slot is one endpoint's entry in a Store. Its methods are safe for concurrent use.
type Slot struct {
	cur  atomic.Pointer[entry]
	mu   sync.Mutex // serializes merges; readers never take it
	refs int        // holders (Store.Hold); guarded by the Store's mu
}

// entry is immutable once published.
type entry struct {
	s     Sample // merged values; s.Time is the newest field time
	times [NumFields]int64
}

// StoreStats counts what a Store did with the samples it was given.
type StoreStats struct {
	// Accepted counts samples merged, but for those counted in ArrivedStale.
	Accepted     uint64
	DroppedEmpty uint64 // samples with no usable field (malformed input) or no usable time (zero, not after 1970, past 2262)
	DroppedOld   uint64 // samples older than every field they carried
	DroppedFull  uint64 // samples for a new ID once MaxEndpoints were tracked
	// DroppedUnknown counts PublishKnown samples for an ID with no slot:
	// an endpoint the Balancer does not have (yet, or any more). A
	// telemetry.Poller publishing into a Balancer reports them through its
	// OnError too (UnknownEndpointsError, naming the IDs), once per change.
	DroppedUnknown uint64
	// LastUnknown is the ID of the latest of those samples: when every
	// sample of a source is dropped so, compare it with the endpoints' IDs
	// (an endpoint's ID is its Endpoint.Key: its ID, else its Addr as
	// written, scheme included).
	LastUnknown string
	// ArrivedStale counts samples merged (not counted in Accepted) whose
	// Time was already older than the publishing reader's max age when
	// they arrived (PublishKnownWithin: a Balancer's TelemetryMaxAge), so
	// that reader ignores them from the start. Readings taken from a
	// Prometheus server that scrapes less often than the max age arrive so
	// (promapi stamps them with their scrape's time): when it climbs while
	// Accepted does not, the endpoints are scored without telemetry; raise
	// TelemetryMaxAge or scrape more often. Samples published with
	// Publish or PublishKnown (a Poller whose Sink is the Store) count
	// here when older than the largest max age its readers declared
	// (ReadWithin: a Balancer reading the Store declares its
	// TelemetryMaxAge), and in Accepted when none was declared.
	ArrivedStale uint64
	// Partial counts samples published with some of their fields left
	// out as malformed by the adapter that read them (CountPartial: an
	// HTTP load header or an ORCA report with a NaN, a negative count, a
	// field that does not parse). Their other fields were published, so
	// each is counted by what became of it too.
	Partial uint64
}

// CountPartial counts, in StoreStats.Partial, a sample whose adapter left
// some fields out as malformed and published the rest: a field dropped so
// is ignored and counted, as a sample without any usable field is
// (DroppedEmpty). A Source's partial rounds go to its Poller's OnError
// instead.
func (st *Store) CountPartial() { st.partial.Add(1) }

// Stats returns the counters.
func (st *Store) Stats() StoreStats {
	return StoreStats{
		Accepted:     st.accepted.Load(),
		DroppedEmpty: st.droppedEmpty.Load(),
		DroppedOld:   st.droppedOld.Load(),
		DroppedFull:  st.droppedFull.Load(),

		DroppedUnknown: st.droppedUnknown.Load(),
		LastUnknown:    st.lastUnknownID(),
		ArrivedStale:   st.arrivedStale.Load(),
		Partial:        st.partial.Load(),
	}
}

func (st *Store) lastUnknownID() string {
	if p := st.lastUnknown.Load(); p != nil {
		return *p
	}
	return ""
}

// Slot returns the durable slot for id, creating it if needed. It returns nil
// only when the table is full. Callers on a hot path resolve the slot once and
// keep it.
func (st *Store) Slot(id string) *Slot {
	if s, ok := st.slots.Load(id); ok {
		return s.(*Slot)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.slotLocked(id)
}

func (st *Store) slotLocked(id string) *Slot {
	if s, ok := st.slots.Load(id); ok {
		return s.(*Slot)
	}
	limit := st.MaxEndpoints
	if limit <= 0 {
		limit = DefaultMaxEndpoints
	}
	if st.n.Load() >= int64(limit) {
		return nil
	}
	s := &Slot{}
	st.slots.Store(id, s)
	st.n.Add(1)
	return s
}

// Hold is Slot for an owner of the endpoint, such as a Balancer that has it
// in its set: it counts one holder, and Release drops the slot when the
// last holder lets go. So a Store shared by several Balancers keeps an
// endpoint's telemetry while any of them has the endpoint, and forgets it
// when none does: endpoints that come and go (pods replaced on every
// rollout) cannot fill the table. A slot nobody holds (created by Slot or
// Publish) stays until Forget, or until the table is full and Hold needs
// its room: then every slot nobody holds is dropped (as Forget drops it).
// Publish makes such slots for every ID a Source reports (pods that have
// left, fleets no Balancer routes to), which would otherwise fill the
// table for good and leave every endpoint held after that without one.
func (st *Store) Hold(id string) *Slot {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.slotLocked(id)
	if s == nil && int64(st.held) < st.n.Load() {
		st.dropUnheldLocked()
		s = st.slotLocked(id)
	}
	if s != nil {
		if s.refs == 0 {
			st.held++
		}
		s.refs++
	}
	return s
}

// dropUnheldLocked drops every slot nobody holds. Called with mu held, only
// when the table is full: O(MaxEndpoints) once per filling.
func (st *Store) dropUnheldLocked() {
	st.slots.Range(func(k, v any) bool {
		if v.(*Slot).refs == 0 {
			st.slots.Delete(k)
			st.n.Add(-1)
		}
		return true
	})
}

// Release undoes one Hold of id's current slot; after the last one the
// slot is dropped, as Forget drops it. Holders of the slot keep a working
// but orphaned handle. A holder whose slot may have been forgotten since
// it took it (and held anew by someone else) releases with ReleaseSlot,
// which lets go of its own slot only.
func (st *Store) Release(id string) {
	st.ReleaseSlot(id, nil)
}

// ReleaseSlot is Release of the slot s that Hold(id) returned: it does
// nothing when id's slot is no longer s (Forget dropped s, or the table's
// room was needed, and another holder may hold a new slot for id, which a
// release by ID would drop from under it). nil s releases id's current
// slot, as Release does.
func (st *Store) ReleaseSlot(id string, s *Slot) {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.slots.Load(id)
	if !ok || s != nil && v.(*Slot) != s {
		return
	}
	s = v.(*Slot)
	if s.refs > 0 {
		s.refs--
		if s.refs == 0 {
			st.slots.Delete(id)
			st.n.Add(-1)
			st.held--
		}
	}
}

// Forget drops id's slot (for an endpoint that left the fleet for good).
// Holders of the slot keep a working but orphaned handle.
func (st *Store) Forget(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if v, ok := st.slots.LoadAndDelete(id); ok {
		st.n.Add(-1)
		if v.(*Slot).refs > 0 {
			st.held--
		}
	}
}

// Known reports whether id has a slot, so that PublishKnown keeps its
// samples. It never allocates or locks. A Balancer answers
// telemetry.KnownSink's Known with it.
func (st *Store) Known(id string) bool {
	_, ok := st.slots.Load(id)
	return ok
}

// Len returns the number of IDs tracked.
func (st *Store) Len() int { return int(st.n.Load()) }

// Publish merges s into id's entry: each present field replaces the held one
// unless the held one was observed later. A held field observed later than
// the Store's Clock reads now (before the wall clock was stepped back, or by
// a clock that runs ahead) is replaced by any reading that is not from the
// future too: kept, it would hide every fresh reading for the length of the
// step. A sample without a usable field or without a time is dropped and
// counted (DroppedEmpty); so is one whose time is not after the Unix epoch
// or lies past what int64 nanoseconds hold (the year 2262). A sample
// merged whose Time is already older than the largest max age the Store's
// readers declared (ReadWithin) is counted in ArrivedStale, not Accepted.
func (st *Store) Publish(id string, s Sample) {
	if !s.usable() {
		st.droppedEmpty.Add(1)
		return
	}
	slot := st.Slot(id)
	if slot == nil {
		st.droppedFull.Add(1)
		return
	}
	switch {
	case !slot.merge(s, st):
		st.droppedOld.Add(1)
	case s.Time.UnixNano() < st.readersStaleBefore():
		st.arrivedStale.Add(1)
	default:
		st.accepted.Add(1)
	}
}

// ReadWithin declares that a reader of the Store ignores fields observed
// more than maxAge before now (Slot.LoadInto); maxAge <= 0 declares one
// that keeps every field. A Balancer reading the Store declares its
// TelemetryMaxAge when it is made. Publish and PublishKnown then count a
// sample they merge whose Time is, by the Store's Clock, already older
// than the largest max age declared (so no reader uses it) in
// ArrivedStale instead of Accepted, as PublishKnownWithin counts one
// older than its caller's max age; after a reader that keeps every field
// is declared, nothing they merge arrives stale. A declaration lasts as
// long as the Store.
func (st *Store) ReadWithin(maxAge time.Duration) {
	d := int64(maxAge)
	if d <= 0 {
		d = -1
	}
	for old := st.readMaxAge.Load(); ; old = st.readMaxAge.Load() {
		n := max(old, d)
		if old < 0 || d < 0 {
			n = -1
		}
		if n == old || st.readMaxAge.CompareAndSwap(old, n) {
			return
		}
	}
}

// TelemetryMaxAge returns the largest max age the Store's readers
// declared (ReadWithin), or 0 when none did or one keeps every field: the
// age past which no reader uses a sample. It makes the Store an AgingSink,
// so a Poller publishing into it reports samples that arrive older than
// that.
func (st *Store) TelemetryMaxAge() time.Duration {
	return time.Duration(max(st.readMaxAge.Load(), 0))
}

// readersStaleBefore is the time (unix ns) before which a sample merged
// by Publish or PublishKnown is read by none of the readers ReadWithin
// declared, or math.MinInt64 when there is no such time.
func (st *Store) readersStaleBefore() int64 {
	d := st.readMaxAge.Load()
	if d <= 0 {
		return math.MinInt64
	}
	n := st.nowNs()
	if n < math.MinInt64+d {
		return math.MinInt64
	}
	return n - d // as LoadInto's lo
}

// Expire drops from id's entry the fields in fields that were observed
// before t (a field observed at t or later stays), and reports whether it
// dropped any. A transport calls it when it reconnects to an endpoint: the
// server may be a new process, and the load the old one reported (a full
// KV cache, a long queue) would otherwise price the new, empty one until
// the reading aged out; without a reading its factors are neutral until
// the new process reports. The balancer calls it too, as an endpoint's
// failures hold it out of rotation (a crashed server comes back as a new
// process). Dropping LoRASlots drops its Adapters too.
//
// A reading of a dropped field (by this call, or by an earlier one with
// no reading of the field since) observed before t that is published
// later (a scrape read from Prometheus arrives up to a scrape interval
// after it was taken) is refused as older than what is held, as it would be had
// the field not been dropped: it describes the old process too. And a
// slot whose KV-cache usage (or KVCachePreallocated) was dropped leaves GPU
// memory out (see LoadInto) until a new reading of it comes: the server
// pre-allocates its memory all the same.
//
// When it drops a field, Expire closes the channel Expired returned, so a
// Poller publishing into the Store scrapes again early (PollerOptions.MinInterval).
func (st *Store) Expire(id string, fields FieldSet, t time.Time) bool {
	v, ok := st.slots.Load(id)
	if !ok {
		return false
	}
	if !v.(*Slot).expire(fields, t.UnixNano()) {
		return false
	}
	if st.expired.Load() != nil {
		if c := st.expired.Swap(nil); c != nil {
			close(*c)
		}
	}
	return true
}

// Expired returns a channel that is closed the next time Expire drops a
// field of any endpoint; every caller until then gets the same channel,
// and a call after it gets a new one. A Poller publishing into the Store
// waits on it (ExpiryNotifier) to scrape again the readings Expire dropped:
// several expiries before it asks again come to one round.
func (st *Store) Expired() <-chan struct{} {
	for {
		if c := st.expired.Load(); c != nil {
			return *c
		}
		c := make(chan struct{})
		if st.expired.CompareAndSwap(nil, &c) {
			return c
		}
	}
}

func (sl *Slot) expire(fields FieldSet, before int64) bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	cur := sl.cur.Load()
	if cur == nil {
		return false
	}
	next := *cur
	newest := int64(0)
	raised := false
	for f := range NumFields {
		if !next.s.Has.Has(Field(f)) {
			if fields.Has(Field(f)) && next.times[f] != 0 && next.times[f] < before {
				// Dropped by an earlier expiry, with no reading since:
				// the floor rises, or a reading of the process in
				// between, arriving late, would come back.
				next.times[f] = before
				raised = true
			}
			continue
		}
		if fields.Has(Field(f)) && next.times[f] < before {
			next.s.Has &^= 1 << f
			next.s.Values[f] = 0
			// Not 0: the time stays as a floor for the field's next
			// reading (merge), and says that the field was held.
			next.times[f] = before
			if Field(f) == LoRASlots {
				next.s.Adapters = nil
			}
			continue
		}
		newest = max(newest, next.times[f])
	}
	if next.s.Has == cur.s.Has {
		if raised {
			sl.cur.Store(&next)
		}
		return false
	}
	next.s.Time = time.Time{}
	if newest != 0 {
		next.s.Time = time.Unix(0, newest)
	}
	sl.cur.Store(&next)
	return true
}

// AdaptersObserved returns the newest observation time (unix ns) of any
// Sample.Adapters the Store has merged, or 0 if none. A picker checks it,
// one atomic load, before it looks at its endpoints' adapter slots.
func (st *Store) AdaptersObserved() int64 { return st.adaptersAt.Load() }

// AsleepObserved returns the newest observation time (unix ns) of any
// Asleep reading of 1 the Store has merged, or 0 if none. A picker checks
// it, one atomic load, before it looks at its endpoints' sleep readings.
func (st *Store) AsleepObserved() int64 { return st.asleepAt.Load() }

// nowNs reads the Store's clock as Unix nanoseconds.
func (st *Store) nowNs() int64 {
	if st.Clock == nil {
		return time.Now().UnixNano()
	}
	return st.Clock.Now().UnixNano()
}

// PublishKnown is Publish for IDs that already have a slot: a sample for
// any other ID is dropped and counted (DroppedUnknown) instead of taking a
// new slot. Balancers publish through it, so a late report about an
// endpoint that has left (an ORCA stream still closing, a scrape in flight)
// cannot bring its slot back, and a fleet-wide query cannot fill the table
// with endpoints the Balancer does not route to.
//
// A sample merged whose Time is older than the largest max age the
// Store's readers declared (ReadWithin) is counted in ArrivedStale.
func (st *Store) PublishKnown(id string, s Sample) {
	st.publishKnown(id, s, st.readersStaleBefore())
}

// PublishKnownWithin is PublishKnown for a reader that ignores fields
// observed more than maxAge before now (Slot.LoadInto; maxAge <= 0 keeps
// every field): a sample it merges whose Time is already older than that
// is counted in ArrivedStale instead of Accepted. It is merged all the
// same: it may be the newest reading of a field, which then refuses older
// ones arriving later (a scrape of a process since expired) and keeps
// GPU memory out of the price for a server that reports a KV cache (see
// LoadInto), and no reader of that max age uses it. Balancer.Publish
// publishes through it with its clock and TelemetryMaxAge.
func (st *Store) PublishKnownWithin(id string, s Sample, now time.Time, maxAge time.Duration) {
	staleBefore := int64(math.MinInt64)
	if n := now.UnixNano(); maxAge > 0 && n >= math.MinInt64+int64(maxAge) {
		staleBefore = n - int64(maxAge) // as LoadInto's lo
	}
	st.publishKnown(id, s, staleBefore)
}

// publishKnown is PublishKnown counting a merged sample whose time is
// before staleBefore (unix ns) as ArrivedStale.
func (st *Store) publishKnown(id string, s Sample, staleBefore int64) {
	if !s.usable() {
		st.droppedEmpty.Add(1)
		return
	}
	v, ok := st.slots.Load(id)
	if !ok {
		st.droppedUnknown.Add(1)
		if p := st.lastUnknown.Load(); p == nil || *p != id {
			last := id // a copy: taking id's address would move it to the heap on every call
			st.lastUnknown.Store(&last)
		}
		return
	}
	switch {
	case !v.(*Slot).merge(s, st):
		st.droppedOld.Add(1)
	case s.Time.UnixNano() < staleBefore:
		st.arrivedStale.Add(1)
	default:
		st.accepted.Add(1)
	}
}

// usable reports whether s has a time and at least one value of a known
// field that Sample.Set would keep (finite; a Running or Waiting count at
// most MaxRequests). Set admits only those, but Values and Has are
// exported, so a Sink can be handed anything. The time must be after the
// Unix epoch and within int64 nanoseconds (before 2262): the Store keeps
// times as Unix nanoseconds, and UnixNano of a time outside them wraps to
// an arbitrary one, which may lie next to now (a reading stamped in the
// year 857, read from an exposition's timestamp, was fresh). 0 is also
// what Observed says for "never".
func (s *Sample) usable() bool {
	if !s.Time.After(unixEpoch) || s.Time.After(maxNanoTime) {
		return false
	}
	for f := range NumFields {
		if s.Has.Has(Field(f)) && admissible(Field(f), s.Values[f]) {
			return true
		}
	}
	return false
}

// The range of times a Store holds: after unixEpoch, up to maxNanoTime.
var (
	unixEpoch   = time.Unix(0, 0)
	maxNanoTime = time.Unix(0, math.MaxInt64)
)

// Latest returns id's merged sample with fields older than maxAge at now,
// or more than maxAge ahead of it (see Slot.LoadInto), removed (maxAge <= 0
// keeps all), and whether any field remains.
func (st *Store) Latest(id string, now time.Time, maxAge time.Duration) (Sample, bool) {
	v, ok := st.slots.Load(id)
	if !ok {
		return Sample{}, false
	}
	var s Sample
	v.(*Slot).LoadInto(&s, now, maxAge)
	return s, !s.Empty()
}

// merge merges s into the slot (see Store.Publish); st's clock is read only
// when a held field is newer than s.
func (sl *Slot) merge(s Sample, st *Store) bool {
	t := s.Time.UnixNano()
	sl.mu.Lock()
	defer sl.mu.Unlock()
	// Built on the stack and copied to the heap only when it changed: a
	// refused sample (older than every field it carries) allocates
	// nothing.
	var next entry
	if cur := sl.cur.Load(); cur != nil {
		next = *cur
	}
	changed := false
	now, read := int64(0), false
	for f := range NumFields {
		if !s.Has.Has(Field(f)) || !admissible(Field(f), s.Values[f]) {
			continue
		}
		// held is also the time before which an expired field was
		// dropped (see expire): an older reading is the old process's.
		if held := next.times[f]; held > t {
			if !read {
				now, read = st.nowNs(), true
			}
			if held <= now || t > now {
				continue // newer, and not from the future
			}
		}
		next.s.Values[f] = s.Values[f]
		next.s.Has |= 1 << f
		next.times[f] = t
		if Field(f) == LoRASlots {
			next.s.Adapters = boundAdapters(s.Adapters)
			if s.Adapters != nil {
				for old := st.adaptersAt.Load(); t > old && !st.adaptersAt.CompareAndSwap(old, t); old = st.adaptersAt.Load() {
				}
			}
		}
		if Field(f) == Asleep && s.Values[f] == 1 {
			for old := st.asleepAt.Load(); t > old && !st.asleepAt.CompareAndSwap(old, t); old = st.asleepAt.Load() {
			}
		}
		changed = true
	}
	if !changed {
		return false
	}
	if s.Time.After(next.s.Time) {
		next.s.Time = s.Time
	}
	e := new(entry)
	*e = next
	sl.cur.Store(e)
	return true
}

// boundAdapters returns a, or when a list of it holds more than
// MaxAdapterNames names, an empty name or one longer than
// MaxAdapterNameLen, a copy without those, as AdapterNames keeps them
// (adapterName): a custom Source may
// publish what a server said unchecked, and a picker reads the lists for
// every candidate (a thousand names cost 11 us a pick). a is not changed.
func boundAdapters(a *Adapters) *Adapters {
	if a == nil || boundedNames(a.Running) && boundedNames(a.Waiting) {
		return a
	}
	return &Adapters{Base: a.Base, Running: keepNames(a.Running), Waiting: keepNames(a.Waiting)}
}

func boundedNames(names []string) bool {
	if len(names) > MaxAdapterNames {
		return false
	}
	for _, n := range names {
		if !adapterName(n) {
			return false
		}
	}
	return true
}

func keepNames(names []string) []string {
	var out []string
	for _, n := range names {
		if adapterName(n) && len(out) < MaxAdapterNames {
			out = append(out, n)
		}
	}
	return out
}

// Observed returns when field f of the slot's current entry was observed
// (unix ns), or 0 when the slot holds no such field. It never allocates or
// locks. Consumers use it to tell a new reading of a field from the same one
// seen again.
func (sl *Slot) Observed(f Field) int64 {
	if sl == nil {
		return 0
	}
	cur := sl.cur.Load()
	if cur == nil || !cur.s.Has.Has(f) {
		return 0
	}
	return cur.times[f]
}

// Held returns the fields the slot has held: each with a reading now,
// fresh or stale, or one Expire dropped. A field never reported since the
// slot was made (one its server does not export) is not in it. It never
// allocates or locks.
func (sl *Slot) Held() FieldSet {
	if sl == nil {
		return 0
	}
	cur := sl.cur.Load()
	if cur == nil {
		return 0
	}
	var h FieldSet
	for f, t := range cur.times {
		if t != 0 {
			h |= 1 << f
		}
	}
	return h
}

// LoRA returns the slot's LoRA reading, its adapters and LoRASlots,
// when that field was observed within maxAge of now, as LoadInto would
// keep it (maxAge <= 0 keeps it whatever its age); ok false otherwise. It
// never allocates or locks: a picker reads it for each candidate.
func (sl *Slot) LoRA(now time.Time, maxAge time.Duration) (a *Adapters, slots float64, ok bool) {
	if sl == nil {
		return nil, 0, false
	}
	cur := sl.cur.Load()
	if cur == nil || cur.s.Adapters == nil || !cur.s.Has.Has(LoRASlots) || !(cur.s.Values[LoRASlots] >= 1) {
		return nil, 0, false // no reading, or no slot count (a Sample's Values set by hand)
	}
	if maxAge > 0 {
		if d := now.UnixNano() - cur.times[LoRASlots]; d > int64(maxAge) || d < -int64(maxAge) {
			return nil, 0, false
		}
	}
	return cur.s.Adapters, cur.s.Values[LoRASlots], true
}

// Asleep reports whether the slot's Asleep reading is 1 and was observed
// within maxAge of now, as LoadInto would keep it (maxAge <= 0 keeps it
// whatever its age). A stale reading, or none, says nothing: false. It
// never allocates or locks: a picker reads it for each candidate.
func (sl *Slot) Asleep(now time.Time, maxAge time.Duration) bool {
	if sl == nil {
		return false
	}
	cur := sl.cur.Load()
	if cur == nil || !cur.s.Has.Has(Asleep) || cur.s.Values[Asleep] != 1 {
		return false
	}
	if maxAge > 0 {
		if d := now.UnixNano() - cur.times[Asleep]; d > int64(maxAge) || d < -int64(maxAge) {
			return false
		}
	}
	return true
}

// LoadInto writes the slot's fields observed no more than maxAge before now
// into dst (maxAge <= 0 keeps every field). A field observed more than maxAge
// after now is left out too: it was stamped before the clock stepped back,
// so its age is unknown (and a Store keeps it only until a fresh reading
// comes). GPU memory is left out while a KV-cache usage the slot holds is
// stale, or was expired, and so is it while a KVCachePreallocated the slot
// holds is (see below). dst.Time becomes the oldest time among the fields
// kept. It never allocates or locks.
func (sl *Slot) LoadInto(dst *Sample, now time.Time, maxAge time.Duration) {
	dst.Has = 0
	dst.Time = time.Time{}
	dst.Adapters = nil
	if sl == nil {
		return
	}
	cur := sl.cur.Load()
	if cur == nil {
		return
	}
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if maxAge > 0 {
		n := now.UnixNano()
		if n >= math.MinInt64+int64(maxAge) {
			lo = n - int64(maxAge)
		}
		if n <= math.MaxInt64-int64(maxAge) {
			hi = n + int64(maxAge)
		}
	}
	// A server that reports its KV-cache usage pre-allocated its GPU
	// memory: that memory is how it was started, not its load, and a
	// fresh KV reading keeps it out of the price (Sample.MemoryPressure).
	// Once that reading is stale (an idle endpoint gets no load headers, a
	// /metrics scrape times out) the memory, fresh from DCGM, would price
	// the server as one that allocates as it goes: 5.8x for a replica
	// started at 0.95 of its GPU, so it took fewer calls and its KV
	// reading stayed stale. Stale telemetry must be neutral: the memory
	// goes with it.
	//
	// A KV-cache usage dropped by Store.Expire (its time is non-zero
	// without the field) counts as stale: the server that reported it
	// still pre-allocates, and a reconnect or a failure exclusion that
	// expired its KV reading must not leave it priced by its memory.
	//
	// KVCachePreallocated (a TGI server, Triton's vLLM backend: they
	// pre-allocate and report no KV usage) says the same and goes stale
	// the same way, when its /metrics scrape fails or times out.
	kvStale := cur.stale(KVCacheUsage, lo, hi) || cur.stale(KVCachePreallocated, lo, hi)
	oldest := int64(0)
	for f := range NumFields {
		if !cur.s.Has.Has(Field(f)) || cur.times[f] < lo || cur.times[f] > hi {
			continue
		}
		if kvStale && (Field(f) == GPUMemUsed || Field(f) == GPUMemTotal) {
			continue
		}
		dst.Values[f] = cur.s.Values[f]
		dst.Has |= 1 << f
		if Field(f) == LoRASlots {
			dst.Adapters = cur.s.Adapters
		}
		if oldest == 0 || cur.times[f] < oldest {
			oldest = cur.times[f]
		}
	}
	if oldest != 0 {
		dst.Time = time.Unix(0, oldest)
	}
}

// stale reports whether e has held f (a reading now, or one Expire
// dropped) and holds no reading of it observed within [lo, hi].
func (e *entry) stale(f Field, lo, hi int64) bool {
	at := e.times[f]
	return at != 0 && (!e.s.Has.Has(f) || at < lo || at > hi)
}
