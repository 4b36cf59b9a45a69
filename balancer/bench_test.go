package balancer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

var benchSizes = []int{8, 64, 512, 4096}

// BenchmarkPick measures Pick+Done, serial and parallel, per fleet size and
// service (each service has its own scorer). Cost must be flat in n and
// allocation-free; embedding picks compare up to ScanLimit members (see
// BenchmarkPickScan), so theirs is flat past it.
func BenchmarkPick(b *testing.B) {
	for _, svc := range []inferlb.Service{inferlb.ServiceLLM, inferlb.ServiceEmbedding} {
		for _, n := range benchSizes {
			bal := newBalancer(b, n, balancer.Options{})
			req := &inferlb.Request{Service: svc, PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("%v/n=%d/serial", svc, n), func(b *testing.B) { benchPickDone(b, bal, req) })
			b.Run(fmt.Sprintf("%v/n=%d/parallel", svc, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						p, err := bal.Pick(req)
						if err != nil {
							b.Fatal(err)
						}
						p.Done(inferlb.Outcome{})
					}
				})
			})
		}
	}
}

// BenchmarkPickScan is what the full scan of embedding picks costs
// (scoring.FullScanner, Options.ScanLimit) against two choices
// (ScanLimit -1), in the same run: past DefaultScanLimit members the scan
// compares that many.
func BenchmarkPickScan(b *testing.B) {
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding, PromptTokens: 512}
	for _, n := range append([]int{6, 32}, benchSizes...) {
		for _, lim := range []int{-1, 0} {
			name := "two-choices"
			if lim == 0 {
				name = "scan"
			}
			bal := newBalancer(b, n, balancer.Options{ScanLimit: lim})
			b.Run(fmt.Sprintf("n=%d/%s", n, name), func(b *testing.B) { benchPickDone(b, bal, req) })
		}
	}
}

// benchPickDone times serial Pick+Done of req on bal.
func benchPickDone(b *testing.B, bal *balancer.Balancer, req *inferlb.Request) {
	b.ReportAllocs()
	for b.Loop() {
		p, err := bal.Pick(req)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(inferlb.Outcome{})
	}
}

// BenchmarkPickTelemetry is BenchmarkPick for LLM calls with a fresh
// server reading (running, waiting, KV-cache use) for every endpoint: what
// pricing telemetry adds to a pick.
func BenchmarkPickTelemetry(b *testing.B) {
	for _, n := range benchSizes[:2] {
		bal := loadedFleet(b, n, false)
		req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 512, MaxOutputTokens: 256}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchPickDone(b, bal, req) })
	}
}

// loadedFleet returns a Balancer of n endpoints, each with a fresh server
// reading (running, waiting, KV-cache use); with sleepers, one in four
// reads asleep and the rest awake.
func loadedFleet(b *testing.B, n int, sleepers bool) *balancer.Balancer {
	clock := testutil.NewClock()
	bal := newBalancer(b, n, balancer.Options{Clock: clock})
	for i, ep := range endpoints(n) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, float64(8+i%5))
		s.Set(telemetry.Waiting, float64(i%3))
		s.Set(telemetry.KVCacheUsage, 0.5+0.1*float64(i%5))
		if sleepers {
			s.Set(telemetry.Asleep, 0)
			if i%4 == 1 {
				s.Set(telemetry.Asleep, 1)
			}
		}
		bal.Publish(ep.Addr, s)
	}
	return bal
}

// BenchmarkPickEngines is BenchmarkPick for LLM calls on data-parallel
// engines of 8 ranks (dp_group labels): what pricing the engine's step adds.
func BenchmarkPickEngines(b *testing.B) {
	for _, n := range []int{16, 64} {
		eps := endpoints(n)
		for i := range eps {
			eps[i].Labels = map[string]string{balancer.DefaultDPGroupLabel: fmt.Sprint(i / 8)}
		}
		bal := balancer.New(balancer.Options{})
		if err := bal.Update(eps); err != nil {
			b.Fatal(err)
		}
		req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 512, MaxOutputTokens: 256}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchPickDone(b, bal, req) })
	}
}

