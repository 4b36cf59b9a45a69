package telemetry_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func sample(at time.Time, kv ...float64) telemetry.Sample {
	s := telemetry.Sample{Time: at}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Set(telemetry.Field(kv[i]), kv[i+1])
	}
	return s
}

func TestSampleRejectsNonFinite(t *testing.T) {
	var s telemetry.Sample
	assert.False(t, s.Set(telemetry.KVCacheUsage, math.NaN()))
	assert.False(t, s.Set(telemetry.Waiting, math.Inf(1)))
	assert.True(t, s.Empty())
	assert.True(t, s.Set(telemetry.Waiting, 3))
	v, ok := s.Get(telemetry.Waiting)
	assert.True(t, ok)
	assert.Equal(t, 3.0, v)
	_, ok = s.Get(telemetry.Running)
	assert.False(t, ok)
}

// A Running or Waiting count above MaxRequests is a broken reading, which
// taken as it came priced its endpoint out of rotation.
func TestSampleRejectsImplausibleCounts(t *testing.T) {
	var s telemetry.Sample
	assert.False(t, s.Set(telemetry.Running, 1e15))
	assert.False(t, s.Set(telemetry.Waiting, telemetry.MaxRequests+1))
	assert.True(t, s.Empty())
	assert.True(t, s.Set(telemetry.Waiting, telemetry.MaxRequests))
	assert.True(t, s.Set(telemetry.GPUMemUsed, 1e15), "other fields have their own units")
}

func TestMemoryUsage(t *testing.T) {
	s := sample(t0, float64(telemetry.GPUMemUsed), 40, float64(telemetry.GPUMemTotal), 80)
	u, ok := s.MemoryUsage()
	assert.True(t, ok)
	assert.Equal(t, 0.5, u)
	s = sample(t0, float64(telemetry.GPUMemUsed), 40, float64(telemetry.GPUMemTotal), 0)
	_, ok = s.MemoryUsage()
	assert.False(t, ok, "no total, no usage")
}

func TestMemoryPressureOnlyWithoutKVCache(t *testing.T) {
	s := sample(t0, float64(telemetry.GPUMemUsed), 76, float64(telemetry.GPUMemTotal), 80)
	u, ok := s.MemoryPressure()
	assert.True(t, ok)
	assert.Equal(t, 0.95, u)
	s.Set(telemetry.KVCacheUsage, 0.2)
	_, ok = s.MemoryPressure()
	assert.False(t, ok, "a server reporting its KV cache pre-allocated its memory")
	u, ok = s.MemoryUsage()
	assert.True(t, ok)
	assert.Equal(t, 0.95, u, "the usage itself is still there")
}

func TestFieldNames(t *testing.T) {
	for f := range telemetry.NumFields {
		back, ok := telemetry.ParseField(telemetry.Field(f).String())
		assert.True(t, ok)
		assert.Equal(t, telemetry.Field(f), back)
	}
	_, ok := telemetry.ParseField("nope")
	assert.False(t, ok)
}

func TestStoreMergesFieldsByAge(t *testing.T) {
	var st telemetry.Store
	// DCGM reports memory; the model server reports the queue later.
	st.Publish("a", sample(t0, float64(telemetry.GPUMemUsed), 70, float64(telemetry.GPUMemTotal), 80))
	st.Publish("a", sample(t0.Add(20*time.Second), float64(telemetry.Waiting), 4))
	// An older report of the queue must not overwrite the newer one.
	st.Publish("a", sample(t0.Add(10*time.Second), float64(telemetry.Waiting), 99))

	got, ok := st.Latest("a", t0.Add(25*time.Second), 0)
	require.True(t, ok)
	w, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 4.0, w)
	_, ok = got.Get(telemetry.GPUMemUsed)
	assert.True(t, ok)

	// With a 10s max age at t=25s only the queue (t=20s) is fresh: the stale
	// memory field is dropped, not the whole sample.
	got, ok = st.Latest("a", t0.Add(25*time.Second), 10*time.Second)
	require.True(t, ok)
	_, ok = got.Get(telemetry.GPUMemUsed)
	assert.False(t, ok)
	_, ok = got.Get(telemetry.Waiting)
	assert.True(t, ok)
	assert.True(t, got.Time.Equal(t0.Add(20*time.Second)))

	_, ok = st.Latest("a", t0.Add(time.Hour), time.Minute)
	assert.False(t, ok, "everything stale")
	_, ok = st.Latest("b", t0, 0)
	assert.False(t, ok)

	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedOld: 1}, st.Stats())
}

