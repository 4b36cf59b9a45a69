package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A strict tenant's shard whose endpoints are all remembered not to serve
// the call's model (Outcome.NotServedModel), or too small for it
// (Outcome.ContextWindow), while endpoints outside the shard are not, is
// not down: its endpoints are ready and healthy, and the memory may be
// stale (an adapter loaded since). As when every endpoint of the group is
// remembered so, a first pick goes ahead, in the shard, and the server's
// answer is the caller's; only a retry, which would fetch that answer
// again, finds nothing. It failed every call of the tenant with
// ErrTenantShardDown for the whole memory (30s by default) without trying
// a server.
func TestTenantShardStrictFirstPickGoesAheadPastTheMemory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     inferlb.Request
		refusal inferlb.Outcome
	}{
		{"not served", inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", Model: "lora-x"},
			inferlb.Outcome{NotServedModel: "lora-x"}},
		{"context window", inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", Model: "llama", PromptTokens: 6000, MaxOutputTokens: 1000},
			inferlb.Outcome{ContextWindow: 4096, Model: "llama"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, TenantShardSize: 2, TenantShardStrict: true,
				Rand: testutil.NewRand(5), Clock: testutil.NewClock()})
			shard := shardOf(t, b, "acme")
			refused := map[string]bool{}
			for len(refused) < len(shard) {
				p, err := b.Pick(&tc.req)
				require.NoError(t, err)
				require.Contains(t, shard, p.ID())
				refused[p.ID()] = true
				p.Done(tc.refusal)
			}
			for range 20 {
				p, err := b.Pick(&tc.req)
				require.NoError(t, err, "a shard that only refused the model is not down")
				assert.Contains(t, shard, p.ID(), "strict: the call stays in its shard")
				p.Done(inferlb.Outcome{})
			}
			// A retry would only fetch the refusal again: none, nothing spent.
			before := b.RetryStats()
			_, err := b.PickRetry(&tc.req, shard[0])
			require.ErrorIs(t, err, balancer.ErrNoEndpoints)
			assert.Equal(t, before, b.RetryStats())
		})
	}
}
