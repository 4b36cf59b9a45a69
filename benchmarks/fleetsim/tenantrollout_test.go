package fleetsim_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// r0 refuses tenant A's calls (a quarter of the chat sessions) and serves
// the other tenants'. With the tenant on its outcomes inferlb passes r0
// over for A's calls only: A loses fewer calls than with the tenant left
// out, and r0 keeps about its eighth of the other tenants' calls.
func TestTenantRolloutPassesR0OverForTenantAOnly(t *testing.T) {
	t.Parallel()
	sc := fleetsim.TenantRolloutScenario()
	sc.Warmup, sc.Duration, sc.Drain = 60*time.Second, 240*time.Second, 60*time.Second
	policy := func(name string) fleetsim.Policy {
		i := slices.IndexFunc(sc.Policies, func(p fleetsim.Policy) bool { return p.Name == name })
		require.GreaterOrEqual(t, i, 0, name)
		return sc.Policies[i]
	}
	lb := runAt(sc, policy("inferlb"), 1, 1)
	bare := runAt(sc, policy("inferlb no-tenant-memory"), 1, 1)
	require.NotNil(t, lb.Tenants)
	require.NotNil(t, bare.Tenants)
	onR0 := func(r fleetsim.Result) float64 {
		sent := 0
		for _, n := range r.Tenants.OthersAttempts {
			sent += n
		}
		return float64(r.Tenants.OthersAttempts[0]) / float64(max(sent, 1))
	}
	t.Logf("A's calls failed: %d of %d / %d of %d (inferlb / no-tenant-memory); other tenants' attempts on r0: %.1f%% / %.1f%%",
		lb.Tenants.RefusedFailed, lb.Tenants.Refused, bare.Tenants.RefusedFailed, bare.Tenants.Refused, 100*onR0(lb), 100*onR0(bare))
	assert.Positive(t, bare.Tenants.RefusedFailed, "without the tenant, A's conversations owned by r0 fail")
	assert.Less(t, lb.Tenants.RefusedFailed*2, bare.Tenants.RefusedFailed, "the memory fails fewer than half as many of A's calls")
	assert.Greater(t, onR0(lb), 0.08, "r0 keeps the other tenants' calls (an eighth would be 12.5%)")
	assert.Zero(t, lb.Tenants.OthersFailed, "no other tenant's call fails")
	assert.Equal(t, lb.Unauthorized, lb.Tenants.RefusedFailed, "each of A's failures is a 401 of r0's")
}
