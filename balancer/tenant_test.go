package balancer_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

func sharded(t testing.TB, n, k int) *balancer.Balancer {
	t.Helper()
	return newBalancer(t, n, balancer.Options{AffinitySeed: seed, TenantShardSize: k, Rand: testutil.NewRand(5)})
}

func shardOf(t *testing.T, b *balancer.Balancer, tenant string) []string {
	t.Helper()
	return slices.Sorted(maps.Keys(spread(t, b, &inferlb.Request{Tenant: tenant}, 400)))
}

func TestTenantShardConfinesATenant(t *testing.T) {
	b := sharded(t, 16, 4)
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, 4000)
	require.Len(t, got, 4, "a tenant reaches only its shard: %v", got)
	for id, n := range got {
		assert.Greater(t, n, 500, "P2C spreads the tenant over its shard (%s)", id)
	}
	// Without a tenant, or with sharding off, the whole fleet serves.
	assert.Len(t, spread(t, b, &inferlb.Request{}, 4000), 16)
	assert.Len(t, spread(t, newBalancer(t, 16, balancer.Options{}), &inferlb.Request{Tenant: "acme"}, 4000), 16)

	// Tenants get different shards, and together they cover the fleet.
	all := map[string]bool{}
	shards := map[string]bool{}
	for i := range 40 {
		s := shardOf(t, b, fmt.Sprintf("tenant-%d", i))
		require.Len(t, s, 4)
		shards[fmt.Sprint(s)] = true
		for _, id := range s {
			all[id] = true
		}
	}
	assert.Len(t, all, 16)
	assert.Greater(t, len(shards), 30, "40 tenants rarely share a whole shard")
}

// Tenant sharding does not depend on affinity: with Affinity off a tenant
// is still confined to its shard (the same one), and affinity keys still
// do not steer picks.
func TestTenantShardWithAffinityOff(t *testing.T) {
	opts := balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Affinity: balancer.AffinityOff, Rand: testutil.NewRand(5)}
	off := newBalancer(t, 16, opts)
	got := spread(t, off, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, 4000)
	require.Len(t, got, 4, "a tenant reaches only its shard: %v", got)
	assert.Equal(t, shardOf(t, sharded(t, 16, 4), "acme"), shardOf(t, off, "acme"), "the same shard as with affinity on")
	keyed := spread(t, off, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 0x1234567890abcdef}, 400)
	assert.Greater(t, len(keyed), 8, "affinity off: a key does not pin its calls: %v", keyed)
}

func TestTenantShardsAgreeAndMoveLittle(t *testing.T) {
	a := sharded(t, 16, 4)
	// Another process: the same endpoints in another order, its own rand.
	eps := endpoints(16)
	slices.Reverse(eps)
	b := balancer.New(balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Rand: testutil.NewRand(99)})
	require.NoError(t, b.Update(eps))
	for i := range 20 {
		tenant := fmt.Sprintf("t%d", i)
		assert.Equal(t, shardOf(t, a, tenant), shardOf(t, b, tenant), tenant)
	}

	// An endpoint leaving changes only the shards it was in, by one member.
	before := shardOf(t, a, "acme")
	outside := ""
	for _, ep := range endpoints(16) {
		if !slices.Contains(before, ep.Key()) {
			outside = ep.Key()
			break
		}
	}
	without := func(id string) []inferlb.Endpoint {
		return slices.DeleteFunc(endpoints(16), func(e inferlb.Endpoint) bool { return e.Key() == id })
	}
	require.NoError(t, a.Update(without(outside)))
	assert.Equal(t, before, shardOf(t, a, "acme"), "a member outside the shard left")
	require.NoError(t, a.Update(without(before[0])))
	after := shardOf(t, a, "acme")
	require.Len(t, after, 4)
	kept := 0
	for _, id := range after {
		if slices.Contains(before, id) {
			kept++
		}
	}
	assert.Equal(t, 3, kept, "one shard member left, one replaced it: %v -> %v", before, after)
}

func TestTenantShardKeepsAffinityInside(t *testing.T) {
	b := sharded(t, 16, 4)
	shard := shardOf(t, b, "acme")
	owners := map[string]bool{}
	for key := range uint64(64) {
		req := inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", AffinityKey: key*0x9e3779b97f4a7c15 | 1}
		got := spread(t, b, &req, 5)
		require.Len(t, got, 1, "one key, one endpoint")
		for id := range got {
			assert.Contains(t, shard, id, "the key's owner is in the tenant's shard")
			owners[id] = true
		}
	}
	assert.Len(t, owners, 4, "the tenant's keys spread over its shard")
}

func TestTenantShardFallsBackWhenTheShardIsDown(t *testing.T) {
	b := sharded(t, 8, 2)
	shard := shardOf(t, b, "acme")
	for _, id := range shard {
		require.True(t, b.SetReady(id, false))
	}
	got := spread(t, b, &inferlb.Request{Tenant: "acme", AffinityKey: 7}, 200)
	for _, id := range shard {
		assert.Zero(t, got[id])
	}
	assert.NotEmpty(t, got, "availability first: the rest of the fleet serves")
}

func TestTenantShardPickDoesNotAllocate(t *testing.T) {
	b := sharded(t, 64, 8)
	reqs := []inferlb.Request{
		{Service: inferlb.ServiceLLM, Tenant: "acme"},
		{Service: inferlb.ServiceLLM, Tenant: "acme", AffinityKey: 12345},
	}
	for _, req := range reqs {
		allocs := testing.AllocsPerRun(500, func() {
			p, err := b.Pick(&req)
			if err != nil {
				t.Fatal(err)
			}
			p.Done(inferlb.Outcome{})
		})
		assert.Zero(t, allocs)
	}
	for _, k := range []int{-1, balancer.MaxTenantShard + 1} {
		err := (&balancer.Options{TenantShardSize: k}).Validate()
		assert.ErrorContains(t, err, "TenantShardSize")
	}
}