// BenchmarkPickAffinity measures Pick+Done for requests with an affinity
// key (owner lookup on the ring, bound check): flat in n, no allocations.
// The model variants name a model, which scopes the key in the spill
// memory and, with StickyTTL (sticky), in the sticky table.
func BenchmarkPickAffinity(b *testing.B) {
	for _, n := range benchSizes {
		for _, v := range []struct {
			name   string
			model  string
			sticky time.Duration
		}{
			{"", "", 0},
			{"/model", "meta-llama/Llama-3.1-8B-Instruct", 0},
			{"/model/sticky", "meta-llama/Llama-3.1-8B-Instruct", time.Minute},
		} {
			benchPickAffinity(b, fmt.Sprintf("n=%d%s", n, v.name), n, v.model, v.sticky)
		}
	}
}

func benchPickAffinity(b *testing.B, name string, n int, model string, sticky time.Duration) {
	bal := newBalancer(b, n, balancer.Options{AffinitySeed: 1, StickyTTL: sticky})
	keys := make([]inferlb.Request, 1024)
	for i := range keys {
		keys[i] = inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: uint64(i)*0x9e3779b97f4a7c15 | 1}
	}
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p, err := bal.Pick(&keys[i&1023])
			if err != nil {
				b.Fatal(err)
			}
			p.Done(inferlb.Outcome{})
			i++
		}
	})
}

// BenchmarkFilteredAffinePick prices fitView: Pick+Done of keyed LLM
// calls (1,024 keys) over n endpoints, half of which refused a call of
// the model as longer than their window. A call that fits every window
// ("fits") is picked as on any fleet; a long one ("long") is passed over
// the small half by its filter, and its affinity bound sums the group's
// view without them, once per pick.
func BenchmarkFilteredAffinePick(b *testing.B) {
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	for _, n := range benchSizes[:3] {
		bal := newBalancer(b, n, balancer.Options{AffinitySeed: 1})
		for i, e := range endpoints(n) {
			if i%2 == 1 {
				benchRememberWindow(b, bal, e.Addr, model, 4096)
			}
		}
		for _, tc := range []struct {
			name   string
			tokens int
		}{{"fits", 1000}, {"long", 6000}} {
			keys := make([]inferlb.Request, 1024)
			for i := range keys {
				keys[i] = inferlb.Request{Service: inferlb.ServiceLLM, Model: model, PromptTokens: tc.tokens, AffinityKey: uint64(i)*0x9e3779b97f4a7c15 | 1}
			}
			b.Run(fmt.Sprintf("n=%d/%s", n, tc.name), func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					p, err := bal.Pick(&keys[i&1023])
					if err != nil {
						b.Fatal(err)
					}
					p.Done(inferlb.Outcome{})
					i++
				}
			})
		}
	}
}

// benchRememberWindow has the endpoint at addr refuse a call of model as
// longer than its window of window tokens, so that bal remembers it.
func benchRememberWindow(b *testing.B, bal *balancer.Balancer, addr, model string, window int) {
	serial, ok := bal.Serial(addr)
	if !ok {
		b.Fatal(addr)
	}
	p, err := bal.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model}, serial)
	if err != nil {
		b.Fatal(err)
	}
	p.Done(inferlb.Outcome{ContextWindow: window, Model: model})
}