func TestSlotObservedIsPerField(t *testing.T) {
	var st telemetry.Store
	sl := st.Slot("a")
	assert.Zero(t, sl.Observed(telemetry.Running), "nothing published yet")
	st.Publish("a", sample(t0, float64(telemetry.Running), 3, float64(telemetry.KVCacheUsage), 0.5))
	st.Publish("a", sample(t0.Add(time.Second), float64(telemetry.GPUMemUsed), 70))
	assert.Equal(t, t0.UnixNano(), sl.Observed(telemetry.Running), "a later sample of other fields leaves Running's time")
	assert.Equal(t, t0.Add(time.Second).UnixNano(), sl.Observed(telemetry.GPUMemUsed))
	assert.Zero(t, sl.Observed(telemetry.Waiting), "never reported")
	st.Publish("a", sample(t0.Add(2*time.Second), float64(telemetry.Running), 3))
	assert.Equal(t, t0.Add(2*time.Second).UnixNano(), sl.Observed(telemetry.Running), "the same value read again is a new reading")
	var nilSlot *telemetry.Slot
	assert.Zero(t, nilSlot.Observed(telemetry.Running))
}

func TestStoreDropsAndCountsBadInput(t *testing.T) {
	st := telemetry.Store{MaxEndpoints: 2}
	st.Publish("a", telemetry.Sample{Time: t0})                         // no field
	st.Publish("a", sample(time.Time{}, float64(telemetry.Waiting), 1)) // no time
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 1))
	st.Publish("b", sample(t0, float64(telemetry.Waiting), 1))
	st.Publish("c", sample(t0, float64(telemetry.Waiting), 1)) // table full
	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedEmpty: 2, DroppedFull: 1}, st.Stats())
	assert.Equal(t, 2, st.Len())
	assert.Nil(t, st.Slot("c"))
	st.Forget("a")
	assert.Equal(t, 1, st.Len())
	assert.NotNil(t, st.Slot("c"), "room again")
}

func TestHeldSlotsGoWithTheirLastHolder(t *testing.T) {
	st := telemetry.Store{MaxEndpoints: 2}
	a := st.Hold("a")
	require.NotNil(t, a)
	assert.Same(t, a, st.Hold("a"), "a second holder shares the slot")
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 1))
	st.Release("a")
	_, ok := st.Latest("a", t0, 0)
	assert.True(t, ok, "one holder left: kept")
	st.Release("a")
	_, ok = st.Latest("a", t0, 0)
	assert.False(t, ok, "the last holder let go: forgotten")
	assert.Zero(t, st.Len())
	st.Release("a") // more releases than holds change nothing

	// A slot nobody holds (made by Publish or Slot) stays until Forget.
	st.Publish("b", sample(t0, float64(telemetry.Waiting), 1))
	st.Release("b")
	assert.Equal(t, 1, st.Len())

	// PublishKnown never makes a slot.
	st.PublishKnown("c", sample(t0, float64(telemetry.Waiting), 1))
	st.PublishKnown("b", sample(t0.Add(time.Second), float64(telemetry.Waiting), 2))
	st.PublishKnown("b", telemetry.Sample{Time: t0})
	assert.Equal(t, 1, st.Len())
	got, _ := st.Latest("b", t0, 0)
	v, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 2.0, v)
	// The last unknown ID is named, so a mismatch shows (a scrape target's
	// EndpointID without the scheme the endpoint's ID has).
	assert.Equal(t, telemetry.StoreStats{Accepted: 3, DroppedEmpty: 1, DroppedUnknown: 1, LastUnknown: "c"}, st.Stats())
}

// Sample.Set admits only finite values, but Values and Has are exported:
// a Sink may be handed NaN or Inf, which must not reach the scorers.
func TestStoreDropsNonFiniteValues(t *testing.T) {
	var st telemetry.Store
	s := telemetry.Sample{Time: t0, Has: 1<<telemetry.KVCacheUsage | 1<<telemetry.Waiting | 1<<telemetry.Running}
	s.Values[telemetry.KVCacheUsage] = math.NaN()
	s.Values[telemetry.Waiting] = math.Inf(1)
	s.Values[telemetry.Running] = 2
	st.Publish("a", s)
	got, ok := st.Latest("a", t0, 0)
	require.True(t, ok)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.Running), got.Has, "only the finite field is kept")
	v, _ := got.Get(telemetry.Running)
	assert.Equal(t, 2.0, v)

	s.Has = 1<<telemetry.KVCacheUsage | 1<<telemetry.Waiting // nothing finite left
	st.Publish("a", s)
	st.PublishKnown("a", s)
	assert.Equal(t, telemetry.StoreStats{Accepted: 1, DroppedEmpty: 2}, st.Stats())
}

