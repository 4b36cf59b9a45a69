package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A sleeping member takes no affinity call, but its weight went on
// counting in the fair share of the group's load: with 6 of 8 replicas
// asleep (a reinforcement-learning loop between rollouts), each awake
// member's bound was a quarter of what it carried, and the keys it owns
// spilled to the other awake member or to two choices, each to a cold
// cache. Sleepers now share none of the load, as members out of rotation.
func TestSleepersDoNotShrinkTheAwakeMembersBound(t *testing.T) {
	const n, calls = 8, 40
	for _, tc := range []struct {
		name   string
		report bool // the awake servers report running and queued requests
	}{
		{"own calls", false},
		{"reported load", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The same calls on a fleet of the two awake members alone: what
			// the bound lets their owners keep.
			alone := homeCalls(t, 2, tc.report, calls)
			got := homeCalls(t, n, tc.report, calls)
			t.Logf("of %d keys owned by awake members, %d stayed home with 6 asleep, %d with the 2 alone", calls, got, alone)
			assert.GreaterOrEqual(t, got, alone, "sleepers shrank the awake owners' bound")
		})
	}
}

// homeCalls holds calls keyed calls at once on a fleet of n endpoints of
// which all but the first two sleep, each key owned by one of those two
// on a ring of 8, and returns how many went to their owner.
func homeCalls(t *testing.T, n int, report bool, calls int) int {
	t.Helper()
	clock := testutil.NewClock()
	b := affine(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(3)})
	for i, e := range endpoints(n) {
		s := telemetry.Sample{Time: clock.Now()}
		if i < 2 { // awake
			if !report {
				continue
			}
			s.Set(telemetry.Running, 3)
			s.Set(telemetry.Waiting, 0)
			s.Set(telemetry.Asleep, 0)
		} else {
			s.Set(telemetry.Running, 0)
			s.Set(telemetry.Waiting, 0)
			s.Set(telemetry.Asleep, 1)
		}
		b.Publish(e.Key(), s)
	}
	ms := make([]cache.Member, 8)
	for i, e := range endpoints(8) {
		ms[i] = cache.Member{ID: e.Key(), Weight: 1}
	}
	ring := cache.NewPlacement(ms, seed)
	var held []balancer.Pick
	home := 0
	for k := uint64(1); len(held) < calls; k++ {
		key := k * 0x9e3779b97f4a7c15
		w := ring.Walk(key)
		if o, _ := w.Next(); o < 2 { // owned by an awake member; a sleeper's keys spill by design
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
			require.NoError(t, err)
			held = append(held, p)
			if p.ID() == ms[o].ID {
				home++
			}
		}
	}
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	return home
}
