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

// Independent callers agree whatever their history: a Balancer that saw
// endpoints come and go in its own sequence, and lists the final weighted
// set in another order, places every key and tenant shard as one that was
// given the set once, and (strict) spills each key to the same endpoint.
// Slow start is off: a joiner's ramp is the one documented divergence.
func TestIndependentBalancersAgreeWhateverTheirHistory(t *testing.T) {
	eps := endpoints(24)
	for i := range eps {
		eps[i].Weight = float64(1 + i%4)
		eps[i].Labels = map[string]string{"model": "m"}
	}
	for _, mode := range []balancer.AffinityMode{balancer.AffinityStrict, balancer.AffinityPrefer} {
		opts := func(r uint64) balancer.Options {
			return balancer.Options{AffinitySeed: seed, TenantShardSize: 5, MinKeyReuse: -1,
				Rand: testutil.NewRand(r), SlowStartWindow: -1, Affinity: mode}
		}
		a := balancer.New(opts(1))
		require.NoError(t, a.Update(eps))
		b := balancer.New(opts(2))
		rng := rand.New(rand.NewPCG(1, 1))
		for range 10 {
			sub := slices.Clone(eps)
			rng.Shuffle(len(sub), func(i, j int) { sub[i], sub[j] = sub[j], sub[i] })
			sub = sub[:rng.IntN(len(sub))+1]
			extra := endpoints(40)[24+rng.IntN(16):]
			require.NoError(t, b.Update(append(sub, extra...)))
		}
		rev := slices.Clone(eps)
		slices.Reverse(rev)
		require.NoError(t, b.Update(rev))
		for k := range 2000 {
			req := inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", AffinityKey: rng.Uint64() | 1}
			if k%2 == 0 {
				req.Tenant = fmt.Sprint("t", k%50)
			}
			pa, err := a.Pick(&req)
			require.NoError(t, err)
			pb, err := b.Pick(&req)
			require.NoError(t, err)
			require.Equal(t, pa.ID(), pb.ID(), "%v: owner of key %x (tenant %q)", mode, req.AffinityKey, req.Tenant)
			if mode == balancer.AffinityStrict {
				// The next endpoint in the key's order takes its failover.
				qa, err := a.PickExcept(&req, pa.ID())
				require.NoError(t, err)
				qb, err := b.PickExcept(&req, pb.ID())
				require.NoError(t, err)
				require.Equal(t, qa.ID(), qb.ID(), "spill of key %x (tenant %q)", req.AffinityKey, req.Tenant)
				qa.Done(inferlb.Outcome{})
				qb.Done(inferlb.Outcome{})
			}
			pa.Done(inferlb.Outcome{})
			pb.Done(inferlb.Outcome{})
		}
	}
}
