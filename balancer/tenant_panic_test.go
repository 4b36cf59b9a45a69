package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestTenantFloodDoesNotPanicQuietShards: one tenant's flood cools its
// whole shard (4 of a model's 6 replicas), which puts the group in panic
// routing (2 in good standing, under half). The flood's calls never leave
// its shard, so the group's panic says nothing about another tenant's
// shard: one with 2 of its 4 members in good standing (not itself in panic)
// kept sending half its calls to the flooded, cooling replicas, where they
// were refused as the flood's are. Its calls go to its members in good
// standing; a shard with one of 4 in good standing is in panic itself and
// still spreads over its members, as is a call that names no tenant over
// the group.
func TestTenantFloodDoesNotPanicQuietShards(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 6, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, Rand: testutil.NewRand(5), Clock: clock, OutlierInterval: -1})
	flood := shardOf(t, b, "flood")
	require.Len(t, flood, 4)
	cooling := map[string]bool{}
	for _, id := range flood {
		cooling[id] = true
	}
	// Tenants by how many of their shard's members the flood leaves in
	// good standing, shards drawn before the flood.
	byGood := map[int]string{}
	for i := 0; i < 200 && (byGood[1] == "" || byGood[2] == ""); i++ {
		tenant := fmt.Sprintf("q%d", i)
		good := 0
		for _, id := range shardOf(t, b, tenant) {
			if !cooling[id] {
				good++
			}
		}
		if byGood[good] == "" {
			byGood[good] = tenant
		}
	}
	require.NotEmpty(t, byGood[1])
	require.NotEmpty(t, byGood[2])

	for range 100 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "flood"})
		require.NoError(t, err)
		require.True(t, cooling[p.ID()], "the flood left its shard: %s", p.ID())
		p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: 5 * time.Second})
		clock.Advance(10 * time.Millisecond)
	}
	for _, s := range b.Stats() {
		require.Equal(t, cooling[s.ID], !s.ExcludedUntil.IsZero(), "%s", s.ID)
	}

	toCooling := func(req *inferlb.Request) (n int) {
		for id, c := range spread(t, b, req, 200) {
			if cooling[id] {
				n += c
			}
		}
		return n
	}
	assert.Zero(t, toCooling(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: byGood[2]}),
		"%s's shard has 2 of 4 in good standing", byGood[2])
	assert.Positive(t, toCooling(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: byGood[1]}),
		"%s's shard (1 of 4 in good standing) is in panic", byGood[1])
	assert.Positive(t, toCooling(&inferlb.Request{Service: inferlb.ServiceLLM}), "the group is in panic")
	assert.Equal(t, 200, toCooling(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "flood"}), "the flood stays in its shard")
}
