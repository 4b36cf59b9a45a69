package fleetsim

import (
	"fmt"
	"os"
	"testing"
)

// TestFailuresWithConnectionStateWhatIf runs the failures scenario's
// baselines with and without connection state (connAware) beside inferlb.
// It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestFailuresWithConnectionStateWhatIf -v ./benchmarks/fleetsim/
func TestFailuresWithConnectionStateWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a few minutes of simulation")
	}
	sc := FailuresScenario()
	var pols []Policy
	for _, p := range []Policy{RoundRobin(), Random(), LeastRequest(), RingHash()} {
		pols = append(pols, p, WithConnState(p))
	}
	pols = append(pols, InferLB(Variant{Name: "inferlb"}))
	fmt.Printf("failures at %g req/s\n%-24s %4s %6s %7s %8s %8s %8s\n", sc.Headline, "policy", "seed", "tok/s", "failed", "TTFT p99", "E2E p50", "p99")
	for _, p := range pols {
		for seed := uint64(1); seed <= 3; seed++ {
			r := Run(sc, p, RunConfig{Rate: sc.Headline, Clients: 1, Seed: seed,
				Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
			fmt.Printf("%-24s %4d %6.0f %7d %7.2fs %7.2fs %7.2fs\n", p.Name, seed, r.Throughput, r.Failed, r.TTFTP99, r.E2EP50, r.E2EP99)
		}
	}
}