// Sample.Set drops a Running or Waiting count above MaxRequests (a counter
// read as a gauge), but Values and Has are exported: a Sink handed one by
// hand kept it, and the LLM scorer priced its endpoint out of rotation for
// as long as the reading stayed fresh.
func TestStoreDropsCountsAboveMaxRequests(t *testing.T) {
	var st telemetry.Store
	s := telemetry.Sample{Time: t0, Has: 1<<telemetry.Running | 1<<telemetry.Waiting | 1<<telemetry.KVCacheUsage}
	s.Values[telemetry.Running] = 1e15
	s.Values[telemetry.Waiting] = telemetry.MaxRequests
	s.Values[telemetry.KVCacheUsage] = 0.5
	st.Publish("a", s)
	got, ok := st.Latest("a", t0, 0)
	require.True(t, ok)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.Waiting|1<<telemetry.KVCacheUsage), got.Has, "the broken count is dropped, MaxRequests itself kept")

	s.Has = 1<<telemetry.Running | 1<<telemetry.Waiting // nothing plausible left
	s.Values[telemetry.Waiting] = telemetry.MaxRequests + 1
	st.Publish("a", s)
	st.PublishKnown("a", s)
	assert.Equal(t, telemetry.StoreStats{Accepted: 1, DroppedEmpty: 2}, st.Stats(), "a sample with nothing else is malformed")
}

// LoadInto's Time is the oldest kept field's, with or without maxAge.
func TestLoadIntoTimeIsTheOldestField(t *testing.T) {
	var st telemetry.Store
	st.Publish("e", sample(t0, float64(telemetry.GPUMemUsed), 1))
	st.Publish("e", sample(t0.Add(time.Hour), float64(telemetry.Waiting), 2))
	for _, maxAge := range []time.Duration{0, 24 * time.Hour} {
		var got telemetry.Sample
		st.Slot("e").LoadInto(&got, t0.Add(time.Hour), maxAge)
		assert.True(t, got.Time.Equal(t0), "maxAge %v: %v", maxAge, got.Time)
	}
}

func TestSlotReadsAreConsistentUnderConcurrency(t *testing.T) {
	var st telemetry.Store
	slot := st.Slot("a")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				st.Publish("a", sample(t0.Add(time.Duration(i)*time.Millisecond), float64(telemetry.Running), float64(w*1000+i)))
			}
		})
	}
	wg.Go(func() {
		var s telemetry.Sample
		for range 2000 {
			slot.LoadInto(&s, t0, 0)
		}
	})
	wg.Wait()
	var s telemetry.Sample
	slot.LoadInto(&s, t0, 0)
	v, ok := s.Get(telemetry.Running)
	require.True(t, ok)
	assert.Equal(t, 499.0, math.Mod(v, 1000), "the newest observation wins")
}

func TestSlotLoadDoesNotAllocate(t *testing.T) {
	var st telemetry.Store
	st.Publish("a", sample(t0, float64(telemetry.Running), 1))
	slot := st.Slot("a")
	var s telemetry.Sample
	assert.Zero(t, testing.AllocsPerRun(100, func() { slot.LoadInto(&s, t0, time.Minute) }))
}

// A wall clock stepped back (NTP correcting a clock that ran fast) leaves
// the held fields "observed" in the future for the length of the step.
// Fresher readings stamped with the stepped clock must still replace them,
// or telemetry freezes for as long as the step; and until they come, the
// held ones are of unknown age, so they are stale, not fresh for the step
// plus maxAge.
func TestStoreFollowsAClockSteppedBack(t *testing.T) {
	clock := testutil.NewClock()
	st := telemetry.Store{Clock: clock}
	st.Publish("a", sample(clock.Now(), float64(telemetry.Waiting), 5))

	clock.Set(testutil.Epoch.Add(-time.Hour)) // the step
	const maxAge = 30 * time.Second
	_, ok := st.Latest("a", clock.Now(), maxAge)
	assert.False(t, ok, "a field observed an hour from now is no fresh reading")

	clock.Advance(15 * time.Second) // the next scrape
	st.Publish("a", sample(clock.Now(), float64(telemetry.Waiting), 2))
	got, ok := st.Latest("a", clock.Now(), maxAge)
	require.True(t, ok)
	w, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 2.0, w, "the reading after the step replaces the one from before it")

	// After the step, order by observation time holds again.
	st.Publish("a", sample(clock.Now().Add(-5*time.Second), float64(telemetry.Waiting), 9))
	got, _ = st.Latest("a", clock.Now(), maxAge)
	w, _ = got.Get(telemetry.Waiting)
	assert.Equal(t, 2.0, w)
	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedOld: 1}, st.Stats())
}

