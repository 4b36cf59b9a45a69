package fleetsim_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// withShare is a model-failure scenario whose failing adapter has the
// given share of the sessions: n adapters served by every replica, with
// share x n of the sessions between them (the failing one is the first).
func withShare(sc *fleetsim.Scenario, n int, share float64) *fleetsim.Scenario {
	chat := sc.Workload
	sc.Workload = func(rate float64) fleetsim.Workload {
		w := chat(rate).(*fleetsim.Chat)
		w.Adapters, w.AdapterShare = fleetsim.Adapters[:n], share*float64(n)
		return w
	}
	for i := range sc.Fleet {
		sc.Fleet[i].Models = append([]string{fleetsim.Model}, fleetsim.Adapters[:n]...)
	}
	return sc
}

// TestModelFailureShareWhatIf prints the share table of
// benchmarks/results/model-failure.md: how much holding a model's
// failures against the model matters with the failing adapter at 10%,
// 25% and 50% of the calls, inferlb against the same Balancer with no
// model named in its outcomes, seeds 1-4. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestModelFailureShareWhatIf -v ./benchmarks/fleetsim/
func TestModelFailureShareWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: about two minutes of simulation")
	}
	pols := []fleetsim.Policy{
		fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}),
		fleetsim.InferLB(fleetsim.Variant{Name: "inferlb no-outcome-model", NoOutcomeModel: true}),
	}
	fmt.Printf("%-6s %-26s %4s %12s %12s %14s %12s\n", "share", "policy", "seed", "2: on r0+r3", "2: p99 TTFT", "all: trips(cap)", "all: p99 TTFT")
	for _, c := range []struct {
		n     int
		share float64
	}{{4, 0.1}, {2, 0.25}, {1, 0.5}} {
		two := withShare(fleetsim.ModelFailureScenario(), c.n, c.share)
		all := withShare(fleetsim.ModelFailureEverywhereScenario(), c.n, c.share)
		for _, p := range pols {
			for seed := uint64(1); seed <= 4; seed++ {
				r2, ra := runAt(two, p, 1, seed), runAt(all, p, 1, seed)
				fmt.Printf("%-6.0f %-26s %4d %11.1f%% %11.3fs %9d (%3d) %11.3fs\n", 100*c.share, p.Name, seed,
					100*healthyOn(r2), r2.Healthy.TTFTP99, ra.Balancer.Trips, ra.Balancer.Capped, ra.Healthy.TTFTP99)
			}
		}
	}
}
