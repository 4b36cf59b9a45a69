package fleetsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A session's tenant follows Chat.TenantShares (equal without them), drawn
// from the session's seed alone.
func TestChatTenantFollowsShares(t *testing.T) {
	const n = 20000
	count := func(w *Chat) map[string]int {
		got := map[string]int{}
		for i := range uint64(n) {
			got[w.tenant(mix64(i))]++
		}
		return got
	}
	assert.Equal(t, map[string]int{"": n}, count(&Chat{}), "no tenants: none named")
	eq := count(&Chat{Tenants: []string{"A", "B", "C", "D"}})
	for _, k := range []string{"A", "B", "C", "D"} {
		assert.InDelta(t, n/4, eq[k], n/50, k)
	}
	w := &Chat{Tenants: []string{"A", "B"}, TenantShares: []float64{3, 1}}
	sh := count(w)
	assert.InDelta(t, 3*n/4, sh["A"], n/50)
	assert.InDelta(t, n/4, sh["B"], n/50)
	assert.Equal(t, w.tenant(12345), w.tenant(12345), "the same seed, the same tenant")
}