// Through a Poller: every round after the step reaches the Store.
func TestPollerKeepsPublishingAfterAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	st := telemetry.Store{Clock: clock}
	var n float64
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		n++
		var s telemetry.Sample
		s.Set(telemetry.Running, n)
		return []telemetry.Observation{{EndpointID: "a", Sample: s}}, nil
	})
	p, err := telemetry.NewPoller(src, &st, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	p.Poll(t.Context())
	clock.Advance(-10 * time.Minute)
	for range 3 {
		clock.Advance(15 * time.Second)
		p.Poll(t.Context())
		got, ok := st.Latest("a", clock.Now(), time.Minute)
		require.True(t, ok)
		r, _ := got.Get(telemetry.Running)
		assert.Equal(t, n, r)
	}
	assert.Equal(t, telemetry.StoreStats{Accepted: 4}, st.Stats())
}

// A full table of slots nobody holds (Publish made them) makes room for a
// holder: they go, held ones stay, and a table full of held slots still
// refuses a new ID.
func TestHoldDropsUnheldSlotsWhenFull(t *testing.T) {
	st := telemetry.Store{MaxEndpoints: 3}
	require.NotNil(t, st.Hold("a"))
	st.Publish("x", sample(t0, float64(telemetry.Waiting), 1))
	st.Publish("y", sample(t0, float64(telemetry.Waiting), 1))
	st.Publish("z", sample(t0, float64(telemetry.Waiting), 1)) // full
	require.NotNil(t, st.Hold("b"), "x and y make room")
	assert.Equal(t, 2, st.Len())
	_, ok := st.Latest("x", t0, 0)
	assert.False(t, ok)
	require.NotNil(t, st.Hold("c"))
	st.Forget("c")
	require.NotNil(t, st.Hold("d"))
	assert.Nil(t, st.Hold("e"), "every slot held: full")
	st.Release("a")
	assert.NotNil(t, st.Hold("e"))
	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedFull: 1}, st.Stats())
}

// A holder whose slot was forgotten (Forget, for an endpoint that left)
// and then held anew by another holder lets go of its own slot, not of
// the new one: ReleaseSlot of the old slot leaves the new holder's
// telemetry in place. Release by ID dropped it, and the new holder kept
// reading an orphaned slot that nothing published to.
func TestReleaseOfAForgottenSlotKeepsTheNewHolders(t *testing.T) {
	st := telemetry.Store{MaxEndpoints: 4}
	old := st.Hold("a")
	require.NotNil(t, old)
	st.Forget("a")
	cur := st.Hold("a") // another Balancer on the shared Store
	require.NotNil(t, cur)
	require.NotSame(t, old, cur)
	st.ReleaseSlot("a", old)
	assert.Same(t, cur, st.Slot("a"), "the new holder's slot stays")
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 1))
	var s telemetry.Sample
	cur.LoadInto(&s, t0, 0)
	assert.False(t, s.Empty(), "and gets what is published")
	st.ReleaseSlot("a", cur)
	assert.Zero(t, st.Len(), "its last holder let go")
	st.ReleaseSlot("a", cur) // more releases than holds change nothing
	assert.Zero(t, st.Len())
}

