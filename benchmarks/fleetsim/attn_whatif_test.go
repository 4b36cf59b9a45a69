package fleetsim

import (
	"fmt"
	"os"
	"testing"
)

func TestAttnPairs(t *testing.T) {
	for _, c := range []struct {
		c, n int
		want float64
	}{{0, 1, 1}, {0, 4, 10}, {2, 2, 7}, {6000, 1200, 6000*1200 + 1200*1201/2}} {
		if got := attnPairs(c.c, c.n); got != c.want {
			t.Errorf("attnPairs(%d, %d) = %v, want %v", c.c, c.n, got, c.want)
		}
	}
	// Split into chunks, a prompt pays what it pays in one piece.
	if a, b := attnPairs(0, 7200), attnPairs(0, 2048)+attnPairs(2048, 2048)+attnPairs(4096, 3104); a != b {
		t.Errorf("one chunk %v, three %v", a, b)
	}
}

// TestSharedPrefixAttentionWhatIf runs the shared-prefix scenario with
// attention's prefill FLOPs charged (ServerParams.AttnNsPerPair), which
// make a long prompt's prefill cost more than linear and so a prefix-cache
// hit worth more or less than the linear model says. 1 ns a pair is about
// a 32B model's attention (4 x 5,120 x 64 FLOPs a pair) at the linear
// term's own FLOP rate: it adds about 7% to a 7,200-token prompt's
// prefill; 3 ns about 20%. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestSharedPrefixAttentionWhatIf -v ./benchmarks/fleetsim/
func TestSharedPrefixAttentionWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a few minutes of simulation")
	}
	fmt.Printf("%-10s %-12s %4s %5s %7s %9s %8s\n", "attn ns", "policy", "seed", "rate", "tok/s", "TTFT p90", "x rr")
	for _, attn := range []float64{0, 1, 3} {
		sc := SharedPrefixScenario()
		for i := range sc.Fleet {
			sc.Fleet[i].Server.AttnNsPerPair = attn
		}
		for _, rate := range []float64{18, 20} {
			for seed := uint64(1); seed <= 2; seed++ {
				var rr float64
				for _, p := range []Policy{RoundRobin(), InferLB(Variant{Name: "inferlb"}), Oracle()} {
					r := Run(sc, p, RunConfig{Rate: rate, Clients: 1, Seed: seed,
						Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
					if p.Name == "round-robin" {
						rr = r.Throughput
					}
					fmt.Printf("%-10g %-12s %4d %5g %7.0f %8.2fs %7.2fx\n", attn, p.Name, seed, rate, r.Throughput, r.TTFTP90, r.Throughput/rr)
				}
			}
		}
	}
}