// BenchmarkFitViewRotation prices a group's cache of fit views
// (fitCache) under keyed LLM calls (1,024 keys) whose filters rotate over
// K distinct ones, call by call, on n endpoints with no model label (one
// group). "models": K models, each remembered with a 4,096-token window
// on half the endpoints, and calls of 6,000 tokens. "ranges": one model,
// the endpoints remembered with K windows (1,000 to K x 1,000 tokens, and
// every K+1st with none), and calls of j x 1,000 + 500 tokens for j in 1..K,
// each passing a different set over. reads/op is the share of picks
// that read a fit view (at their affinity bound), hit% the share of those
// reads that found it cached, not summing the group anew (O(n)). Run:
// go test -run '^$' -bench FitViewRotation -benchtime 20000x -cpu 1 ./balancer/
func BenchmarkFitViewRotation(b *testing.B) {
	for _, n := range []int{64, 512} {
		for _, kind := range []string{"models", "ranges"} {
			for _, k := range []int{2, 4, 6, 8, 16} {
				bal := newBalancer(b, n, balancer.Options{AffinitySeed: 1})
				eps := endpoints(n)
				remember := func(i int, model string, window int) { benchRememberWindow(b, bal, eps[i].Addr, model, window) }
				models := make([]string, k)
				tokens := make([]int, k)
				for j := range k {
					models[j], tokens[j] = "m", (j+1)*1000+500
					if kind == "models" {
						models[j], tokens[j] = fmt.Sprintf("m%d", j), 6000
					}
				}
				for i := range n {
					switch {
					case kind == "models" && i%2 == 1:
						for _, m := range models {
							remember(i, m, 4096)
						}
					case kind == "ranges" && i%(k+1) < k:
						remember(i, "m", (1+i%(k+1))*1000)
					}
				}
				keys := make([]inferlb.Request, 1024)
				for i := range keys {
					keys[i] = inferlb.Request{Service: inferlb.ServiceLLM, Model: models[i%k], PromptTokens: tokens[i%k],
						AffinityKey: uint64(i)*0x9e3779b97f4a7c15 | 1}
				}
				b.Run(fmt.Sprintf("n=%d/%s/K=%d", n, kind, k), func(b *testing.B) {
					var counts testhook.FitCounts
					testhook.SetFitCounts(bal, &counts)
					defer testhook.SetFitCounts(bal, nil)
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						p, err := bal.Pick(&keys[i%(1024/k*k)])
						if err != nil {
							b.Fatal(err)
						}
						p.Done(inferlb.Outcome{})
						i++
					}
					reads, sums := counts.Reads.Load(), counts.Sums.Load()
					b.ReportMetric(float64(reads)/float64(i), "reads/op")
					if reads > 0 {
						b.ReportMetric(100*float64(reads-sums)/float64(reads), "hit%")
					}
				})
			}
		}
	}
}

// BenchmarkPickNotServed prices the not-served memory (notserved.go) in
// Pick+Done of an LLM call over 8 endpoints: a call without a model (the
// baseline, which never looks), one with a model while nothing is
// remembered (one atomic load), while another model is remembered (the
// model's hash and the Balancer's list), and while this model is
// remembered on one endpoint (the group's members checked, and that one
// passed over).
func BenchmarkPickNotServed(b *testing.B) {
	const n = 8
	for _, tc := range []struct {
		name, model, remembered string
	}{
		{"no-model", "", ""},
		{"model/none-remembered", "m", ""},
		{"model/other-remembered", "m", "adapter"},
		{"model/this-remembered", "m", "m"},
	} {
		bal := newBalancer(b, n, balancer.Options{NotServedMemory: balancer.MaxNotServedMemory})
		if tc.remembered != "" {
			for {
				p, err := bal.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: tc.remembered})
				if err != nil {
					b.Fatal(err)
				}
				if p.ID() == endpoints(n)[0].Addr {
					p.Done(inferlb.Outcome{NotServedModel: tc.remembered})
					break
				}
				p.Done(inferlb.Outcome{})
			}
		}
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: tc.model, PromptTokens: 512, MaxOutputTokens: 256}
		b.Run(tc.name, func(b *testing.B) { benchPickDone(b, bal, req) })
	}
}

