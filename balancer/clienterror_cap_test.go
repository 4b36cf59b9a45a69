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

// Requests are untrusted, and whether a call is a client error is the
// request's doing. A tenant sending only bad calls raises the shares of its
// shard (TenantShardSize 3 of 4 replicas) alone, and the comparison passed
// all three over for every other tenant: the fourth replica drew 1,160 of
// the other tenants' 1,800 embedding calls. Only MaxEjectedFraction of a
// pool (here 2 of 4) may be passed over for client errors, as for outlier
// ejection: the third competes on its costs, and the fourth draws 735. (An
// affinity key's refused calls take out its owner only: see
// TestRefusedKeyTakesOutItsOwnerOnly.)
func TestClientErrorShunningIsCappedLikeEjection(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(5), TenantShardSize: 3, AffinitySeed: 7})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "d"}}))
	shard := map[string]int{}
	drew := map[string]int{}
	for r := range 300 {
		for range 9 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "x"})
			require.NoError(t, err)
			shard[p.Endpoint().Addr]++
			clock.Advance(time.Millisecond)
			p.Done(inferlb.Outcome{ClientError: true})
		}
		var out []balancer.Pick
		for i := range 6 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: fmt.Sprintf("t%d", (r*6+i)%12)})
			require.NoError(t, err)
			drew[p.Endpoint().Addr]++
			out = append(out, p)
		}
		clock.Advance(20 * time.Millisecond)
		for _, p := range out {
			p.Done(inferlb.Outcome{})
		}
	}
	t.Logf("the bad tenant's calls %v, the others' %v", shard, drew)
	require.Len(t, shard, 3, "the bad tenant's shard")
	for addr, n := range drew {
		assert.Less(t, n, 900, "calls %s drew of the other tenants' 1,800: %v", addr, drew)
	}
}
