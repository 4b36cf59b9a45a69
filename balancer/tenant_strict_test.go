package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A tenant whose requests break every server they reach (a poison prompt
// that crashes the engine) takes down its own shard. By default its calls
// then go to the whole group, so the poison spreads over the fleet; with
// TenantShardStrict they fail with ErrTenantShardDown and no endpoint
// outside the shard ever sees one, while other tenants are served.
func TestTenantShardStrictKeepsPoisonInTheShard(t *testing.T) {
	for _, strict := range []bool{false, true} {
		clock := testutil.NewClock()
		b := newBalancer(t, 16, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, TenantShardStrict: strict,
			Rand: testutil.NewRand(5), Clock: clock, OutlierInterval: -1, MaxEjectedFraction: 1})
		shard := shardOf(t, b, "poison")
		inShard := map[string]bool{}
		for _, id := range shard {
			inShard[id] = true
		}
		other := "" // a tenant whose shard misses the poison's
		for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			if !overlaps(shardOf(t, b, name), inShard) {
				other = name
				break
			}
		}
		require.NotEmpty(t, other)
		reached, refused := map[string]bool{}, 0
		for range 400 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "poison"})
			if err != nil {
				require.True(t, strict, "only a strict shard refuses: %v", err)
				require.ErrorIs(t, err, balancer.ErrTenantShardDown)
				require.ErrorIs(t, err, balancer.ErrNoEndpoints)
				refused++
				continue
			}
			reached[p.ID()] = true
			p.Done(inferlb.Outcome{Err: errDown}) // it broke the server
		}
		outside := 0
		for id := range reached {
			if !inShard[id] {
				outside++
			}
		}
		t.Logf("strict %v: %d of %d endpoints reached, %d outside the shard; %d calls refused", strict, len(reached), 16, outside, refused)
		if strict {
			assert.Zero(t, outside, "strict: the poison reached %d endpoints outside its shard", outside)
			assert.Greater(t, refused, 300, "strict: calls refused once the shard is down")
		} else {
			assert.Greater(t, outside, 4, "availability first: the poison spreads past its shard")
		}
		if strict { // the other tenant's shard never met the poison
			for range 20 {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: other})
				require.NoError(t, err)
				p.Done(inferlb.Outcome{})
			}
		}
	}
}

func overlaps(ids []string, set map[string]bool) bool {
	for _, id := range ids {
		if set[id] {
			return true
		}
	}
	return false
}

func TestTenantShardStrictNeedsShards(t *testing.T) {
	o := balancer.Options{TenantShardStrict: true}
	err := o.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TenantShardStrict")
	o.TenantShardSize = 2
	assert.NoError(t, o.Validate())
}
