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

// PickAt (a Responses API follow-up sent where the response it continues
// was made) sent a tenant's call to the endpoint it named whatever the
// tenant's shard: with TenantShardStrict, a follow-up naming a response
// made outside the shard (another tenant's, or one made before the shard
// moved) reached an endpoint the tenant's calls must never reach. A strict
// shard keeps it: the call is picked in the shard. Without Strict the pin
// is kept (availability first: the stored response is there).
func TestTenantShardStrictHoldsPickAt(t *testing.T) {
	for _, strict := range []bool{false, true} {
		b := newBalancer(t, 16, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, TenantShardStrict: strict,
			Rand: testutil.NewRand(5), Clock: testutil.NewClock()})
		inShard := map[string]bool{}
		for _, id := range shardOf(t, b, "acme") {
			inShard[id] = true
		}
		outside := 0
		for serial := uint64(1); serial <= 16; serial++ {
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, serial)
			require.NoError(t, err)
			if !inShard[p.ID()] {
				outside++
			}
			if strict {
				assert.True(t, inShard[p.ID()], "strict: PickAt(%d) went to %s, outside the tenant's shard", serial, p.ID())
			} else if inShard[p.ID()] {
				assert.EqualValues(t, serial, p.Serial(), "the pinned endpoint, in the shard")
			}
			p.Done(inferlb.Outcome{})
		}
		if !strict {
			assert.Equal(t, 12, outside, "without Strict, each pin is kept")
		}
		// A pin inside the shard still holds.
		for _, id := range shardOf(t, b, "acme") {
			serial := uint64(0)
			for s := uint64(1); s <= 16; s++ {
				p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, s)
				require.NoError(t, err)
				if p.ID() == id {
					serial = s
				}
				p.Done(inferlb.Outcome{})
			}
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, serial)
			require.NoError(t, err)
			assert.Equal(t, id, p.ID())
			p.Done(inferlb.Outcome{})
		}
	}
}

// A strict tenant's retry whose shard is down goes nowhere (its calls never
// leave the shard), so it must not spend the retry budget that every other
// tenant's failovers share: endpoints outside the shard could take a retry,
// but not this one. A poison tenant that took its shard down would
// otherwise drain the budget with retries that all fail.
func TestTenantShardStrictRetrySpendsNothingWhenTheShardIsDown(t *testing.T) {
	b := newBalancer(t, 16, balancer.Options{AffinitySeed: seed, TenantShardSize: 4, TenantShardStrict: true,
		Rand: testutil.NewRand(5), Clock: testutil.NewClock(), OutlierInterval: -1})
	shard := shardOf(t, b, "poison")
	require.Len(t, shard, 4)
	for _, id := range shard {
		require.True(t, b.SetReady(id, false))
	}
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "poison"}
	for range 50 {
		_, err := b.PickRetry(req, shard[0])
		require.ErrorIs(t, err, balancer.ErrTenantShardDown)
	}
	assert.Equal(t, balancer.RetryStats{}, b.RetryStats(), "retries that could go nowhere spent the budget")
}
