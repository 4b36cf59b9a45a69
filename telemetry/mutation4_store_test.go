package telemetry_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// Mutation sample 4 over the Store's staleness and its counts of what it
// dropped: each test names the mutant it kills.

// LastUnknown is the latest unknown ID, not the first. Kills
// publishKnown noting an unknown ID only while none was noted.
func TestStoreLastUnknownIsTheLatest(t *testing.T) {
	var st telemetry.Store
	st.PublishKnown("first", sample(t0, float64(telemetry.Waiting), 1))
	st.PublishKnown("second", sample(t0, float64(telemetry.Waiting), 1))
	assert.Equal(t, telemetry.StoreStats{DroppedUnknown: 2, LastUnknown: "second"}, st.Stats())
}

// A held reading from the future (stamped before the clock stepped back)
// gives way to one that is not from the future, but not to an older one
// from the future too: that one is refused, counted in DroppedOld. Kills
// merge replacing a held future field with any older reading.
func TestStoreRefusesAnOlderReadingFromTheFuture(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(t0)
	st := telemetry.Store{Clock: clock}
	st.Publish("a", sample(t0.Add(2*time.Hour), float64(telemetry.Waiting), 2))
	st.Publish("a", sample(t0.Add(time.Hour), float64(telemetry.Waiting), 1))
	assert.Equal(t, telemetry.StoreStats{Accepted: 1, DroppedOld: 1}, st.Stats())
	assert.Equal(t, t0.Add(2*time.Hour).UnixNano(), st.Slot("a").Observed(telemetry.Waiting))
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 3)) // not from the future: replaces it
	assert.Equal(t, telemetry.StoreStats{Accepted: 2, DroppedOld: 1}, st.Stats())
	s, ok := st.Latest("a", t0, time.Minute)
	require.True(t, ok)
	v, _ := s.Get(telemetry.Waiting)
	assert.Equal(t, 3.0, v)
}

// A field observed exactly maxAge before now is kept ("no more than
// maxAge"). Kills LoadInto dropping a field at lo itself.
func TestLoadIntoKeepsAFieldExactlyMaxAgeOld(t *testing.T) {
	var st telemetry.Store
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 4))
	s, ok := st.Latest("a", t0.Add(30*time.Second), 30*time.Second)
	require.True(t, ok, "observed exactly 30 s before")
	v, _ := s.Get(telemetry.Waiting)
	assert.Equal(t, 4.0, v)
	_, ok = st.Latest("a", t0.Add(30*time.Second+1), 30*time.Second)
	assert.False(t, ok, "1 ns more")
}

// An Asleep reading of 1 from more than maxAge ahead of now (stamped
// before the clock stepped back) says nothing, as LoadInto leaves it out.
// Kills Slot.Asleep bounding the reading's age on one side only.
func TestSlotAsleepFromTheFutureSaysNothing(t *testing.T) {
	var st telemetry.Store
	st.Publish("a", sample(t0.Add(time.Hour), float64(telemetry.Asleep), 1))
	sl := st.Slot("a")
	assert.True(t, sl.Asleep(t0.Add(time.Hour), 30*time.Second))
	assert.False(t, sl.Asleep(t0, 30*time.Second), "an hour ahead of now")
	assert.True(t, sl.Asleep(t0, 0), "no max age: kept whatever its age")
	var s telemetry.Sample
	sl.LoadInto(&s, t0, 30*time.Second)
	assert.False(t, s.Has.Has(telemetry.Asleep), "LoadInto agrees")
}

// A Store whose clock reads a time so far back that now minus the
// readers' max age is not an int64 (before the year 1678) counts no
// arrival stale, rather than every one. Kills readersStaleBefore without
// its overflow guard: now - maxAge wrapped to the far future.
func TestStoreClockAtTheFarPastCountsNoArrivalStale(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Unix(0, math.MinInt64+int64(time.Second)))
	st := telemetry.Store{Clock: clock}
	st.ReadWithin(30 * time.Second)
	st.Publish("a", sample(t0, float64(telemetry.Waiting), 1))
	assert.Equal(t, telemetry.StoreStats{Accepted: 1}, st.Stats())
}
