package fleetsim_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
	"github.com/inferlb/inferlb/scoring"
)

// TestEmbeddingScanFailuresWhatIf runs the embedding scenario (300 req/s)
// with one replica failing for 30 s of the measurement: every call
// answered 500 at once (a crashed model backend), the replica down
// (connections refused), or four times slower; through one and eight
// clients. A least-connections scan sends a fast-failing replica more
// calls, not fewer (its calls end at once, so it always has the fewest
// in flight): the figures check that inferlb's scan, with its breakers,
// loses no more than its two choices did. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestEmbeddingScanFailuresWhatIf -v ./benchmarks/fleetsim/
func TestEmbeddingScanFailuresWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a minute of simulation")
	}
	limit := func(name string, l int) fleetsim.Policy {
		return fleetsim.InferLB(fleetsim.Variant{Name: name, Options: func() balancer.Options { return balancer.Options{ScanLimit: l} }})
	}
	policies := []fleetsim.Policy{fleetsim.LeastRequest(), fleetsim.LeastConn(), limit("two-choices", -1), limit("inferlb", 0)}
	from, to := 20*time.Second, 50*time.Second
	incidents := []struct {
		name   string
		events []fleetsim.FleetEvent
	}{
		{"500s", []fleetsim.FleetEvent{{At: from, Replica: 1, Kind: fleetsim.ModelFail}, {At: to, Replica: 1, Kind: fleetsim.ModelRecover}}},
		{"down", []fleetsim.FleetEvent{{At: from, Replica: 1, Kind: fleetsim.Crash}, {At: to, Replica: 1, Kind: fleetsim.Restart}}},
		{"4x-slower", []fleetsim.FleetEvent{{At: from, Replica: 1, Kind: fleetsim.SlowDown, Factor: 4}, {At: to, Replica: 1, Kind: fleetsim.Recover}}},
	}
	for _, in := range incidents {
		for _, clients := range []int{1, 8} {
			sc := fleetsim.EmbeddingScenario()
			sc.Events = in.events
			for _, p := range policies {
				res := fleetsim.Run(sc, p, fleetsim.RunConfig{Rate: 300, Clients: clients, Seed: 1,
					Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
				fmt.Printf("%-9s clients=%d %-13s failed %5d retries %5d TTFT p50 %.3f p90 %.3f p99 %.3f\n",
					in.name, clients, p.Name, res.Failed, res.Retries, res.TTFTP50, res.TTFTP90, res.TTFTP99)
			}
		}
	}
}

// scanningLeastLoaded is scoring.LeastLoaded with a full scan: the
// alternative TestLeastLoadedScanWhatIf weighs.
type scanningLeastLoaded struct{ scoring.LeastLoaded }

func (*scanningLeastLoaded) FullScan() bool { return true }

// TestLeastLoadedScanWhatIf asks whether scoring.LeastLoaded, the scorer
// of calls the gRPC balancer cannot classify, should scan every endpoint
// as the Latency scorer does (its cost is this process's calls in flight
// alone, which FullScanner's rule allows). It prices every call of five
// scenarios with LeastLoaded, without affinity keys (as unclassified
// calls have none), two choices against a scan, through one and eight
// clients, beside least-request and least-connections; then the
// failures scenario's incidents one at a time. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestLeastLoadedScanWhatIf -v ./benchmarks/fleetsim/
func TestLeastLoadedScanWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: a minute of simulation")
	}
	with := func(name string, s scoring.Scorer) fleetsim.Policy {
		return fleetsim.InferLB(fleetsim.Variant{Name: name, NoAffinity: true, Options: func() balancer.Options {
			return balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{
				inferlb.ServiceLLM: s, inferlb.ServiceEmbedding: s, inferlb.ServiceRerank: s}}
		}})
	}
	twoChoices, scan := with("ll-two-choices", &scoring.LeastLoaded{}), with("ll-scan", &scanningLeastLoaded{})
	run := func(label string, sc *fleetsim.Scenario, clients int, policies ...fleetsim.Policy) {
		for _, p := range policies {
			res := fleetsim.Run(sc, p, fleetsim.RunConfig{Rate: sc.Headline, Clients: clients, Seed: 1,
				Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape})
			fmt.Printf("%-24s clients=%d %-14s failed %4d TTFT p50 %.3f p90 %.3f p99 %.3f E2E p99 %.2f\n",
				label, clients, p.Name, res.Failed, res.TTFTP50, res.TTFTP90, res.TTFTP99, res.E2EP99)
		}
	}
	for _, sc := range []*fleetsim.Scenario{fleetsim.EmbeddingScenario(), fleetsim.ChatScenario(),
		fleetsim.MixScenario(), fleetsim.HotPromptScenario(), fleetsim.FailuresScenario()} {
		for _, clients := range []int{1, 8} {
			run(sc.Name, sc, clients, fleetsim.LeastRequest(), fleetsim.LeastConn(), twoChoices, scan)
		}
	}
	all := fleetsim.FailuresScenario().Events
	for _, ev := range all {
		if ev.Kind == fleetsim.Restart || ev.Kind == fleetsim.Recover {
			continue // the end of an incident run below with its start
		}
		sc := fleetsim.FailuresScenario()
		sc.Events = nil
		for _, e := range all {
			if e.Replica == ev.Replica {
				sc.Events = append(sc.Events, e)
			}
		}
		run(fmt.Sprintf("failures, r%d alone", ev.Replica), sc, 1, twoChoices, scan)
	}
}
