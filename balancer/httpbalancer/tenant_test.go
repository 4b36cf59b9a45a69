package httpbalancer_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// With TenantShardSize, each tenant named in the tenant header reaches only
// its own shard of backends; together the tenants still use the fleet.
func TestTenantHeaderShardsBackends(t *testing.T) {
	var bs []*backend
	for i := range 8 {
		bs = append(bs, newBackend(t, fmt.Sprintf("b%d", i)))
	}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(bs...),
		BalancerOptions: balancer.Options{AffinitySeed: 3, TenantShardSize: 2},
	})
	client := &http.Client{Transport: tr}
	send := func(tenant string, n int) map[string]int64 {
		before := make([]int64, len(bs))
		for i, b := range bs {
			before[i] = b.hits.Load()
		}
		for i := range n {
			req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(httpbalancer.DefaultTenantHeader, tenant)
			resp, err := client.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}
		got := map[string]int64{}
		for i, b := range bs {
			if d := b.hits.Load() - before[i]; d > 0 {
				got[b.name] = d
			}
		}
		return got
	}
	used := map[string]bool{}
	for i := range 12 {
		got := send(fmt.Sprintf("tenant-%d", i), 40)
		assert.LessOrEqual(t, len(got), 2, "tenant-%d reached %v", i, got)
		for name := range got {
			used[name] = true
		}
	}
	assert.Greater(t, len(used), 4, "the tenants' shards spread over the fleet: %v", used)
}
