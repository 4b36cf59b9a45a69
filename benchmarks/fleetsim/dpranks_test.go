package fleetsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The data-parallel scenarios compare the generic baselines in both ways
// a fleet of data-parallel engines is deployed: one endpoint per engine
// (its front end picks the rank) and one per rank (vLLM's external mode).
func TestDPScenariosShowBaselinesBothWays(t *testing.T) {
	for _, sc := range []*Scenario{DataParallelScenario(), DPChatScenario()} {
		seen := map[string]bool{}
		for _, p := range sc.Policies {
			seen[p.Name] = p.SeesRanks
		}
		for name, ranks := range map[string]bool{
			"least-request": false, "least-request +ranks": true,
			"consistent-hash": false, "consistent-hash +ranks": true,
			"inferlb": true,
		} {
			got, ok := seen[name]
			if assert.True(t, ok, "%s: policy %q", sc.Name, name) {
				assert.Equal(t, ranks, got, "%s: %q sees every rank", sc.Name, name)
			}
		}
	}
}
