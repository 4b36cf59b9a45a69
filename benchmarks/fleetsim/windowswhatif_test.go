package fleetsim_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// TestContextWindowsWhatIf runs the context-windows scenario with its
// small- and large-window replicas interleaved (r0 small, r1 large, ...)
// instead of listed in two runs, as discovery lists two node pools:
// round-robin's retry of a refused call then goes to the next replica,
// which has the large window, so how many long calls the baselines lose
// depends on the listing's order. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestContextWindowsWhatIf -v ./benchmarks/fleetsim/
func TestContextWindowsWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: about a minute of simulation")
	}
	sc := fleetsim.ContextWindowsScenario()
	for i := range sc.Fleet {
		sc.Fleet[i].Server.MaxModelLen = fleetsim.LargeWindow
		if i%2 == 0 {
			sc.Fleet[i].Server.MaxModelLen = fleetsim.SmallWindow
		}
	}
	fmt.Printf("context-windows, windows interleaved, at %g req/s\n", sc.Headline)
	fmt.Printf("%-18s %4s %6s %14s %8s %8s %8s %6s\n", "policy", "seed", "calls", "failed", "refused", "E2E p50", "p99", "tok/s")
	for _, p := range sc.Policies {
		for seed := uint64(1); seed <= 4; seed++ {
			r := runAt(sc, p, 1, seed)
			fmt.Printf("%-18s %4d %6d %6d (%4.1f%%) %8d %7.2fs %7.2fs %6.0f\n", p.Name, seed, r.Requests, r.Failed,
				100*float64(r.Failed)/float64(max(r.Requests, 1)), r.TooLong, r.E2EP50, r.E2EP99, r.Throughput)
		}
	}
}
