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

// A strict tenant's shard whose members the group's memory all passes
// over, one as not serving the call's model and one as too small for it,
// gives the call to the one that serves the model, as the group does
// when no member both serves the model and fits (passOverFilters): the
// filters give way the latest first, the window filter before the
// not-served memory. The call's tokens are an estimate, over the window
// here (4,200 against 4,096), and the member with the model may take it;
// the one without answers "not found" at any length. Cleared all at
// once, the filters sent 53 of 100 such calls to the member without the
// model. A retry still finds none.
func TestTenantShardStrictGivesWayTheLatestFilterFirst(t *testing.T) {
	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, TenantShardSize: 2, TenantShardStrict: true,
		Rand: testutil.NewRand(5), Clock: testutil.NewClock(), OutlierInterval: -1})
	shard := shardOf(t, b, "acme")
	lacking, small := shard[0], shard[1]
	refuse(t, b, small, "llama", 4096)
	reportNotServed(t, b, lacking, "llama")
	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", Tenant: "acme", PromptTokens: 3700, MaxOutputTokens: 500}
	got := picksOf(t, b, long, 100)
	t.Logf("shard %v, %s without the model, %s too small: %v", shard, lacking, small, got)
	assert.Equal(t, map[string]int{small: 100}, got, "the member that serves the model takes the calls")
	_, err := b.PickRetry(long, small)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints, "a retry: the shard's other member lacks the model")
}
