package telemetry_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
)

// Asleep takes 0 and 1 only: 0 (awake) must be kept, or the reading after
// a wake-up could never replace the one that said asleep.
func TestAsleepTakesZeroAndOne(t *testing.T) {
	var s telemetry.Sample
	assert.True(t, s.Set(telemetry.Asleep, 1))
	assert.True(t, s.Set(telemetry.Asleep, 0))
	v, ok := s.Get(telemetry.Asleep)
	assert.True(t, ok)
	assert.Equal(t, 0.0, v)
	var bad telemetry.Sample
	for _, v := range []float64{0.5, 2, -1, math.NaN(), math.Inf(1)} {
		assert.False(t, bad.Set(telemetry.Asleep, v), "%v", v)
	}
	assert.True(t, bad.Empty())
	f, ok := telemetry.ParseField("asleep")
	assert.True(t, ok)
	assert.Equal(t, telemetry.Asleep, f)
}

// A Store holds a server's sleep as any field: the awake reading of a
// later scrape replaces the asleep one, a stale reading says nothing
// (Slot.Asleep false), and AsleepObserved tells a picker whether any
// endpoint was seen asleep lately.
func TestStoreAsleep(t *testing.T) {
	const maxAge = 30 * time.Second
	var st telemetry.Store
	assert.Zero(t, st.AsleepObserved())
	st.Publish("a", sample(t0, float64(telemetry.Running), 0, float64(telemetry.Asleep), 0))
	sl := st.Slot("a")
	assert.False(t, sl.Asleep(t0, maxAge), "awake")
	assert.Zero(t, st.AsleepObserved(), "an awake reading is no sleep")

	st.Publish("a", sample(t0.Add(time.Second), float64(telemetry.Asleep), 1))
	assert.True(t, sl.Asleep(t0.Add(2*time.Second), maxAge))
	assert.Equal(t, t0.Add(time.Second).UnixNano(), st.AsleepObserved())
	got, _ := st.Latest("a", t0.Add(2*time.Second), maxAge)
	v, ok := got.Get(telemetry.Asleep)
	assert.True(t, ok)
	assert.Equal(t, 1.0, v)

	assert.False(t, sl.Asleep(t0.Add(time.Second+maxAge+1), maxAge), "a stale reading is neutral")
	assert.True(t, sl.Asleep(t0.Add(time.Hour), 0), "maxAge 0 keeps every reading")

	st.Publish("a", sample(t0.Add(3*time.Second), float64(telemetry.Asleep), 0))
	assert.False(t, sl.Asleep(t0.Add(4*time.Second), maxAge), "woken: the awake reading replaces the asleep one")
	assert.Equal(t, t0.Add(time.Second).UnixNano(), st.AsleepObserved(), "only a sleep moves it")

	var nilSlot *telemetry.Slot
	assert.False(t, nilSlot.Asleep(t0, maxAge))
}

// A restarted server starts awake: a reconnect's Expire of ProcessLoad
// drops a reading that said asleep.
func TestExpireDropsAsleep(t *testing.T) {
	require.True(t, telemetry.ProcessLoad.Has(telemetry.Asleep))
	var st telemetry.Store
	st.Publish("a", sample(t0, float64(telemetry.Asleep), 1))
	require.True(t, st.Expire("a", telemetry.ProcessLoad, t0.Add(time.Second)))
	assert.False(t, st.Slot("a").Asleep(t0.Add(time.Second), time.Minute))
}
