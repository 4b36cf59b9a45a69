package balancer_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// The affinity bound shares the load on the members that can take calls
// among them. An endpoint cooling down after a 429 (or ejected, or not
// ready) takes no calls, but its own calls in flight went on counting in
// the group's load: 40 of them made a fair share of 13 of each of the three
// idle others, and a hot key piled every one of its calls on its owner.
func TestBoundIgnoresTheCallsOfMembersOutOfRotation(t *testing.T) {
	const key, calls = 0x1234567890abcdef, 12
	for _, tc := range []struct {
		name   string
		report bool // every server reports running and queued requests
	}{
		{"own calls", false},
		{"reported load", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(33)})
			home := owner(t, b, key)
			var cooled string
			for _, e := range endpoints(4) {
				if e.Key() != home {
					cooled = e.Key()
					break
				}
			}
			held := coolDownHolding(t, b, clock, cooled, 40)
			if tc.report {
				for _, e := range endpoints(4) {
					s := telemetry.Sample{Time: clock.Now()}
					s.Set(telemetry.Running, 0)
					s.Set(telemetry.Waiting, 0)
					if e.Key() == cooled {
						s.Set(telemetry.Running, 40)
					}
					b.Publish(e.Key(), s)
				}
			}
			got := ownerTakes(t, b, key, home, calls)
			t.Logf("the owner took %d of %d calls", got, calls)
			assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}))
			for i := range held {
				held[i].Done(inferlb.Outcome{})
			}
			// 12 calls over the 3 members in rotation: the plain bound is
			// ceil(1.25 x 12/3) = 5, and an unqueued owner (reported load)
			// keeps its key up to ceil(1.5 x 12/3) = 6, a roomy one (no KV
			// report here) no further.
			assert.LessOrEqual(t, got, int64(6), "the owner of a hot key took %d of its %d calls", got, calls)
		})
	}
}

// The same within a tenant's shard, whose load the bound shares among the
// shard's members in rotation.
func TestShardBoundIgnoresTheCallsOfMembersOutOfRotation(t *testing.T) {
	const calls = 12
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(34), TenantShardSize: 4})
	shard := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, 400)
	require.Len(t, shard, 4)
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", AffinityKey: 0x1234567890abcdef}
	home := spread(t, b, req, 1)
	var owner, cooled string
	for id := range home {
		owner = id
	}
	for _, id := range slices.Sorted(maps.Keys(shard)) { // the same one every run
		if id != owner {
			cooled = id
			break
		}
	}
	held := coolDownHolding(t, b, clock, cooled, 40)
	for range calls {
		p, err := b.Pick(req)
		require.NoError(t, err)
		held = append(held, p)
	}
	got := stat(t, b, owner).InFlight
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	t.Logf("the owner took %d of %d calls", got, calls)
	// 12 calls over the shard's 3 members in rotation: ceil(1.25 x 12/3) = 5.
	assert.LessOrEqual(t, got, int64(5), "the owner of a hot key took %d of its %d calls", got, calls)
}

// coolDownHolding gives id n calls and then a 429, so that it cools down
// with n calls in flight; it returns them, for the caller to finish.
func coolDownHolding(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, id string, n int) []balancer.Pick {
	t.Helper()
	serial, ok := b.Serial(id)
	require.True(t, ok)
	held := make([]balancer.Pick, 0, n)
	for range n + 1 {
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
		require.NoError(t, err)
		held = append(held, p)
	}
	held[n].Done(inferlb.Outcome{Overloaded: true}) // 429: it cools down with n calls in flight
	require.True(t, stat(t, b, id).ExcludedUntil.After(clock.Now()))
	return held[:n:n]
}
