package fleetsim_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// TestEmbeddingScanWhatIf runs the embedding scenario on larger fleets (16
// and 48 replicas, two of them three times slower, the offered loads
// scaled with the fleet) through one and eight clients, with
// Options.ScanLimit -1 (two choices), 8, 16, 32 (the default) and 64,
// beside the least-connections scan: the figures behind DefaultScanLimit.
// It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestEmbeddingScanWhatIf -v ./benchmarks/fleetsim/
func TestEmbeddingScanWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a few minutes of simulation")
	}
	limit := func(name string, l int) fleetsim.Policy {
		return fleetsim.InferLB(fleetsim.Variant{Name: name, Options: func() balancer.Options { return balancer.Options{ScanLimit: l} }})
	}
	policies := []fleetsim.Policy{fleetsim.LeastConn(), limit("two-choices", -1),
		limit("scan8", 8), limit("scan16", 16), limit("scan32", 32), limit("scan64", 64)}
	for _, n := range []int{16, 48} {
		sc := fleetsim.EmbeddingScenario()
		sc.Fleet = make([]fleetsim.ReplicaSpec, n)
		for i := range sc.Fleet {
			sc.Fleet[i] = fleetsim.ReplicaSpec{Server: fleetsim.EmbeddingServer(), Speed: 1}
		}
		sc.Fleet[n-1].Speed, sc.Fleet[n/2].Speed = 3, 3
		for _, clients := range []int{1, 8} {
			for _, r := range []float64{200, 300, 350} {
				rate := r * float64(n) / 6
				for _, p := range policies {
					res := fleetsim.Run(sc, p, fleetsim.RunConfig{Rate: rate, Clients: clients, Seed: 1,
						Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
					fmt.Printf("n=%d clients=%d rate=%.0f %-12s TTFT p50 %.3f p90 %.3f p99 %.3f\n",
						n, clients, rate, p.Name, res.TTFTP50, res.TTFTP90, res.TTFTP99)
				}
			}
		}
	}
}
