package httpbalancer_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestTenantRefusedOnOneReplica: three embedding servers on loopback; r0
// does not have tenant A's key yet and answers A's calls (X-Tenant-Id: A)
// 401 at once, and B's well. The transport names the call's tenant in its
// outcome (Outcome.Tenant), so r0 is passed over for A's calls only, and
// B's still go there as to a peer.
func TestTenantRefusedOnOneReplica(t *testing.T) {
	clock := testutil.NewClock()
	const answer = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"e5"}`
	server := func(name string, refuseA bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Backend", name)
			if refuseA && r.Header.Get("X-Tenant-Id") == "A" {
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}`)
				return
			}
			clock.Advance(20 * time.Millisecond)
			_, _ = io.WriteString(w, answer)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{
			{ID: "r0", Addr: server("r0", true)}, {ID: "r1", Addr: server("r1", false)}, {ID: "r2", Addr: server("r2", false)},
		},
		BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(5)},
	})
	c := &http.Client{Transport: tr}
	const n = 600
	refused := 0
	drew := map[string]map[string]int{"A": {}, "B": {}}
	for i := range n {
		tenant := "B"
		if i%2 == 0 {
			tenant = "A"
		}
		req, err := http.NewRequest(http.MethodPost, "http://embed.internal/v1/embeddings", strings.NewReader(`{"model":"e5","input":"a sentence"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant-Id", tenant)
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		if resp.StatusCode == http.StatusUnauthorized {
			refused++
		}
		drew[tenant][resp.Header.Get("X-Backend")]++
	}
	t.Logf("A's calls %v, %d refused; B's %v", drew["A"], refused, drew["B"])
	assert.Less(t, refused, 30, "A's calls refused of %d", n/2)
	assert.Greater(t, drew["B"]["r0"], n/2/5, "B's calls on r0")
}
