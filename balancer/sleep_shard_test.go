package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A tenant's shard whose endpoints all sleep, in a group whose other
// endpoints are awake: the tenant's calls go to the awake endpoints of the
// group, as when nothing in the shard can take them, instead of waiting
// on a sleeping server until it is woken (or failing, on older vLLM).
// A strict shard keeps them, on its sleeping endpoints, as a fleet all
// asleep does; and with the whole group asleep, so does any shard.
func TestSleepingTenantShardGoesToTheGroup(t *testing.T) {
	eps := endpoints(8)
	for _, tc := range []struct {
		name string
		svc  inferlb.Service
		keys bool
	}{
		{"two choices", inferlb.ServiceLLM, false},
		{"keyed", inferlb.ServiceLLM, true},
		{"full scan", inferlb.ServiceEmbedding, false},
	} {
		for _, strict := range []bool{false, true} {
			t.Run(tc.name, func(t *testing.T) {
				clock := testutil.NewClock()
				b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(11),
					TenantShardSize: 2, TenantShardStrict: strict})
				req := inferlb.Request{Service: tc.svc, Tenant: "acme"}
				shard := countPicks(t, b, req, 200, tc.keys)
				require.Len(t, shard, 2, "the tenant's shard")
				asleep := make([]bool, len(eps))
				for i, ep := range eps {
					asleep[i] = shard[ep.Addr] > 0
				}
				publishSleep(b, clock, asleep...)
				c := countPicks(t, b, req, 400, tc.keys)
				t.Logf("strict %v, shard asleep: %v", strict, c)
				inShard := 0
				for id, n := range c {
					if shard[id] > 0 {
						inShard += n
					}
				}
				if strict {
					assert.Equal(t, 400, inShard, "a strict shard's calls left it")
				} else {
					assert.Zero(t, inShard, "calls went to the sleeping shard while awake endpoints were idle")
				}

				// The whole group asleep: the calls stay in the shard.
				publishSleep(b, clock, true, true, true, true, true, true, true, true)
				c = countPicks(t, b, req, 100, tc.keys)
				for id := range c {
					assert.Positive(t, shard[id], "with every endpoint asleep, a call left the shard for %s", id)
				}
			})
		}
	}
}
