package telemetry_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
)

// TGI and Triton's vLLM backend reserve their KV cache at start, as vLLM
// does, but report no KV-cache usage: their GPU memory (0.93-0.99 of it
// whatever their load) priced them as servers that allocate as they go,
// 5.8x at 0.95 and 14x at 0.97. KVCachePreallocated keeps their memory out
// of MemoryPressure, as a KV-cache usage does.
func TestKVCachePreallocatedKeepsMemoryOutOfPressure(t *testing.T) {
	mem := []float64{float64(telemetry.GPUMemUsed), 76, float64(telemetry.GPUMemTotal), 80}
	s := sample(t0, mem...)
	_, ok := s.MemoryPressure()
	require.True(t, ok, "a server that allocates as it goes is priced by its memory")
	require.True(t, s.Set(telemetry.KVCachePreallocated, 1))
	_, ok = s.MemoryPressure()
	assert.False(t, ok, "a server that pre-allocates was priced by its memory")
	u, ok := s.MemoryUsage()
	assert.True(t, ok)
	assert.Equal(t, 0.95, u, "the usage itself is still there")

	// 1 is the field's only value: a 0 is no "allocates as it goes".
	var bad telemetry.Sample
	for _, v := range []float64{0, 2, -1, math.NaN(), math.Inf(1)} {
		assert.False(t, bad.Set(telemetry.KVCachePreallocated, v), "%v", v)
	}
	assert.True(t, bad.Empty())
	var st telemetry.Store
	bad.Time = t0
	bad.Has = 1 << telemetry.KVCachePreallocated // Values[f] is 0
	st.Publish("a", bad)
	assert.EqualValues(t, 1, st.Stats().DroppedEmpty)
}

// A Slot holds the mark as it holds a KV-cache usage: while it is fresh it
// reaches the scorer with the memory, and once it is stale (a /metrics
// scrape that fails or times out while DCGM's memory keeps coming) or
// expired, the memory is left out, as LoadInto leaves it out for a stale
// KV-cache usage: stale telemetry is neutral.
func TestSlotKeepsMemoryOutWhileKVCachePreallocated(t *testing.T) {
	const maxAge = 30 * time.Second
	memAt := t0.Add(time.Minute)
	mem := sample(memAt, float64(telemetry.GPUMemUsed), 76e9, float64(telemetry.GPUMemTotal), 80e9)
	tgi := func(at time.Time) telemetry.Sample {
		return sample(at, float64(telemetry.Running), 3, float64(telemetry.KVCachePreallocated), 1)
	}
	var st telemetry.Store
	st.Publish("fresh", tgi(memAt))
	st.Publish("stale", tgi(t0))
	st.Publish("expired", tgi(memAt))
	require.True(t, st.Expire("expired", 1<<telemetry.KVCachePreallocated, memAt.Add(time.Second)))
	st.Publish("custom", sample(memAt, float64(telemetry.Running), 3))
	for _, id := range []string{"fresh", "stale", "expired", "custom"} {
		st.Publish(id, mem)
	}
	now := memAt.Add(time.Second)
	load := func(id string) telemetry.Sample {
		var s telemetry.Sample
		st.Slot(id).LoadInto(&s, now, maxAge)
		return s
	}

	s := load("fresh")
	assert.True(t, s.Has.Has(telemetry.KVCachePreallocated))
	assert.True(t, s.Has.Has(telemetry.GPUMemUsed), "the memory still reaches metrics")
	_, ok := s.MemoryPressure()
	assert.False(t, ok, "fresh: priced by its memory")

	for _, id := range []string{"stale", "expired"} {
		s = load(id)
		assert.False(t, s.Has.Has(telemetry.KVCachePreallocated), id)
		assert.False(t, s.Has.Has(telemetry.GPUMemUsed) || s.Has.Has(telemetry.GPUMemTotal), "%s: memory kept", id)
		_, ok = s.MemoryPressure()
		assert.False(t, ok, "%s: priced by its memory", id)
	}

	s = load("custom")
	u, ok := s.MemoryPressure()
	assert.True(t, ok, "a server that never said it pre-allocates is priced by its memory")
	assert.Equal(t, 0.95, u)

	slot := st.Slot("stale")
	assert.Zero(t, testing.AllocsPerRun(100, func() { slot.LoadInto(&s, now, maxAge) }))
}
