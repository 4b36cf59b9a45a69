package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A ramping endpoint takes spills of affinity keys only in proportion to
// its ramp, as it takes its own keys and P2C's draws. Idle next to a busy
// owner, it won every spill it was a candidate for (a third of a loaded
// owner's spills on a fleet of four, at a tenth of its weight), so slow
// start did nothing for keyed traffic just when keys spill: under load.
func TestRampingEndpointTakesSpillsInProportionToItsRamp(t *testing.T) {
	clock := testutil.NewClock()
	b, eps := rampingFourth(t, balancer.Options{Clock: clock, Rand: testutil.NewRand(31)})
	joiner := eps[3].Addr
	plain := affine(t, 4, balancer.Options{}) // the owners, on a fleet that does not ramp

	// 20 calls in flight put an old member far past its bound (a fair
	// share of about 5 on an otherwise idle fleet): its keys spill.
	home := eps[0].Addr
	serial, ok := b.Serial(home)
	require.True(t, ok)
	var held []balancer.Pick
	for range 20 {
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
		require.NoError(t, err)
		held = append(held, p)
	}
	const keys = 600
	got := map[string]int{}
	for k, n := uint64(1), 0; n < keys; k++ {
		key := k * 0x9e3779b97f4a7c15
		if owner(t, plain, key) != home {
			continue
		}
		n++
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
		require.NoError(t, err)
		got[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	require.Zero(t, got[home], "the owner is past its bound: every key spills")
	share := float64(got[joiner]) / keys
	t.Logf("spills: %v; the joiner's share %.3f", got, share)
	// Its fair share of these spills is a third; ramping at 0.1, about a
	// tenth of that.
	assert.Less(t, share, 0.1, "a ramping endpoint takes spills in proportion to its ramp")
	assert.Positive(t, got[joiner], "but it takes some")
}

// The same for the keys a slow owner hands to a faster neighbour: a
// neighbour back from an outage remembers its decode speed, and took
// every key it was the first faster endpoint for, at its minimum weight.
func TestRampingEndpointTakesSlowOwnersKeysInProportionToItsRamp(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(32)})
	eps := endpoints(4)
	slow, back := eps[0].Addr, eps[1].Addr
	for _, ep := range eps { // every endpoint learns its speed from one streamed call
		s, ok := b.Serial(ep.Addr)
		require.True(t, ok)
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, s)
		require.NoError(t, err)
		if ep.Addr == slow {
			decodeAt(p, 40*time.Millisecond)
		} else {
			decodeAt(p, 10*time.Millisecond)
		}
	}
	require.True(t, b.SetReady(back, false))
	require.True(t, b.SetReady(back, true)) // back from an outage: it ramps
	require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, back).RampFactor, 1e-9)

	plain := affine(t, 4, balancer.Options{})
	const keys = 600
	got := map[string]int{}
	for k, n := uint64(1), 0; n < keys; k++ {
		key := k * 0x9e3779b97f4a7c15
		if owner(t, plain, key) != slow {
			continue
		}
		n++
		got[owner(t, b, key)]++
	}
	share := float64(got[back]) / float64(keys-got[slow])
	t.Logf("keys: %v; the ramping endpoint's share of those moved %.3f", got, share)
	require.Less(t, got[slow], keys/4, "the slow owner hands most of its keys on")
	// Its fair share of them is a third; ramping at 0.1, about a tenth.
	assert.Less(t, share, 0.1, "a ramping endpoint takes them in proportion to its ramp")
}

// rampingFourth is an affinity Balancer of three endpoints serving when a
// fourth, eps[3], joins: it starts its slow start at DefaultSlowStartMin.
func rampingFourth(t *testing.T, o balancer.Options) (*balancer.Balancer, []inferlb.Endpoint) {
	t.Helper()
	b := affine(t, 3, o)
	eps := endpoints(4)
	require.NoError(t, b.Update(eps))
	require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, eps[3].Addr).RampFactor, 1e-9)
	return b, eps
}

// A sticky key (StickyTTL) takes its endpoint's ramp into account as the
// key's owner does: an endpoint back from an outage, to which many idle
// sessions were stuck, took every one of them again from the first call
// of its slow start, which affinity traffic must not bypass.
func TestStickyKeysComeBackToARampingEndpointInProportionToItsRamp(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(33), StickyTTL: 10 * time.Minute})
	back := endpoints(4)[0].Addr
	const keys = 400
	var stuck []uint64 // keys whose sessions stick to back
	for k := uint64(1); len(stuck) < keys; k++ {
		key := k * 0x9e3779b97f4a7c15
		if owner(t, b, key) == back {
			stuck = append(stuck, key)
		}
	}
	require.True(t, b.SetReady(back, false))
	require.True(t, b.SetReady(back, true)) // back from an outage: it ramps
	require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, back).RampFactor, 1e-9)
	got := 0
	for _, key := range stuck {
		if owner(t, b, key) == back {
			got++
		}
	}
	share := float64(got) / keys
	t.Logf("%d of %d sticky keys back on the ramping endpoint (%.3f)", got, keys, share)
	// Ramping at 0.1: the sticky draw, then the walk's own draw for the
	// keys' owner, about 0.19 of them.
	assert.Less(t, share, 0.25, "a ramping endpoint takes its sticky keys in proportion to its ramp")
	assert.Positive(t, got, "but it takes some")
}
