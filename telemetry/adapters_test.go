package telemetry_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
)

func TestSlotWait(t *testing.T) {
	var s telemetry.Sample
	a := &telemetry.Adapters{Base: "llama", Running: []string{"sql", "chat"}, Waiting: []string{"law"}}
	ad, full := s.SlotWait("math")
	assert.False(t, ad || full, "no LoRA telemetry: nothing known")

	require.True(t, s.SetAdapters(2, a))
	for _, m := range []string{"", "llama", "sql", "chat"} {
		ad, full = s.SlotWait(m)
		assert.False(t, ad || full, "%q: the base model or an adapter running there", m)
	}
	ad, full = s.SlotWait("math")
	assert.True(t, ad, "an adapter not running takes a slot")
	assert.True(t, full, "two slots, two adapters running: it waits")
	ad, full = s.SlotWait("law")
	assert.True(t, ad && full, "law waits there for want of a slot: held, as a new call would be")

	s.Set(telemetry.LoRASlots, 4)
	ad, full = s.SlotWait("math")
	assert.True(t, ad)
	assert.False(t, full, "a free slot")
	ad, full = s.SlotWait("law")
	assert.False(t, ad || full, "waiting with a slot free: about to run")

	s.Set(telemetry.LoRASlots, 0) // through Set, not SetAdapters
	ad, full = s.SlotWait("math")
	assert.False(t, ad || full, "no slots is no reading")
}

func TestSetAdaptersRejects(t *testing.T) {
	a := &telemetry.Adapters{Base: "llama"}
	for _, slots := range []float64{0, -1, 0.5, math.NaN(), math.Inf(1)} {
		var s telemetry.Sample
		assert.False(t, s.SetAdapters(slots, a), "%v slots", slots)
		assert.True(t, s.Empty())
		assert.Nil(t, s.Adapters)
	}
	var s telemetry.Sample
	assert.False(t, s.SetAdapters(1, nil))
	assert.True(t, s.Empty())
}

// The Store keeps a server's adapters with its LoRASlots field: a later
// sample of other fields leaves them, a newer one replaces them, an older
// one does not, and they go stale with the field.
func TestStoreKeepsAdaptersWithTheirField(t *testing.T) {
	var st telemetry.Store
	first := &telemetry.Adapters{Base: "llama", Running: []string{"sql"}}
	s := sample(t0, float64(telemetry.Running), 3)
	s.SetAdapters(1, first)
	st.Publish("a", s)

	st.Publish("a", sample(t0.Add(time.Second), float64(telemetry.Waiting), 2))
	got, ok := st.Latest("a", t0.Add(time.Second), 0)
	require.True(t, ok)
	assert.Same(t, first, got.Adapters, "a sample without the field keeps the adapters")

	older := sample(t0.Add(-time.Second))
	older.SetAdapters(4, &telemetry.Adapters{Base: "llama"})
	st.Publish("a", older)
	got, _ = st.Latest("a", t0.Add(time.Second), 0)
	assert.Same(t, first, got.Adapters, "an older reading does not replace them")
	v, _ := got.Get(telemetry.LoRASlots)
	assert.Equal(t, 1.0, v)

	second := &telemetry.Adapters{Base: "llama", Running: []string{"chat"}}
	newer := sample(t0.Add(2 * time.Second))
	newer.SetAdapters(2, second)
	st.Publish("a", newer)
	got, _ = st.Latest("a", t0.Add(2*time.Second), 0)
	assert.Same(t, second, got.Adapters)

	// Stale: LoRASlots was observed at t0+2s; at t0+20s with a 10 s
	// maximum age it is dropped, and its adapters with it, while the
	// destination's previous adapters do not survive the load either.
	slot := st.Slot("a")
	dst := telemetry.Sample{Adapters: first}
	slot.LoadInto(&dst, t0.Add(20*time.Second), 10*time.Second)
	_, ok = dst.Get(telemetry.LoRASlots)
	assert.False(t, ok)
	assert.Nil(t, dst.Adapters, "stale adapters are not read")
	slot.LoadInto(&dst, t0.Add(5*time.Second), 10*time.Second)
	assert.Same(t, second, dst.Adapters)
}

func TestLoRAOnTheStore(t *testing.T) {
	var st telemetry.Store
	assert.Zero(t, st.AdaptersObserved())
	st.Publish("a", sample(t0, float64(telemetry.Running), 1))
	assert.Zero(t, st.AdaptersObserved(), "no adapters yet")
	slot := st.Slot("a")
	_, _, ok := slot.LoRA(t0, time.Minute)
	assert.False(t, ok)

	a := &telemetry.Adapters{Base: "llama", Running: []string{"sql"}}
	s := sample(t0.Add(time.Second))
	s.SetAdapters(1, a)
	st.Publish("a", s)
	assert.Equal(t, t0.Add(time.Second).UnixNano(), st.AdaptersObserved())
	got, slots, ok := slot.LoRA(t0.Add(time.Second), time.Minute)
	assert.True(t, ok)
	assert.Same(t, a, got)
	assert.Equal(t, 1.0, slots)
	_, _, ok = slot.LoRA(t0.Add(2*time.Minute), time.Minute)
	assert.False(t, ok, "stale")
	_, _, ok = slot.LoRA(t0.Add(-2*time.Minute), time.Minute)
	assert.False(t, ok, "from the future")
	_, _, ok = slot.LoRA(t0.Add(2*time.Minute), 0)
	assert.True(t, ok, "no maximum age")

	older := sample(t0)
	older.SetAdapters(2, &telemetry.Adapters{Base: "llama"})
	st.Publish("b", older)
	assert.Equal(t, t0.Add(time.Second).UnixNano(), st.AdaptersObserved(), "the newest observation")
	zero := sample(t0.Add(2 * time.Second))
	zero.Adapters = &telemetry.Adapters{Base: "llama"}
	zero.Has |= 1 << telemetry.LoRASlots // a slot count of 0, set by hand
	st.Publish("b", zero)
	_, _, ok = st.Slot("b").LoRA(t0.Add(2*time.Second), time.Minute)
	assert.False(t, ok, "no slots is no reading")

	var nilSlot *telemetry.Slot
	_, _, ok = nilSlot.LoRA(t0, 0)
	assert.False(t, ok)
}

func TestAdapterNames(t *testing.T) {
	assert.Nil(t, telemetry.AdapterNames(""))
	assert.Equal(t, []string{"a", "b", "c"}, telemetry.AdapterNames("a,, b ,c,"))
	long := strings.Repeat("x", telemetry.MaxAdapterNameLen+1)
	assert.Equal(t, []string{"a", strings.Repeat("y", telemetry.MaxAdapterNameLen)},
		telemetry.AdapterNames("a,"+long+","+strings.Repeat("y", telemetry.MaxAdapterNameLen)), "a name too long is left out")
	many := make([]string, 2*telemetry.MaxAdapterNames)
	for i := range many {
		many[i] = fmt.Sprint("lora-", i)
	}
	got := telemetry.AdapterNames(strings.Join(many, ","))
	assert.Equal(t, many[:telemetry.MaxAdapterNames], got)
}