// A Sample's Time is the publisher's: a Source reads it from an exposition
// (a timestamp is any int64 of milliseconds) and a Sink takes anything. One
// that int64 nanoseconds cannot hold (before 1678 or after 2262) wrapped
// in UnixNano to an arbitrary time, which could fall next to now: a reading
// stamped in the year 857 was kept as fresh and routed on. A time that is
// not after the Unix epoch, or past the nanosecond range, is no usable time:
// the sample is dropped and counted (DroppedEmpty), and a held reading is
// left as it was.
func TestStoreDropsATimeOutOfTheNanosecondRange(t *testing.T) {
	clock := testutil.NewClock()
	now := clock.Now()
	// 2×2⁶⁴ ns is 36893488147.4 s; a second less than that before now
	// wraps to 0.58 s before now.
	wraps := time.Unix(now.Unix()-36893488148, 0)
	require.Less(t, wraps.Year(), 1678)
	require.InDelta(t, now.UnixNano(), wraps.UnixNano(), float64(time.Second), "the precondition: it wraps to about now")

	for _, at := range []time.Time{wraps, time.Unix(1<<40, 0), time.Unix(0, 0), time.Unix(-1, 0)} {
		t.Run(at.String(), func(t *testing.T) {
			st := telemetry.Store{Clock: clock}
			st.Publish("a", sample(at, float64(telemetry.Waiting), 100))
			_, ok := st.Latest("a", now, 10*time.Second)
			assert.False(t, ok, "not applied")
			st.Publish("b", sample(now.Add(-time.Second), float64(telemetry.Waiting), 1))
			st.Publish("b", sample(at, float64(telemetry.Waiting), 100))
			s, ok := st.Latest("b", now, 10*time.Second)
			require.True(t, ok)
			w, _ := s.Get(telemetry.Waiting)
			assert.Equal(t, 1.0, w, "the held reading stays")
			slot := st.Slot("c")
			st.PublishKnown("c", sample(at, float64(telemetry.Waiting), 100))
			assert.Zero(t, slot.Observed(telemetry.Waiting))
			assert.Equal(t, uint64(3), st.Stats().DroppedEmpty)
			assert.Equal(t, uint64(1), st.Stats().Accepted)
		})
	}
}

// A server that reports its KV-cache usage is never priced by its GPU
// memory (MemoryPressure), and must not start to be when that reading goes
// stale while DCGM's memory stays fresh: a vLLM replica started at 0.95 of
// its GPU cost 5.8x its peers once its load headers stopped (it was idle),
// which kept it idle. Stale is neutral: the memory is left out with it.
func TestLoadIntoLeavesMemoryOutWhileKVIsStale(t *testing.T) {
	var st telemetry.Store
	mem := sample(t0.Add(time.Minute), float64(telemetry.GPUMemUsed), 76, float64(telemetry.GPUMemTotal), 80)
	st.Publish("vllm", sample(t0, float64(telemetry.KVCacheUsage), 0.2, float64(telemetry.Waiting), 1))
	st.Publish("vllm", mem)
	st.Publish("triton", mem)
	now := t0.Add(time.Minute + time.Second)

	var s telemetry.Sample
	st.Slot("vllm").LoadInto(&s, now, 30*time.Second)
	_, ok := s.MemoryPressure()
	assert.False(t, ok, "a stale KV reading still says how the server allocates")
	assert.True(t, s.Empty(), "memory goes stale with the KV reading; got %b", s.Has)
	assert.True(t, s.Time.IsZero())

	st.Slot("triton").LoadInto(&s, now, 30*time.Second)
	u, ok := s.MemoryPressure()
	assert.True(t, ok, "a server that never reported a KV cache is judged on its memory")
	assert.Equal(t, 0.95, u)

	st.Publish("vllm", sample(now, float64(telemetry.KVCacheUsage), 0.3))
	st.Slot("vllm").LoadInto(&s, now, 30*time.Second)
	_, ok = s.MemoryUsage()
	assert.True(t, ok, "with a fresh KV reading the memory is there, as before")
	st.Slot("vllm").LoadInto(&s, now.Add(time.Hour), 0)
	_, ok = s.MemoryUsage()
	assert.True(t, ok, "no maximum age: nothing is stale")
}