// BenchmarkDoneModel is Pick+Done of a successful LLM call over 8
// endpoints, with the outcome naming no model, naming it (a hash of the
// name, to tell models apart on multi-model servers: modelfail.go), and
// naming it after another model failed on every endpoint within runLife
// (each success then looks up its model's run under the table's lock).
func BenchmarkDoneModel(b *testing.B) {
	const n = 8
	for _, tc := range []struct {
		name         string
		model        string
		otherFailing bool
	}{
		{"no-model", "", false},
		{"model", "llama-3-8b", false},
		{"model/another-failed", "llama-3-8b", true},
	} {
		bal := newBalancer(b, n, balancer.Options{})
		if tc.otherFailing {
			for range 8 * n {
				p, err := bal.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "adapter"})
				if err != nil {
					b.Fatal(err)
				}
				p.Done(inferlb.Outcome{Err: errors.New("500"), Model: "adapter"})
			}
		}
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: tc.model, PromptTokens: 512, MaxOutputTokens: 256}
		o := inferlb.Outcome{Model: tc.model}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := bal.Pick(req)
				if err != nil {
					b.Fatal(err)
				}
				p.Done(o)
			}
		})
	}
}

// BenchmarkPickLoRA is Pick+Done of a call for a LoRA adapter with the
// servers' telemetry (running, waiting, KV cache), without LoRA readings
// (none: one atomic load more than a pick without a model) and with them:
// every server's one slot taken by another adapter but one in eight
// (filter: candidates drawn again, the key's walk), or by no adapter
// (free: each candidate checked, and the LoRALoad factor). The call
// names a rarely asked adapter, so with readings it walks to the
// adapter's home (Options.AdapterHomes); free/no-homes draws two
// candidates as before homes. Flat in n.
func BenchmarkPickLoRA(b *testing.B) {
	for _, n := range benchSizes[:2] {
		// free/no-homes: with AdapterHomes off, the call draws two
		// candidates; otherwise "math", rarely asked, walks to its home.
		for _, mode := range []string{"none", "filter", "free", "free/no-homes"} {
			clock := testutil.NewClock()
			opts := balancer.Options{Clock: clock}
			if mode == "free/no-homes" {
				opts.AdapterHomes = -1
			}
			bal := newBalancer(b, n, opts)
			for i, ep := range endpoints(n) {
				s := telemetry.Sample{Time: clock.Now()}
				s.Set(telemetry.Running, float64(8+i%5))
				s.Set(telemetry.Waiting, float64(i%3))
				s.Set(telemetry.KVCacheUsage, 0.5+0.1*float64(i%5))
				switch {
				case mode == "filter" && i%8 != 0:
					s.SetAdapters(1, &telemetry.Adapters{Base: "llama", Running: []string{"sql"}})
				case mode != "none":
					s.SetAdapters(1, &telemetry.Adapters{Base: "llama"})
				}
				bal.Publish(ep.Addr, s)
			}
			req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "math", PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("n=%d/%s", n, mode), func(b *testing.B) { benchPickDone(b, bal, req) })
		}
	}
}

