package balancer_test

import (
	"fmt"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

// BenchmarkPickTenantRefused is Pick+Done of an embedding call over 8,
// 512 and 4,096 endpoints naming no tenant, a tenant while nothing is remembered, while
// another tenant's refusal by one endpoint is, and while its own is (the
// pick passes that endpoint over), with the outcome naming the tenant.
// Each must be allocation-free; the last finds the endpoints it passes
// over from the tenant's marked pairs (tenantMarks), and costs about the
// same over 4,096 endpoints as over 8.
func BenchmarkPickTenantRefused(b *testing.B) {
	for _, n := range []int{8, 512, 4096} {
		for _, tc := range []struct {
			name, tenant, marked string
		}{
			{"no-tenant", "", ""},
			{"tenant/none-remembered", "A", ""},
			{"tenant/other-marked", "A", "B"},
			{"tenant/this-marked", "A", "A"},
		} {
			bal := newBalancer(b, n, balancer.Options{})
			if tc.marked != "" {
				// Refused on the first endpoint (PickAt: any n), served
				// elsewhere nine times as often: its pair is marked.
				bad := endpoints(n)[0].Addr
				serial, _ := bal.Serial(bad)
				req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tc.marked}
				for i := range 300 {
					var p balancer.Pick
					var err error
					if i%10 == 0 {
						p, err = bal.PickAt(req, serial)
					} else {
						p, err = bal.Pick(req)
					}
					if err != nil {
						b.Fatal(err)
					}
					p.Done(inferlb.Outcome{Tenant: tc.marked, ClientError: p.ID() == bad})
				}
			}
			req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tc.tenant, PromptTokens: 512}
			b.Run(fmt.Sprintf("n=%d/%s", n, tc.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p, err := bal.Pick(req)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(inferlb.Outcome{Tenant: tc.tenant})
				}
			})
		}
	}
}