// Expire drops the named fields observed before its time and nothing else:
// a transport reconnecting to an endpoint forgets what the old process
// reported, and keeps other fields and readings taken since.
func TestExpireDropsOnlyOlderReadingsOfTheFields(t *testing.T) {
	var st telemetry.Store
	st.Publish("a", sample(t0, float64(telemetry.KVCacheUsage), 0.95, float64(telemetry.Waiting), 30, float64(telemetry.GPUTemp), 70))
	st.Publish("a", sample(t0.Add(2*time.Second), float64(telemetry.Running), 1))
	var a telemetry.Sample
	require.True(t, a.SetAdapters(2, &telemetry.Adapters{Base: "m", Running: []string{"x"}}))
	a.Time = t0
	st.Publish("a", a)
	sl := st.Slot("a")

	fields := telemetry.FieldSet(1<<telemetry.KVCacheUsage | 1<<telemetry.Waiting | 1<<telemetry.Running | 1<<telemetry.LoRASlots)
	assert.True(t, st.Expire("a", fields, t0.Add(time.Second)))
	got, ok := st.Latest("a", t0.Add(3*time.Second), 0)
	require.True(t, ok)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.GPUTemp|1<<telemetry.Running), got.Has, "only older readings of the fields go")
	assert.Nil(t, got.Adapters, "the adapters go with LoRASlots")
	_, _, ok = sl.LoRA(t0.Add(3*time.Second), 0)
	assert.False(t, ok)
	assert.Zero(t, sl.Observed(telemetry.KVCacheUsage))

	assert.False(t, st.Expire("a", fields, t0.Add(time.Second)), "nothing left to drop")
	assert.False(t, st.Expire("b", fields, t0.Add(time.Second)), "no slot")

	// A fresh reading after the expiry is merged as any other.
	st.Publish("a", sample(t0.Add(3*time.Second), float64(telemetry.KVCacheUsage), 0.1))
	got, _ = st.Latest("a", t0.Add(3*time.Second), 0)
	kv, ok := got.Get(telemetry.KVCacheUsage)
	assert.True(t, ok)
	assert.Equal(t, 0.1, kv)

	assert.True(t, st.Expire("a", fields|1<<telemetry.GPUTemp, t0.Add(time.Hour)))
	_, ok = st.Latest("a", t0.Add(time.Hour), 0)
	assert.False(t, ok, "every field expired")
}

// After Expire, a reading of a dropped field observed before the expiry
// (a Prometheus scrape of the old process, read a poll later) is refused
// as the field's older readings were; a later one is merged. A slot whose
// KV-cache usage was expired leaves GPU memory out until a new KV reading
// comes: the server pre-allocates all the same, and priced by its memory
// (fresh from DCGM) a vLLM replica at 95% of its GPU cost several times
// its peers after every reconnect or failure exclusion.
func TestExpiredFieldsRefuseOlderReadingsAndKeepMemoryOut(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(t0.Add(time.Minute))
	st := telemetry.Store{Clock: clock}
	st.Publish("a", sample(t0, float64(telemetry.KVCacheUsage), 0.95, float64(telemetry.Waiting), 30))
	kvOnly := telemetry.FieldSet(1<<telemetry.KVCacheUsage | 1<<telemetry.Waiting)
	require.True(t, st.Expire("a", kvOnly, t0.Add(10*time.Second)))

	// DCGM, scraped since: memory used and size.
	st.Publish("a", sample(t0.Add(11*time.Second), float64(telemetry.GPUMemUsed), 76e9, float64(telemetry.GPUMemTotal), 80e9))
	now := t0.Add(12 * time.Second)
	got, _ := st.Latest("a", now, 30*time.Second)
	_, ok := got.MemoryPressure()
	assert.False(t, ok, "an expired KV-cache usage let GPU memory price a server that pre-allocates")

	// The old process's reading, arriving late.
	st.Publish("a", sample(t0.Add(5*time.Second), float64(telemetry.KVCacheUsage), 0.95))
	got, _ = st.Latest("a", now, 30*time.Second)
	assert.False(t, got.Has.Has(telemetry.KVCacheUsage), "a reading from before the expiry came back")
	assert.EqualValues(t, 1, st.Stats().DroppedOld)

	// The new process's reading.
	st.Publish("a", sample(t0.Add(12*time.Second), float64(telemetry.KVCacheUsage), 0.1))
	got, _ = st.Latest("a", now, 30*time.Second)
	kv, ok := got.Get(telemetry.KVCacheUsage)
	assert.True(t, ok)
	assert.Equal(t, 0.1, kv)
	assert.True(t, got.Has.Has(telemetry.GPUMemUsed), "memory comes back with a fresh KV reading")

	// A server that never reported a KV-cache usage is priced by memory.
	st.Publish("b", sample(t0.Add(11*time.Second), float64(telemetry.GPUMemUsed), 76e9, float64(telemetry.GPUMemTotal), 80e9))
	got, _ = st.Latest("b", now, 30*time.Second)
	_, ok = got.MemoryPressure()
	assert.True(t, ok)
}

