package balancer_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An endpoint joining changes only the shards it enters, each by one member
// (it takes the place of the member a walk of the tenant's met after it),
// and leaves every other tenant's shard as it was (Options.TenantShardSize:
// each member of a shard is the first on the ring from one of the tenant's
// keys that the shard does not hold yet).
func TestTenantShardJoinMovesOnlyTheShardsItEnters(t *testing.T) {
	t.Parallel()
	b := sharded(t, 16, 4)
	before := map[string][]string{}
	for i := range 100 {
		tenant := fmt.Sprintf("t%d", i)
		before[tenant] = shardOf(t, b, tenant)
	}
	eps := append(endpoints(17)[16:], endpoints(16)...) // one more, listed first
	joiner := eps[0].Key()
	require.NoError(t, b.Update(eps))
	changed := 0
	for tenant, was := range before {
		now := shardOf(t, b, tenant)
		if slices.Equal(was, now) {
			continue
		}
		changed++
		require.Contains(t, now, joiner, "%s's shard changed without the joiner: %v -> %v", tenant, was, now)
		kept := 0
		for _, id := range now {
			if slices.Contains(was, id) {
				kept++
			}
		}
		require.Equal(t, 3, kept, "%s: %v -> %v", tenant, was, now)
	}
	// About k/n of the shards take the joiner.
	assert.Positive(t, changed)
	assert.Less(t, changed, 45, "shards changed")
}

// A tenant name is request data: a huge one, or one with NUL, invalid UTF-8
// or spaces, still has one shard of k endpoints, the same in another process
// with the same seed and endpoints in another order; an empty one names no
// tenant and is not sharded.
func TestTenantShardOddNames(t *testing.T) {
	huge := strings.Repeat("x\x00\xff", 1<<18)
	for _, tenant := range []string{huge, "\x00", "\xff\xfe", "a b", " "} {
		got := shardOf(t, sharded(t, 16, 4), tenant)
		require.Len(t, got, 4)
		eps := endpoints(16)
		slices.Reverse(eps)
		other := balancer.New(balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Rand: testutil.NewRand(77)})
		require.NoError(t, other.Update(eps))
		require.Equal(t, got, shardOf(t, other, tenant), "%.20q", tenant)
	}
	assert.Len(t, spread(t, sharded(t, 16, 4), &inferlb.Request{Tenant: ""}, 2000), 16, "no tenant: the whole fleet")
}

// The subset label is a comma-separated list: names are trimmed, empty ones
// ignored, and a name listed twice puts the endpoint in its model's group
// once (at its weight, not twice it). A model nobody lists, with no
// unlabelled endpoint, has none; a request that names no model has all.
func TestModelLabelListsAreTrimmedAndDeduplicated(t *testing.T) {
	b := balancer.New(balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(3)})
	eps := endpoints(3)
	eps[0].Labels = map[string]string{"model": "a, a,b"}
	eps[1].Labels = map[string]string{"model": " a "}
	eps[2].Labels = map[string]string{"model": "b,,c"}
	require.NoError(t, b.Update(eps))
	got := spread(t, b, &inferlb.Request{Model: "a"}, 4000)
	require.Len(t, got, 2)
	assert.InDelta(t, 2000, got[eps[0].Addr], 200, "listed twice, picked as once: %v", got)
	assert.Len(t, spread(t, b, &inferlb.Request{Model: "b"}, 400), 2)
	assert.Equal(t, map[string]int{eps[2].Addr: 400}, spread(t, b, &inferlb.Request{Model: "c"}, 400))
	_, err := b.Pick(&inferlb.Request{Model: "nobody-lists-it"})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.Len(t, spread(t, b, &inferlb.Request{}, 400), 3)
}

// An Update that takes a model off every endpoint (and one endpoint away)
// while that model's calls are in flight: the model has no endpoint from
// then on, the calls' Done (twice each) after the Update counts each once,
// and the endpoints that stay carry no phantom load.
func TestUpdateRemovingAModelWithItsCallsInFlight(t *testing.T) {
	b := balancer.New(balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(3), TenantShardSize: 2})
	eps := endpoints(4)
	for i := range eps {
		eps[i].Labels = map[string]string{"model": "a,b"}
	}
	require.NoError(t, b.Update(eps))
	var held []balancer.Pick
	for i := range 40 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "a", Tenant: fmt.Sprint("t", i%3), AffinityKey: uint64(i%5) + 1})
		require.NoError(t, err)
		held = append(held, p)
	}
	for i := range eps {
		eps[i].Labels = map[string]string{"model": "b"}
	}
	require.NoError(t, b.Update(eps[:3]))
	_, err := b.Pick(&inferlb.Request{Model: "a"})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	for _, p := range held {
		p.Done(inferlb.Outcome{})
		p.Done(inferlb.Outcome{})
	}
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight, s.ID)
	}
	assert.Len(t, spread(t, b, &inferlb.Request{Model: "b"}, 300), 3)
}

// A strict tenant's shard that is down fails its calls, first picks and
// retries alike, with ErrTenantShardDown, and serves them again once back.
func TestTenantShardStrictDownAndBack(t *testing.T) {
	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, TenantShardSize: 2, TenantShardStrict: true, Rand: testutil.NewRand(5)})
	shard := shardOf(t, b, "acme")
	for _, id := range shard {
		require.True(t, b.SetReady(id, false))
	}
	_, err := b.Pick(&inferlb.Request{Tenant: "acme"})
	require.ErrorIs(t, err, balancer.ErrTenantShardDown)
	_, err = b.PickRetry(&inferlb.Request{Tenant: "acme"}, shard[0])
	require.ErrorIs(t, err, balancer.ErrTenantShardDown)
	for _, id := range shard {
		require.True(t, b.SetReady(id, true))
	}
	assert.Equal(t, shard, shardOf(t, b, "acme"))
}
