package balancer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// Shuffle sharding's promise is combinatorial: with shards of k among n
// endpoints, two tenants share a whole shard about once in C(n, k) pairs,
// so a tenant that floods (or, with TenantShardStrict, breaks) its shard
// leaves nearly every other tenant an endpoint it does not reach. Shards
// taken as the first k endpoints clockwise from one point on the ring
// were as alike as the points: two tenants whose keys fell on the same
// arc, about 2 pairs in 100n, had the same shard whatever k (100
// endpoints, shards of 5: 416 of 2M pairs of tenants shared a whole
// shard, where random shards of 5 share one in 75 million pairs, and 864
// shared 4 or 5 members, against 13).
func TestTenantShardsOverlapAsShuffleShardsDo(t *testing.T) {
	const n, k, tenants = 100, 5, 2000
	b := New(Options{AffinitySeed: 0x5eed, TenantShardSize: k})
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("ep-%d", i)}
	}
	require.NoError(t, b.Update(eps))
	g := b.def.snap.Load().groupFor("")
	shards := make([][]int32, tenants)
	for i := range shards {
		var sh shard
		require.True(t, b.tenantShard(&inferlb.Request{Tenant: fmt.Sprintf("tenant-%d", i)}, g, &sh))
		require.Equal(t, k, sh.n)
		shards[i] = slices.Clone(sh.members[:sh.n])
	}
	whole, most := 0, 0
	for i := range shards {
		for j := i + 1; j < len(shards); j++ {
			shared := 0
			for _, m := range shards[i] {
				if slices.Contains(shards[j], m) {
					shared++
				}
			}
			if shared == k {
				whole++
			}
			if shared >= k-1 {
				most++
			}
		}
	}
	t.Logf("whole %d, all but one %d", whole, most)
	// Random shards: 0.03 and 13 expected.
	require.LessOrEqual(t, whole, 2, "pairs of tenants with the same shard")
	require.LessOrEqual(t, most, 40, "pairs of tenants sharing all but one member")
}