// A custom Source's Adapters lists are bounded as the built-in sources'
// are (AdapterNames): at most MaxAdapterNames names, none empty or longer
// than MaxAdapterNameLen, whatever it publishes, and its own lists
// untouched.
func TestPublishBoundsAdapterLists(t *testing.T) {
	var st telemetry.Store
	running := make([]string, 1000)
	for i := range running {
		running[i] = fmt.Sprintf("adapter-%d", i)
	}
	long := strings.Repeat("x", telemetry.MaxAdapterNameLen+1)
	waiting := []string{"w", long, "", "v"}
	in := &telemetry.Adapters{Base: "m", Running: running, Waiting: waiting}
	var a telemetry.Sample
	require.True(t, a.SetAdapters(4, in))
	a.Time = t0
	st.Publish("a", a)

	got, _, ok := st.Slot("a").LoRA(t0, 0)
	require.True(t, ok)
	assert.Equal(t, "m", got.Base)
	assert.Equal(t, running[:telemetry.MaxAdapterNames], got.Running)
	assert.Equal(t, []string{"w", "v"}, got.Waiting)
	assert.Len(t, in.Running, 1000, "the source's lists are its own")
	assert.Equal(t, []string{"w", long, "", "v"}, in.Waiting)

	// Lists within the bounds are kept as published, not copied.
	small := &telemetry.Adapters{Base: "m", Running: []string{"x"}}
	var b telemetry.Sample
	require.True(t, b.SetAdapters(4, small))
	b.Time = t0.Add(time.Second)
	st.Publish("a", b)
	got, _, ok = st.Slot("a").LoRA(t0.Add(time.Second), 0)
	require.True(t, ok)
	assert.Same(t, small, got)
}

// A second Expire raises the floor of a field the first one dropped, when
// no reading of it came in between. A replica that crashed again before
// any reading of its second process arrived (a crash loop; a Prometheus
// scrape read a poll after it was taken) kept the first expiry's floor:
// the second process's last reading, arriving after the second expiry,
// was merged, and priced the third process, idle, as full.
func TestExpireAgainRaisesTheFloorOfADroppedField(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(t0.Add(time.Minute))
	st := telemetry.Store{Clock: clock}
	st.Publish("a", sample(t0, float64(telemetry.KVCacheUsage), 0.95))
	kv := telemetry.FieldSet(1 << telemetry.KVCacheUsage)
	require.True(t, st.Expire("a", kv, t0.Add(10*time.Second)))
	st.Expire("a", kv, t0.Add(20*time.Second)) // nothing held to drop

	// The second process's reading, taken before the second expiry.
	st.Publish("a", sample(t0.Add(15*time.Second), float64(telemetry.KVCacheUsage), 0.95))
	got, _ := st.Latest("a", t0.Add(30*time.Second), 0)
	assert.False(t, got.Has.Has(telemetry.KVCacheUsage), "a reading from before the second expiry came back")
	assert.EqualValues(t, 1, st.Stats().DroppedOld)

	// The third process's reading.
	st.Publish("a", sample(t0.Add(25*time.Second), float64(telemetry.KVCacheUsage), 0.1))
	got, _ = st.Latest("a", t0.Add(30*time.Second), 0)
	v, ok := got.Get(telemetry.KVCacheUsage)
	assert.True(t, ok)
	assert.Equal(t, 0.1, v)
}

// TestStoreExpiredSignalsADrop: Expired's channel closes when Expire drops
// a field, and only then; after that, Expired hands out a new one.
func TestStoreExpiredSignalsADrop(t *testing.T) {
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	var st telemetry.Store
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 3, float64(telemetry.GPUTemp), 60))
	c := st.Expired()
	assert.Equal(t, c, st.Expired(), "one channel until a drop")
	assert.False(t, st.Expire("b", telemetry.ProcessLoad, t0.Add(time.Second)), "no such endpoint")
	assert.False(t, st.Expire("a", telemetry.ProcessLoad, t0), "nothing observed before t0")
	assert.False(t, st.Expire("a", telemetry.FieldSet(1<<telemetry.Running), t0.Add(time.Second)), "no such field")
	assert.False(t, closed(c), "nothing was dropped")

	require.True(t, st.Expire("a", telemetry.ProcessLoad, t0.Add(time.Second)))
	assert.True(t, closed(c))
	assert.False(t, st.Expire("a", telemetry.ProcessLoad, t0.Add(2*time.Second)), "dropped already")
	c2 := st.Expired()
	assert.False(t, closed(c2), "a new channel after the drop")
	st.Publish("a", sample(t0.Add(3*time.Second), float64(telemetry.Waiting), 1))
	require.True(t, st.Expire("a", telemetry.ProcessLoad, t0.Add(4*time.Second)))
	assert.True(t, closed(c2))
}

