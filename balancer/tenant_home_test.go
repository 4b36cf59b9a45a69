package balancer_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A homed pick whose endpoint reads the call as its base model's is made
// again with the call's own key (see TestAdapterHomesLeaveAnotherBaseModelAlone).
// A tenant's pick made that check after its shard's first choice only:
// when that found nothing and the shard's second tries chose (its
// members all cooling down after overload answers; with
// TenantShardStrict, a first pick past the memory of windows too small
// for it), every call of the other base model went to one home in the
// shard, whatever its prompt.
func TestTenantShardSecondTriesLeaveAnotherBaseModelAlone(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			clock := testutil.NewClock()
			b := affine(t, 16, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), TenantShardSize: 4,
				TenantShardStrict: strict, OutlierInterval: -1})
			first := endpoints(16)[0].Addr
			tenant := ""
			var shard []string
			for i := range 20 { // a tenant whose shard holds no llama server
				name := fmt.Sprintf("tenant-%d", i)
				if s := shardOf(t, b, name); !slices.Contains(s, first) {
					tenant, shard = name, s
					break
				}
			}
			require.NotEmpty(t, tenant)
			bases := slices.Repeat([]string{"mistral"}, 16)
			bases[0] = "llama" // the first member's reading
			publishBases(b, clock, bases)
			req := inferlb.Request{Tenant: tenant}
			if !strict {
				// The tenant's flood cools its whole shard down.
				cooled := map[string]bool{}
				for range 400 {
					p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: tenant})
					require.NoError(t, err)
					cooled[p.ID()] = true
					p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
					if len(cooled) == len(shard) {
						break
					}
				}
				require.Len(t, cooled, len(shard))
			} else {
				// Every server of the shard refused a long mistral call.
				for _, ep := range shard {
					refuse(t, b, ep, "mistral", 4096)
				}
				req.PromptTokens, req.MaxOutputTokens = 6000, 500
			}
			got := homesOf(t, b, "mistral", 50, req)
			for id := range got {
				require.Contains(t, shard, id)
			}
			assert.Greater(t, len(got), 2, "mistral's calls follow their prompt keys over the shard: %v", got)
			assert.Len(t, homesOf(t, b, "sql", 50, req), 1, "an adapter still goes home")
		})
	}
}
