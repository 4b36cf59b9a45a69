package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// windowRun is a tenantRun over r0..r3 where the members of refusing
// refuse tenant A's calls until the memory passes them over for A, and
// then the members of small refuse a long llama call as longer than their
// window of 4,096 tokens.
func windowRun(t *testing.T, refusing, small []string) *tenantRun {
	t.Helper()
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(4)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return tn == "A" && contains(refusing, addr) }
	r.rounds(500, 4) // 10 s
	for _, ep := range small {
		refuse(t, r.b, ep, "llama", 4096)
	}
	return r
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// A long call of tenant A, for which the memory passes members over both
// as refusing A and as too small for the call (window.go), goes to a
// member that fits it and does not refuse A when one exists; when every
// member that fits it refuses A, a first pick still goes to one that fits
// (the memory of A's refusals may be stale: A's key may have arrived
// since; a window too small for the call is the server's configuration),
// and a retry, which would only be refused again, finds none. The tenant
// memory ran before the window filter and counted the members too small
// for the call as others to go to: it passed over the only members that
// fit, and the window filter, finding every member left too small, gave
// way, so the call went to a member sure to refuse it as too long.
func TestTenantRefusalAndContextWindowTogether(t *testing.T) {
	long := func(tenant string) *inferlb.Request {
		return &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", Tenant: tenant, PromptTokens: 6000, MaxOutputTokens: 500}
	}
	for _, tc := range []struct {
		name            string
		refusing, small []string
		want            []string // where A's long first picks go
		retryFails      bool     // A's long retries find none
	}{
		{"one large member refuses A", []string{"r2"}, []string{"r0", "r1"}, []string{"r3"}, false},
		{"the only large member refuses A", []string{"r3"}, []string{"r0", "r1", "r2"}, []string{"r3"}, true},
		{"both large members refuse A", []string{"r2", "r3"}, []string{"r0", "r1"}, []string{"r2", "r3"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := windowRun(t, tc.refusing, tc.small)
			// A retry of A's long call, which would only be refused
			// again where no member fits it and does not refuse A.
			p, err := r.b.PickRetry(long("A"), "elsewhere")
			if tc.retryFails {
				assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "a retry of A's long call: every member that fits refuses A, the others are too small")
			} else {
				require.NoError(t, err)
				assert.Contains(t, tc.want, p.ID(), "a retry of A's long call")
				p.Done(inferlb.Outcome{})
			}
			// A's short calls still pass over the members refusing A.
			short := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", Tenant: "A", PromptTokens: 300, MaxOutputTokens: 100}
			for id := range picksOf(t, r.b, short, 100) {
				assert.NotContains(t, tc.refusing, id, "A's short calls")
			}
			// Another tenant's long calls go to the members that fit
			// them, A's refusals notwithstanding.
			other := picksOf(t, r.b, long("B"), 100)
			for id := range other {
				assert.NotContains(t, tc.small, id, "B's long calls: %v", other)
			}
			// A's long calls, refused where A is.
			got := map[string]int{}
			for range 50 {
				p, err := r.b.Pick(long("A"))
				require.NoError(t, err, "a first pick of A's long call")
				got[p.ID()]++
				r.clock.Advance(time.Millisecond)
				p.Done(inferlb.Outcome{Tenant: "A", ClientError: contains(tc.refusing, p.ID())})
			}
			t.Logf("A's long calls: %v", got)
			for id := range got {
				assert.Contains(t, tc.want, id, "A's long calls go to %v: %v", tc.want, got)
			}
		})
	}
}
