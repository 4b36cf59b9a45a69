package fleetsim_test

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// heldIsFull feeds its balancer the servers' adapters with the names
// that wait only for want of a slot left out of Waiting: with every slot
// taken, an adapter that waits there and does not run is held, not
// "about to be loaded", and telemetry.Sample.SlotWait then reports the
// server full for it. It emulated, from the client, a SlotWait that
// counts Waiting only while a slot is free, which the library has done
// since c3f9363: it now gives inferlb's runs to the last digit.
type heldIsFull struct{ fleetsim.Router }

func (h heldIsFull) Publish(i int, s telemetry.Sample) {
	slots, ok := s.Get(telemetry.LoRASlots)
	if a := s.Adapters; ok && a != nil && float64(len(a.Running)) >= slots {
		b := &telemetry.Adapters{Base: a.Base, Running: a.Running}
		for _, w := range a.Waiting {
			if slices.Contains(a.Running, w) {
				b.Waiting = append(b.Waiting, w)
			}
		}
		s.Adapters = b
	}
	h.Router.Publish(i, s)
}

// adapterKeyed gives every adapter's calls the adapter's own affinity key
// instead of their session's (over a balancer with adapter homes off):
// each adapter, popular or not, then has a home replica (and the ring's
// next ones, where it spills). The balancer's own rule
// (balancer.Options.AdapterHomes) does so for the rarely asked adapters
// only.
type adapterKeyed struct{ fleetsim.Router }

func (a adapterKeyed) Pick(req *fleetsim.Request) (int, func(inferlb.Outcome), error) {
	if req.Model != fleetsim.Model {
		r := *req
		r.AffinityKey = xxhash.Sum64String(req.Model) | 1
		return a.Router.Pick(&r)
	}
	return a.Router.Pick(req)
}

// manyAdapters is the lora-slots scenario with n adapters (Zipf, the first
// sixth hot, up to half warm, the rest cold): with n above the fleet's 32
// slots, no placement runs every adapter without waits.
func manyAdapters(n int) *fleetsim.Scenario {
	sc := fleetsim.LoRASlotsScenario()
	names, classes, weights := make([]string, n), make([]string, n), make([]float64, n)
	for k := range names {
		names[k], weights[k] = fmt.Sprintf("lora-%02d", k), 1/float64(k+1)
		switch {
		case k < n/6:
			classes[k] = "hot"
		case k < n/2:
			classes[k] = "warm"
		default:
			classes[k] = "cold"
		}
	}
	chat := fleetsim.ChatScenario().Workload
	sc.Workload = func(rate float64) fleetsim.Workload {
		w := chat(rate).(*fleetsim.Chat)
		w.Adapters, w.AdapterShare = names, 0.75
		w.AdapterWeights, w.AdapterClasses = weights, classes
		return w
	}
	return sc
}

// TestLoRASlotsWhatIf prints the lora-slots figures quoted in
// benchmarks/results/lora-slots.md that the command does not produce:
// variants of the scoring (through its options, or the emulation above)
// and a fleet with --max-loras 2. It runs only when asked:
//
//	FLEETSIM_WHATIF=1 go test -run TestLoRASlotsWhatIf -v ./benchmarks/fleetsim/
func TestLoRASlotsWhatIf(t *testing.T) {
	if os.Getenv("FLEETSIM_WHATIF") == "" {
		t.Skip("set FLEETSIM_WHATIF=1: about a minute of simulation")
	}
	factors := func(load, wait float64) func() balancer.Options {
		return func() balancer.Options {
			return balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{
				inferlb.ServiceLLM: &scoring.LLM{LoRALoad: load, LoRAWait: wait},
			}}
		}
	}
	lb := fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"})
	held := fleetsim.Policy{Name: "inferlb held-is-full", New: func(e fleetsim.Env) fleetsim.Router {
		return heldIsFull{lb.New(e)}
	}}
	pols := []fleetsim.Policy{
		lb, held,
		fleetsim.InferLB(fleetsim.Variant{Name: "inferlb LoRALoad 3", Options: factors(3, 0)}),
		fleetsim.InferLB(fleetsim.Variant{Name: "inferlb LoRAWait 4", Options: factors(0, 4)}),
		fleetsim.InferLB(fleetsim.Variant{Name: "inferlb LoRAWait 64", Options: factors(0, 64)}),
	}
	two := fleetsim.LoRASlotsScenario()
	for i := range two.Fleet {
		two.Fleet[i].Server.MaxLoRAs = 2
	}
	noHomes := fleetsim.InferLB(fleetsim.Variant{Name: "inferlb no-homes", Options: fleetsim.NoAdapterHomes})
	half := fleetsim.InferLB(fleetsim.Variant{Name: "inferlb homes 0.5", Options: func() balancer.Options { return balancer.Options{AdapterHomes: 0.5} }})
	keyed := fleetsim.Policy{Name: "inferlb adapter-key", New: func(e fleetsim.Env) fleetsim.Router {
		return adapterKeyed{noHomes.New(e)}
	}}
	for _, c := range []struct {
		name string
		sc   *fleetsim.Scenario
		pols []fleetsim.Policy
	}{
		{"lora-slots", fleetsim.LoRASlotsScenario(), append(pols, noHomes, keyed, half)},
		{"lora-slots with --max-loras 2", two, slices.Concat(fleetsim.LoRASlotsScenario().Policies, []fleetsim.Policy{held})},
		{"lora-slots with 48 adapters", manyAdapters(48), slices.Concat(fleetsim.LoRASlotsScenario().Policies, []fleetsim.Policy{keyed, half})},
	} {
		fmt.Printf("%s at %g req/s\n", c.name, c.sc.Headline)
		fmt.Printf("%-22s %4s %6s %8s %8s %8s %8s %15s %9s %8s %9s %9s\n", "policy", "seed", "tok/s", "TTFT p50", "p99", "E2E p50", "p99",
			"slot-waited", "wait mean", "loads", "cold p99", "warm p99")
		for _, p := range c.pols {
			for seed := uint64(1); seed <= 4; seed++ {
				r := runAt(c.sc, p, 1, seed)
				l := r.LoRA
				ttft := map[string]float64{}
				for _, k := range l.Classes {
					ttft[k.Class] = k.TTFTP99
				}
				fmt.Printf("%-22s %4d %6.0f %7.3fs %7.2fs %7.2fs %7.2fs %7d (%4.1f%%) %8.2fs %8d %8.2fs %8.2fs\n", p.Name, seed, r.Throughput,
					r.TTFTP50, r.TTFTP99, r.E2EP50, r.E2EP99, l.SlotWaited, 100*float64(l.SlotWaited)/float64(l.AdapterCalls),
					l.SlotWaitMean, l.TotalLoads(), ttft["cold"], ttft["warm"])
			}
		}
		fmt.Println()
	}
}
