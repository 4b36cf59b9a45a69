package balancer_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// In a large group with a small shard, a tenant's affinity key still has one
// owner inside the shard, and independent callers agree on it, however far
// along the key's ring walk the shard's members first appear.
func TestTenantShardKeyOwnerInLargeGroup(t *testing.T) {
	const n, k = 512, 2
	opts := func(r uint64) balancer.Options {
		return balancer.Options{AffinitySeed: seed, TenantShardSize: k, MinKeyReuse: -1, Rand: testutil.NewRand(r)}
	}
	a := balancer.New(opts(1))
	require.NoError(t, a.Update(endpoints(n)))
	eps := endpoints(n)
	slices.Reverse(eps)
	b := balancer.New(opts(2))
	require.NoError(t, b.Update(eps))
	rng := rand.New(rand.NewPCG(7, 8))
	bad := 0
	for i := range 400 {
		req := inferlb.Request{Service: inferlb.ServiceLLM, Tenant: fmt.Sprintf("t%d", i%10), AffinityKey: rng.Uint64() | 1}
		ga, gb := spread(t, a, &req, 4), spread(t, b, &req, 4)
		if len(ga) != 1 || len(gb) != 1 || fmt.Sprint(ga) != fmt.Sprint(gb) {
			bad++
		}
	}
	require.Zero(t, bad, "keys without one agreed owner in their tenant's shard")
}

// Inside a tenant's shard the affinity bound is the shard's: a tenant busier
// than the rest of the fleet (the others idle) keeps its keys on their owners
// in its shard, as it would on a fleet of just those endpoints, instead of
// finding every shard member over its fair share of the whole group's load
// and scattering its keys over the shard by P2C.
func TestTenantShardBoundIsTheShards(t *testing.T) {
	b := balancer.New(balancer.Options{AffinitySeed: seed, TenantShardSize: 4, MinKeyReuse: -1, Rand: testutil.NewRand(1)})
	require.NoError(t, b.Update(endpoints(64)))
	const keys, rounds = 32, 3
	key := func(k int) uint64 { return uint64(k+1) * 0x9e3779b97f4a7c15 }
	req := func(k int) *inferlb.Request {
		return &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", AffinityKey: key(k)}
	}
	home := make([]string, keys)
	for k := range keys {
		p, err := b.Pick(req(k))
		require.NoError(t, err)
		home[k] = p.ID()
		p.Done(inferlb.Outcome{})
	}
	var held []balancer.Pick
	atHome := 0
	for range rounds {
		for k := range keys {
			p, err := b.Pick(req(k))
			require.NoError(t, err)
			if p.ID() == home[k] {
				atHome++
			}
			held = append(held, p)
		}
	}
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	// 3 calls of each of 32 keys on a shard of 4: the owners hold about
	// 24 each, within 1.25x of the shard's mean. Bounded by the group's
	// mean (1.5 calls), about a quarter (chance in a shard of 4) went home.
	require.GreaterOrEqual(t, atHome, keys*rounds*8/10, "calls at their key's owner in the shard")
}