// TestSlotHeld: a field is held once read, fresh or stale, and after
// Expire dropped it; never before its first reading.
func TestSlotHeld(t *testing.T) {
	var st telemetry.Store
	start := time.Unix(1000, 0)
	st.Publish("a", sample(start, float64(telemetry.Waiting), 1, float64(telemetry.GPUTemp), 60))
	sl := st.Slot("a")
	require.NotNil(t, sl)
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.Waiting|1<<telemetry.GPUTemp), sl.Held())
	require.True(t, st.Expire("a", telemetry.ProcessLoad, start.Add(time.Second)))
	assert.Equal(t, telemetry.FieldSet(1<<telemetry.Waiting|1<<telemetry.GPUTemp), sl.Held(), "dropped by Expire: held")
	assert.Zero(t, (*telemetry.Slot)(nil).Held())
}

// PublishKnownWithin counts a sample merged though already older than the
// reader's max age as ArrivedStale, not Accepted, and merges it all the
// same: it is the newest reading of its field, and refuses older ones.
func TestPublishKnownWithinCountsStaleArrivals(t *testing.T) {
	var st telemetry.Store
	st.Hold("a")
	now := t0.Add(time.Hour)
	st.PublishKnownWithin("a", sample(now.Add(-time.Minute), float64(telemetry.Waiting), 3), now, 30*time.Second)
	assert.Equal(t, telemetry.StoreStats{ArrivedStale: 1}, st.Stats())
	_, ok := st.Latest("a", now, 30*time.Second)
	assert.False(t, ok, "not read at that max age")
	got, ok := st.Latest("a", now, 0)
	require.True(t, ok, "but kept")
	v, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 3.0, v)

	st.PublishKnownWithin("a", sample(now.Add(-2*time.Minute), float64(telemetry.Waiting), 9), now, 30*time.Second)
	st.PublishKnownWithin("a", sample(now.Add(-30*time.Second), float64(telemetry.Waiting), 1), now, 30*time.Second)
	st.PublishKnownWithin("a", sample(now.Add(-time.Hour), float64(telemetry.Running), 1), now, 0) // no max age
	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedOld: 1, ArrivedStale: 1}, st.Stats())
}

// A sample the Store refuses (older than every field it carries: a scrape
// of a process since expired, a late Prometheus reading) costs no
// allocation: a Poller publishes one per endpoint on every round, and a
// fleet that keeps sending them must not turn the refusals into garbage.
func TestRefusedSampleDoesNotAllocate(t *testing.T) {
	var st telemetry.Store
	st.Hold("a")
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 1, float64(telemetry.KVCacheUsage), 0.5))
	old := sample(t0.Add(-time.Second), float64(telemetry.Waiting), 2, float64(telemetry.KVCacheUsage), 0.9)
	assert.Zero(t, testing.AllocsPerRun(100, func() { st.Publish("a", old) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { st.PublishKnown("a", old) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { st.PublishKnownWithin("a", old, t0, time.Minute) }))
	assert.EqualValues(t, 303, st.Stats().DroppedOld, "the refusals were counted")
	got, _ := st.Latest("a", t0, 0)
	v, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 1.0, v, "and changed nothing")
}

// Publish and PublishKnown count a sample older than the largest max age
// the Store's readers declared in ArrivedStale: none of them reads it.
// Without a declaration, or once a reader that keeps every field is
// declared, it is accepted.
func TestReadWithinCountsStaleArrivalsOfPublish(t *testing.T) {
	now := t0.Add(time.Hour)
	clock := testutil.NewClock()
	clock.Advance(now.Sub(clock.Now()))
	st := telemetry.Store{Clock: clock}
	st.Hold("a")
	at := func(ago time.Duration, v float64) telemetry.Sample {
		return sample(now.Add(-ago), float64(telemetry.Waiting), v)
	}
	st.Publish("a", at(50*time.Second, 1)) // no reader declared
	assert.Equal(t, telemetry.StoreStats{Accepted: 1}, st.Stats())

	st.ReadWithin(30 * time.Second)
	st.ReadWithin(40 * time.Second) // the largest counts
	st.ReadWithin(10 * time.Second)
	st.Publish("a", at(45*time.Second, 2))
	st.PublishKnown("a", at(41*time.Second, 3))
	st.Publish("a", at(40*time.Second, 4)) // exactly the max age: read
	st.Publish("b", at(35*time.Second, 5))
	assert.Equal(t, telemetry.StoreStats{Accepted: 3, ArrivedStale: 2}, st.Stats())

	st.ReadWithin(0) // a reader that keeps every field
	st.ReadWithin(time.Minute)
	st.Publish("c", at(10*time.Minute, 6)) // stale by any max age declared
	assert.Equal(t, telemetry.StoreStats{Accepted: 4, ArrivedStale: 2}, st.Stats())
}
