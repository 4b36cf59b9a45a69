package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// slotFullSpec is slotFull as it was written first, one running name
// hashed per adapter in flight: the adapters running in the reading, and
// this process's adapters in flight there that the reading has not
// running, counted once each, against the slots.
func slotFullSpec(a *telemetry.Adapters, slots float64, flights []uint64, model string, h, seed uint64) bool {
	if model == a.Base || slices.Contains(a.Running, model) {
		return false
	}
	used := len(a.Running)
	var seen []uint64
	for _, w := range flights {
		if uint32(w) == 0 {
			continue
		}
		tag := loraTag(w)
		switch {
		case tag == loraTag(h):
			return false
		case slices.Contains(seen, tag):
		default:
			ran := false
			for _, n := range a.Running {
				ran = ran || loraTag(adapterID(n, seed)) == tag
			}
			if !ran {
				seen = append(seen, tag)
				used++
			}
		}
	}
	return float64(used) >= slots
}

// slotFull hashes each running name once, not once per adapter in flight
// (8 us a pick with 64 running and 8 in flight), and answers as before:
// random readings, adapters in flight (the same adapter in two entries
// too) and calls, against slotFullSpec.
func TestSlotFullCountsAsBefore(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	e := b.def.members[0]
	seed := b.adapters.seed
	names := make([]string, 24)
	for i := range names {
		names[i] = fmt.Sprintf("adapter-%d", i)
	}
	rng := rand.New(rand.NewPCG(4, 4))
	full, notFull := 0, 0
	for trial := range 3000 {
		running := make([]string, rng.IntN(12))
		for i := range running {
			running[i] = names[rng.IntN(len(names))]
		}
		a := &telemetry.Adapters{Base: "base", Running: running}
		slots := float64(1 + rng.IntN(14))
		s := telemetry.Sample{Time: clock.Now()}
		require.True(t, s.SetAdapters(slots, a))
		b.Publish("a:1", s)
		flights := make([]uint64, loraFlights)
		for i := range flights {
			if rng.IntN(3) > 0 {
				flights[i] = loraTag(adapterID(names[rng.IntN(len(names))], seed)) | uint64(1+rng.IntN(3))
			}
			e.lora[i].Store(flights[i])
		}
		model := names[rng.IntN(len(names))]
		if trial%50 == 0 {
			model = "base"
		}
		h := adapterID(model, seed)
		want := slotFullSpec(a, slots, flights, model, h, seed)
		require.Equal(t, want, e.slotFull(model, h, seed, clock.Now().UnixNano(), b.cfg.telemetryMaxAge), "trial %d: running %v, slots %v, in flight %x, model %s", trial, running, slots, flights, model)
		if want {
			full++
		} else {
			notFull++
		}
		clock.Advance(1e6)
	}
	require.Greater(t, full, 300)
	require.Greater(t, notFull, 300)
}
