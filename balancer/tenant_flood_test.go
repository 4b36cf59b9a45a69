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

// TestTenantFloodStaysInItsShard: a tenant flooding its shard until every
// endpoint of it answers "overloaded" (and cools down for its Retry-After)
// must not spread the flood over the fleet: the group then took its
// calls, and they reached 9 of 16 endpoints, cooling down 5 outside the
// shard (other tenants' shards), until the group itself was in panic. The calls stay in the shard, routed across its cooling endpoints
// as panic routing does; another tenant's calls never meet the flood.
// A shard that is down (breakers open) still falls back to the group
// (TestTenantShardFallsBackWhenTheShardIsDown: not ready).
func TestTenantFloodStaysInItsShard(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 16, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Rand: testutil.NewRand(5), Clock: clock, OutlierInterval: -1})
	shard := shardOf(t, b, "flood")
	require.Len(t, shard, 4)
	inShard := map[string]bool{}
	for _, id := range shard {
		inShard[id] = true
	}
	reached := map[string]int{}
	for range 400 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "flood"})
		require.NoError(t, err)
		reached[p.ID()]++
		// Its own shard's servers are saturated by it: each call is refused.
		p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: 5 * time.Second})
		clock.Advance(10 * time.Millisecond)
	}
	for id := range reached {
		assert.True(t, inShard[id], "the flood reached %s, outside its shard %v (%d endpoints in all)", id, shard, len(reached))
	}
	// A quiet tenant whose shard does not overlap the flood's is served
	// by endpoints in good standing.
	for _, s := range b.Stats() {
		if !inShard[s.ID] {
			assert.True(t, s.ExcludedUntil.IsZero(), "%s cooled down", s.ID)
		}
	}

	// With breakers open instead (the shard is down, not busy), the
	// tenant goes to the group.
	b = newBalancer(t, 16, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Rand: testutil.NewRand(5), Clock: clock, OutlierInterval: -1, MaxEjectedFraction: 1})
	for range 400 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "flood"})
		require.NoError(t, err)
		if inShard[p.ID()] {
			p.Done(inferlb.Outcome{Err: errDown})
		} else {
			p.Done(inferlb.Outcome{})
		}
	}
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "flood"}, 200)
	for _, id := range shard {
		assert.Zero(t, got[id], "a shard that is down is left for the group")
	}
}