// BenchmarkPickManyModels is Pick+Done on a fleet of 16 whose every
// endpoint lists the same models (a base model and its LoRA adapters in
// the "model" label): a call's cost must not grow with the models
// listed. Update is the cost of a membership change on such a fleet.
func BenchmarkPickManyModels(b *testing.B) {
	for _, models := range []int{1, 200, 2000} {
		names := make([]string, models)
		for i := range names {
			names[i] = fmt.Sprintf("adapter-%d", i)
		}
		label := strings.Join(names, ",")
		eps := endpoints(16)
		for i := range eps {
			eps[i].Labels = map[string]string{"model": label}
		}
		bal := balancer.New(balancer.Options{Rand: testutil.NewRand(1)})
		b.Cleanup(bal.Close)
		if err := bal.Update(eps); err != nil {
			b.Fatal(err)
		}
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: names[models/2], PromptTokens: 512, MaxOutputTokens: 256}
		b.Run(fmt.Sprintf("models=%d/pick", models), func(b *testing.B) { benchPickDone(b, bal, req) })
		b.Run(fmt.Sprintf("models=%d/update", models), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				eps[0].Weight = float64(1 + i%2) // a change, so the groups are built again
				if err := bal.Update(eps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickDistinctModels is BenchmarkPickManyModels with groups of
// different members: 32 endpoints serve a base model, and each LoRA
// adapter is on 2 or 3 of them, so every endpoint is in a group per
// adapter set it holds (about 160 with 2,000 adapters). A call for the
// base model or an adapter, with an affinity key, must not cost more with
// more adapters; Update builds a ring per adapter set.
func BenchmarkPickDistinctModels(b *testing.B) {
	for _, adapters := range []int{1, 100, 500, 2000} {
		r := rand.New(rand.NewPCG(1, 2))
		lists := make([][]string, 32)
		for i := range lists {
			lists[i] = []string{"base"}
		}
		for a := range adapters {
			for _, k := range r.Perm(32)[:2+a%2] {
				lists[k] = append(lists[k], fmt.Sprintf("adapter-%d", a))
			}
		}
		eps := endpoints(32)
		for i := range eps {
			eps[i].Labels = map[string]string{"model": strings.Join(lists[i], ",")}
		}
		bal := balancer.New(balancer.Options{Rand: testutil.NewRand(1)})
		b.Cleanup(bal.Close)
		if err := bal.Update(eps); err != nil {
			b.Fatal(err)
		}
		for _, model := range []string{"base", fmt.Sprintf("adapter-%d", adapters/2)} {
			req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: 12345, PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("adapters=%d/%s", adapters, strings.TrimSuffix(model, fmt.Sprint("-", adapters/2))), func(b *testing.B) { benchPickDone(b, bal, req) })
		}
		b.Run(fmt.Sprintf("adapters=%d/update", adapters), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				eps[0].Weight = float64(1 + i%2) // a change, so the groups are built again
				if err := bal.Update(eps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickLoRARunning is Pick+Done of a call for an adapter over 16
// endpoints whose readings have 1, 16 or 64 adapters running (the most a
// source keeps, telemetry.MaxAdapterNames) and free slots, while this
// process holds calls of 8 other adapters on each (every loraFlight entry
// taken): each candidate's slots are checked against both.
func BenchmarkPickLoRARunning(b *testing.B) {
	for _, names := range []int{1, 16, 64} {
		clock := testutil.NewClock()
		bal := newBalancer(b, 16, balancer.Options{Clock: clock, AdapterHomes: -1})
		running := make([]string, names)
		for i := range running {
			running[i] = fmt.Sprintf("running-%d", i)
		}
		for _, ep := range endpoints(16) {
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, 8)
			s.Set(telemetry.KVCacheUsage, 0.5)
			s.SetAdapters(float64(names+100), &telemetry.Adapters{Base: "llama", Running: running})
			bal.Publish(ep.Addr, s)
		}
		var held []balancer.Pick
		for range 2000 { // 125 calls of each of 8 adapters per endpoint
			for a := range 8 {
				p, err := bal.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("mine-%d", a)})
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, p)
			}
		}
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "asked", PromptTokens: 512, MaxOutputTokens: 256}
		b.Run(fmt.Sprintf("running=%d", names), func(b *testing.B) { benchPickDone(b, bal, req) })
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
	}
}

// BenchmarkPickAsleep is BenchmarkPickTelemetry with one endpoint in four
// asleep (telemetry.Asleep, vLLM's sleep mode): what its redraws and checks
// add to a pick. Against BenchmarkPickTelemetry in the same run.
func BenchmarkPickAsleep(b *testing.B) {
	for _, n := range benchSizes[:2] {
		bal := loadedFleet(b, n, true)
		for _, svc := range []inferlb.Service{inferlb.ServiceLLM, inferlb.ServiceEmbedding} {
			req := &inferlb.Request{Service: svc, PromptTokens: 512, MaxOutputTokens: 256}
			b.Run(fmt.Sprintf("%v/n=%d", svc, n), func(b *testing.B) { benchPickDone(b, bal, req) })
		}
	}
}
