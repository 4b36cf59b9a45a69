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
