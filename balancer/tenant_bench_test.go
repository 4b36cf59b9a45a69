package balancer_test

import (
	"fmt"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

// BenchmarkPickTenant is Pick+Done of an LLM call of a tenant with tenant
// shards on (Options.TenantShardSize) and with them off, in the same run:
// what drawing the tenant's shard adds to a pick.
func BenchmarkPickTenant(b *testing.B) {
	for _, c := range []struct{ n, k int }{{16, 4}, {64, 8}, {256, 32}} {
		for _, k := range []int{0, c.k} {
			bal := newBalancer(b, c.n, balancer.Options{TenantShardSize: k})
			req := &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("n=%d/shard=%d", c.n, k), func(b *testing.B) { benchPickDone(b, bal, req) })
		}
	}
}
