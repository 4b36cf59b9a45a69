package fleetsim

import (
	"fmt"
	"slices"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/scoring"
)

// Policies returns the policies every LLM scenario compares, in table order:
// generic baselines, the real inferlb Balancer by default and with parts
// switched off, and the oracle.
func Policies() []Policy {
	return []Policy{
		RoundRobin(),
		Random(),
		LeastRequest(),
		RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb -affinity", Options: affinityOff}),
		InferLB(Variant{Name: "inferlb -telemetry", NoTelemetry: true}),
		InferLB(Variant{Name: "inferlb -affinity -telemetry", Options: affinityOff, NoTelemetry: true}),
		Oracle(),
	}
}

func affinityOff() balancer.Options { return balancer.Options{Affinity: balancer.AffinityOff} }

// scanOff is inferlb with two random choices for every call, as before
// embeddings and rerankers compared every endpoint (Options.ScanLimit).
func scanOff() balancer.Options { return balancer.Options{ScanLimit: -1} }

func fleet(n int, p ServerParams) []ReplicaSpec {
	out := make([]ReplicaSpec, n)
	for i := range out {
		out[i] = ReplicaSpec{Server: p, Speed: 1}
	}
	return out
}

// Default timing: Prometheus-style scrapes every second would be optimistic
// for a library that scrapes each server itself; llm-d's endpoint picker
// refreshes every 50ms from inside the cluster. One second sits between a
// sidecar-free client and a Prometheus server's 15s default.
const (
	defaultScrape    = time.Second
	defaultDiscovery = 10 * time.Second // Kubernetes readiness: periodSeconds 10, one failure
)

// Scenarios returns every scenario, in the order the command lists them.
func Scenarios() []*Scenario {
	return []*Scenario{
		SharedPrefixScenario(),
		EmbeddingScenario(),
		UnauthorizedScenario(),
		UnauthorizedChatScenario(),
		TenantRolloutScenario(),
		MultiClientScenario(),
		ChatScenario(),
		MixScenario(),
		DataParallelScenario(),
		DPChatScenario(),
		HotPromptScenario(),
		FailuresScenario(),
		SheddingScenario(),
		LoRAScenario(),
		ManyLoRAScenario(),
		ModelFailureScenario(),
		ModelFailureEverywhereScenario(),
		LoRASlotsScenario(),
		ContextWindowsScenario(),
		TenantsScenario(),
		PartialTelemetryScenario(),
		HungScenario(),
	}
}

// Lookup returns the scenario called name, or nil.
func Lookup(name string) *Scenario {
	i := slices.IndexFunc(Scenarios(), func(s *Scenario) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return Scenarios()[i]
}

// Quick returns a copy of sc shrunk to run in seconds: a shorter window and
// the headline rate only. Each incident keeps its place: one in the warm-up
// at the same share of it, one in the measured window at the same share of
// that, so a model that fails and recovers within the window does so
// within the quick one.
func (sc *Scenario) Quick() *Scenario {
	q := *sc
	q.Rates = []float64{sc.Headline}
	q.Warmup = sc.Warmup / 2
	q.Duration = q.Warmup + (sc.Duration-sc.Warmup)/3
	q.Drain = sc.Drain / 2
	var evs []FleetEvent
	for _, ev := range sc.Events {
		if ev.At < sc.Warmup {
			ev.At /= 2
		} else {
			ev.At = q.Warmup + (ev.At-sc.Warmup)/3
		}
		evs = append(evs, ev)
	}
	q.Events = evs
	return &q
}

// SharedPrefixScenario is llm-d's precise prefix-cache benchmark shape: 8
// replicas of a 32B model, 150 groups x 5 users, 6,000-token shared context,
// 1,200-token question, 1,000-token answer, Poisson arrivals. The groups'
// contexts (900k tokens) exceed one replica's KV cache (300k) three times but
// fit the fleet's, so a router that keeps each group on one replica turns
// most prefill into cache hits, and one that scatters them cannot.
func SharedPrefixScenario() *Scenario {
	return &Scenario{
		Name:        "shared-prefix",
		Description: "150 groups x 5 users, 6k shared context + 1.2k question -> 1k answer, 8 replicas (llm-d's benchmark)",
		Fleet:       fleet(8, LLMServer()),
		Workload: func(rate float64) Workload {
			return &SharedPrefix{Groups: 150, Users: 5, Context: 6000, Question: 1200, Output: 1000, Rate: rate}
		},
		Rates:    []float64{4, 8, 12, 16, 18, 20, 24},
		RateUnit: "req/s",
		Headline: 16,
		Warmup:   90 * time.Second, Duration: 390 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: Policies(),
	}
}

// MultiClientScenario is the shared-prefix workload at its headline rate sent
// through 1 and through 8 independent clients (no shared state).
func MultiClientScenario() *Scenario {
	sc := SharedPrefixScenario()
	sc.Name = "multi-client"
	sc.Description = "shared-prefix at its headline rate through 1 and 8 independent client balancers"
	sc.Rates = []float64{sc.Headline}
	sc.Clients = []int{1, 8}
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb -affinity", Options: affinityOff}),
	}
	return sc
}

// EmbeddingScenario is embedding and rerank traffic on 6 replicas, one of
// them three times slower (an older GPU or a noisy neighbour). "inferlb
// -scan" compares two random endpoints per call (Options.ScanLimit -1)
// where inferlb compares all six.
func EmbeddingScenario() *Scenario {
	fl := fleet(6, EmbeddingServer())
	fl[5].Speed = 3
	return &Scenario{
		Name:        "embedding",
		Description: "80% embeddings (64-512 tokens), 20% rerank (20 docs x 150 tokens), 6 replicas, one 3x slower",
		Fleet:       fl,
		Workload: func(rate float64) Workload {
			return &Pooling{Rate: rate, Rerank: 0.2, EmbedTokens: [2]int{64, 512}, Docs: 20, DocToken: 150}
		},
		Rates:    []float64{100, 200, 300, 350, 400},
		RateUnit: "req/s",
		Headline: 300,
		Warmup:   10 * time.Second, Duration: 70 * time.Second, Drain: 60 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: []Policy{
			RoundRobin(), Random(), LeastRequest(),
			InferLB(Variant{Name: "inferlb"}),
			InferLB(Variant{Name: "inferlb -scan", Options: scanOff}),
			Oracle(),
		},
	}
}

// UnauthorizedScenario is the embedding workload on 6 replicas of which
// one was started with the wrong API key (or sits behind a gateway
// without the route): it answers every call 401 in a millisecond, with no
// GPU work. Its answers are the fastest of the fleet and it never holds a
// call, so a policy that prices latency or calls in flight sends it calls
// that fail; "inferlb client-error-as-success" reads the 401 as a success,
// as the adapters did before 2026-12-07, where inferlb reads it as
// inferlb.Outcome.ClientError.
func UnauthorizedScenario() *Scenario {
	fl := fleet(6, EmbeddingServer())
	fl[0].Unauthorized = true
	return &Scenario{
		Name:        "unauthorized",
		Description: "80% embeddings (64-512 tokens), 20% rerank (20 docs x 150 tokens), 6 replicas, r0 answers every call 401 in 1 ms",
		Fleet:       fl,
		Workload: func(rate float64) Workload {
			return &Pooling{Rate: rate, Rerank: 0.2, EmbedTokens: [2]int{64, 512}, Docs: 20, DocToken: 150}
		},
		Rates:    []float64{100, 300},
		RateUnit: "req/s",
		Headline: 300,
		Warmup:   10 * time.Second, Duration: 70 * time.Second, Drain: 60 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: []Policy{
			RoundRobin(), Random(), LeastRequest(),
			InferLB(Variant{Name: "inferlb"}),
			InferLB(Variant{Name: "inferlb client-error-as-success", ClientErrorAsSuccess: true}),
			InferLB(Variant{Name: "inferlb -scan", Options: scanOff}),
			Oracle(),
		},
	}
}

// UnauthorizedChatScenario is the chat workload on 8 replicas of which r0
// answers every call 401 in a millisecond, as in UnauthorizedScenario.
// Chats carry prefix keys, so the affinity walk, not two choices, picks
// most of their calls: each conversation goes to the owner of its key,
// and r0 owns an eighth of them. Before 2026-12-07 the walk took an owner
// without reading its share of client errors, and every call of those
// conversations failed.
func UnauthorizedChatScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "unauthorized-chat"
	sc.Description = "multi-turn chat (as chat), 8 replicas, r0 answers every call 401 in 1 ms"
	sc.Fleet[0].Unauthorized = true
	// Seven replicas serve: well below chat's saturation of eight.
	sc.Rates = []float64{20, 40}
	sc.Headline = 40
	sc.Policies = []Policy{
		RoundRobin(), Random(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb -affinity", Options: affinityOff}),
		InferLB(Variant{Name: "inferlb client-error-as-success", ClientErrorAsSuccess: true}),
		Oracle(),
	}
	return sc
}

// TenantRolloutScenario is the chat workload from four tenants, a
// quarter of the sessions each, on 8 replicas of which r0 answers tenant
// A's calls 401 in a millisecond (A's API key is not provisioned there
// yet, during a key rollout) and serves the other tenants'. inferlb
// reports each outcome's tenant (inferlb.Outcome.Tenant), as the HTTP and
// gRPC adapters do, and its memory of the tenants' refusals passes r0
// over for A's calls only; "inferlb no-tenant-memory" leaves the tenant
// out, as before that memory, and has only r0's one share of client
// errors, which either leaves A's calls going to r0 or shuns r0 for
// every tenant.
func TenantRolloutScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "tenant-rollout"
	sc.Description = "multi-turn chat (as chat) from 4 tenants, a quarter of the sessions each, 8 replicas, r0 answers tenant A's calls 401 in 1 ms and serves the others'"
	sc.Fleet[0].RefusesTenants = []string{"A"}
	sc.Workload = func(rate float64) Workload {
		w := ChatScenario().Workload(rate).(*Chat)
		w.Tenants = []string{"A", "B", "C", "D"}
		return w
	}
	sc.Rates = []float64{20, 40}
	sc.Headline = 40
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb no-tenant-memory", NoTenantMemory: true}),
		Oracle(),
	}
	return sc
}

// ChatRerender is the chat workloads' default Chat.Rerender: a quarter of
// sessions go through a client that re-renders the history it resends, so
// their follow-ups hit the cache up to the previous user message but not
// into the previous answer (benchmarks/README.md says why a quarter). The
// command's -chat-rerender sets another share; 0 is the workload as it was
// before the field, every answer quoted token for token.
const ChatRerender = 0.25

// SetChatRerender makes every Chat workload of the scenario re-render the
// given share of its sessions (Chat.Rerender); other workloads are left as
// they are.
func (sc *Scenario) SetChatRerender(share float64) {
	build := sc.Workload
	sc.Workload = func(rate float64) Workload {
		w := build(rate)
		if c, ok := w.(*Chat); ok {
			c.Rerender = share
		}
		return w
	}
}

// ChatScenario is multi-turn conversations on 8 replicas; ChatRerender of
// the sessions re-render their history.
func ChatScenario() *Scenario {
	return &Scenario{
		Name:        "chat",
		Description: "multi-turn chat: 3-12 turns, 1.5k-token system prompt (4 apps), 50-400-token messages, 100-600-token answers, 5s think time, 1 session in 4 re-renders its history",
		Fleet:       fleet(8, LLMServer()),
		Workload: func(rate float64) Workload {
			return &Chat{Rate: rate, Apps: 4, System: 1500, MinTurns: 3, MaxTurns: 12,
				MinUser: 50, MaxUser: 400, MinAnswer: 100, MaxAnswer: 600, Think: 5 * time.Second,
				Rerender: ChatRerender}
		},
		Rates:    []float64{10, 20, 30, 40, 50},
		RateUnit: "req/s",
		Headline: 50,
		Warmup:   120 * time.Second, Duration: 420 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: Policies(),
	}
}

// MixScenario is heavy and light requests on a heterogeneous fleet: six
// nominal replicas, one 1.5x and one 2x slower.
func MixScenario() *Scenario {
	fl := fleet(8, LLMServer())
	fl[6].Speed, fl[7].Speed = 1.5, 2
	return &Scenario{
		Name:        "mix",
		Description: "15% heavy (6-12k prompt, 800-1.5k answer), 85% light (200-1k prompt, 50-300 answer), no shared prefixes; 2 of 8 replicas 1.5x/2x slower",
		Fleet:       fl,
		Workload: func(rate float64) Workload {
			return &Mix{Rate: rate, Heavy: 0.15,
				HeavyPrompt: [2]int{6000, 12000}, HeavyOut: [2]int{800, 1500},
				LightPrompt: [2]int{200, 1000}, LightOut: [2]int{50, 300}}
		},
		Rates:    []float64{10, 15, 20, 25, 30},
		RateUnit: "req/s",
		Headline: 20,
		Warmup:   60 * time.Second, Duration: 360 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: Policies(),
	}
}

// DataParallelScenario is the heavy/light mix on two engines of 8
// data-parallel attention ranks each (a MoE model served with DP attention,
// as SGLang, vLLM and TensorRT-LLM do for DeepSeek-class models): every
// forward step is collective, so it lasts as long as the busiest rank's, and
// a request that lands on an already busy rank slows its whole engine.
func DataParallelScenario() *Scenario {
	fl := fleet(16, LLMServer())
	for i := range fl {
		fl[i].DPGroup = 1 + i/8
	}
	mix := MixScenario()
	return &Scenario{
		Name:        "data-parallel",
		Description: "the heavy/light mix on 2 engines x 8 data-parallel attention ranks that step together (a step lasts as long as its busiest rank's)",
		Fleet:       fl,
		Workload:    mix.Workload,
		Rates:       []float64{10, 15, 20, 25, 30},
		RateUnit:    "req/s",
		Headline:    20,
		Warmup:      60 * time.Second, Duration: 360 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: dpPolicies(),
	}
}

// dpPolicies are Policies with two more baselines for data-parallel
// engines: least-request and consistent hashing shown every rank as an
// endpoint, as vLLM's external data-parallel mode (one server per rank)
// shows them to any balancer, beside the default deployment (one endpoint
// per engine, its front end picking the rank) the other baselines meet.
// A fleet can be deployed either way, so each baseline's better figure
// is the one to compare.
func dpPolicies() []Policy {
	ps := Policies()
	out := make([]Policy, 0, len(ps)+2)
	for _, p := range ps {
		out = append(out, p)
		if p.Name == "consistent-hash" {
			out = append(out, everyRank(LeastRequest()), everyRank(RingHash()))
		}
	}
	return out
}

// everyRank is p shown every data-parallel rank as an endpoint.
func everyRank(p Policy) Policy {
	p.Name += " +ranks"
	p.SeesRanks = true
	return p
}

// DPChatScenario is the chat workload on the data-parallel engines: prefix
// affinity and the engines' step barrier at once, as a DeepSeek-class model
// served with DP attention and prefix caching sees multi-turn traffic.
func DPChatScenario() *Scenario {
	sc, chat := DataParallelScenario(), ChatScenario()
	sc.Name = "dp-chat"
	sc.Description = "the chat workload on 2 engines x 8 data-parallel attention ranks that step together"
	sc.Workload = chat.Workload
	sc.Rates, sc.Headline = []float64{20, 40, 60, 80}, 80
	sc.Warmup, sc.Duration, sc.Drain = chat.Warmup, chat.Duration, chat.Drain
	return sc
}

// HotPromptScenario is half the traffic carrying one popular 3,000-token
// system prompt.
func HotPromptScenario() *Scenario {
	return &Scenario{
		Name:        "hot-prompt",
		Description: "50% of requests share one 3k-token system prompt (+100-500-token message), 50% unrelated 1-4k prompts; 200-500-token answers",
		Fleet:       fleet(8, LLMServer()),
		Workload: func(rate float64) Workload {
			return &HotPrompt{Rate: rate, Hot: 0.5, System: 3000,
				User: [2]int{100, 500}, Other: [2]int{1000, 4000}, Output: [2]int{200, 500}}
		},
		Rates:    []float64{20, 30, 40, 50},
		RateUnit: "req/s",
		Headline: 30,
		Warmup:   60 * time.Second, Duration: 360 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: Policies(),
	}
}

// FailuresScenario is the chat workload on a fleet that misbehaves: one
// replica crashes and comes back cold a minute later, one runs 4x slower for
// two minutes, one sheds load with 429 whenever more than 4 requests wait.
// Besides the plain baselines (an HTTP client's endpoint list, no
// connection state) it runs each with grpc-go's connection state
// (WithConnState), as grpc-go's own policies would see the crash.
func FailuresScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "failures"
	sc.Description = "chat at 40 req/s; r0 crashes at 150s (back at 210s, cold), r1 4x slower 180-300s, r2 answers 429 beyond 4 waiting from 120s"
	sc.Rates = []float64{40}
	sc.Headline = 40
	for i := range sc.Fleet {
		sc.Fleet[i].Server.RetryAfter = time.Second
	}
	sc.Fleet[2].Server.MaxWaiting = 4
	sc.Events = []FleetEvent{
		{At: 150 * time.Second, Replica: 0, Kind: Crash},
		{At: 210 * time.Second, Replica: 0, Kind: Restart},
		{At: 180 * time.Second, Replica: 1, Kind: SlowDown, Factor: 4},
		{At: 300 * time.Second, Replica: 1, Kind: Recover},
		{At: 120 * time.Second, Replica: 2, Kind: ThrottleOn},
	}
	base := []Policy{RoundRobin(), Random(), LeastRequest(), RingHash()}
	sc.Policies = append([]Policy(nil), base...)
	for _, p := range base {
		sc.Policies = append(sc.Policies, WithConnState(p))
	}
	for _, p := range Policies() {
		if !slices.ContainsFunc(base, func(b Policy) bool { return b.Name == p.Name }) {
			sc.Policies = append(sc.Policies, p)
		}
	}
	return sc
}

// SheddingScenario is the chat workload on a fleet whose every replica
// sheds load beyond 4 waiting requests with an overload answer that carries
// no hint: the 503 of Triton's max_queue_size, SGLang's
// --max-queued-requests and Ollama's OLLAMA_MAX_QUEUE. The rates run past
// what the fleet can take. inferlb reads the answer as an overload (the
// replica cools down for the default time); "inferlb shed-as-failure"
// reads it as a failure, as the adapters did before 2026-12-05, so five in
// a row open a replica's breaker and eject it.
func SheddingScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "shedding"
	sc.Description = "chat; every replica answers 503 (queue full, no Retry-After) beyond 4 waiting requests"
	sc.Rates = []float64{40, 50, 60}
	sc.Headline = 60
	sc.Events = nil
	for i := range sc.Fleet {
		sc.Fleet[i].Server.MaxWaiting = 4
		sc.Fleet[i].Server.RetryAfter = 0
		sc.Events = append(sc.Events, FleetEvent{At: 0, Replica: i, Kind: ThrottleOn})
	}
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb shed-as-failure", ShedAsFailure: true}),
	}
	return sc
}

// Adapters are the LoRA adapters of the lora scenario.
var Adapters = []string{"lora-sql", "lora-support", "lora-summary", "lora-code"}

// LoRAScenario is the chat workload on a fleet whose replicas each load
// one LoRA adapter of the base model (vLLM --lora-modules): 40% of the
// sessions ask for one of 4 adapters, each loaded on 2 of the 8 replicas
// (r0 and r4 lora-sql, r1 and r5 lora-support, ...), and the replicas
// without it answer at once that the model does not exist (vLLM's 404).
// Discovery says nothing of which replica has which adapter, the case the
// balancer's not-served memory is for; "inferlb labels" is told, by the
// model label, which bounds what the memory can do. How each policy reads
// the 404:
//
//   - inferlb reports it as Outcome.NotServedModel and sends the call on
//     (PickRetry), up to 8 times, as the HTTP transport does;
//   - "inferlb one retry" sends it on once, as the transport did on the
//     day the memory landed;
//   - "inferlb not-served-as-success" reports it as a success and does not
//     send it on, as the adapters did before 2026-12-05: the caller gets
//     the 404;
//   - the baselines take it for a failure and retry once, as they retry
//     any failed call, on a new pick (consistent hashing: the same owner).
//
// A failed turn ends its conversation, as in the other chat scenarios.
func LoRAScenario() *Scenario {
	sc := ChatScenario()
	chat := sc.Workload
	sc.Name = "lora"
	sc.Description = "chat; 40% of sessions ask for one of 4 LoRA adapters, each loaded on 2 of 8 replicas (undeclared); the others answer 404 at once"
	sc.Workload = func(rate float64) Workload {
		w := chat(rate).(*Chat)
		w.Adapters, w.AdapterShare = Adapters, 0.4
		return w
	}
	for i := range sc.Fleet {
		sc.Fleet[i].Models = []string{Model, Adapters[i%len(Adapters)]}
	}
	sc.Rates = []float64{30, 40, 50}
	sc.Headline = 40
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb one retry", NotServedHops: 1}),
		InferLB(Variant{Name: "inferlb not-served-as-success", NotServedAsSuccess: true}),
		InferLB(Variant{Name: "inferlb labels", ModelLabels: true}),
	}
	return sc
}

// ManyLoRAScenario is the lora scenario with 32 adapters, adapter j on
// replicas j mod 8 and j+4 mod 8: each replica has 8 and lacks 24, so the
// memory must hold 192 (replica, adapter) pairs, which a memory of a few
// models per endpoint cannot (see balancer/notserved.go).
func ManyLoRAScenario() *Scenario {
	sc := LoRAScenario()
	sc.Name = "lora-many"
	sc.Description = "chat; 40% of sessions ask for one of 32 LoRA adapters, each loaded on 2 of 8 replicas (undeclared); the others answer 404 at once"
	adapters := make([]string, 32)
	for j := range adapters {
		adapters[j] = fmt.Sprintf("lora-%02d", j)
	}
	chat := sc.Workload
	sc.Workload = func(rate float64) Workload {
		w := chat(rate).(*Chat)
		w.Adapters = adapters
		return w
	}
	n := len(sc.Fleet)
	for i := range sc.Fleet {
		ms := []string{Model}
		for j, a := range adapters {
			if j%n == i || (j+n/2)%n == i {
				ms = append(ms, a)
			}
		}
		sc.Fleet[i].Models = ms
	}
	sc.Rates = []float64{40}
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb not-served-as-success", NotServedAsSuccess: true}),
		InferLB(Variant{Name: "inferlb labels", ModelLabels: true}),
	}
	return sc
}

// FailingAdapter is the adapter that fails in the model-failure scenarios.
var FailingAdapter = Adapters[0]

// ModelFailureScenario is the chat workload at 40 req/s on a fleet of 8
// replicas that each serve the base model and two LoRA adapters (vLLM
// --lora-modules lora-sql lora-support on every replica): half the
// sessions ask for the base model, a quarter for each adapter. From 150 s
// to 330 s one adapter, FailingAdapter, fails on r0 and r3 (a crashed
// model backend, adapter weights that no longer load): its calls in
// flight there fail at once, and later ones are answered 500 within
// milliseconds, while both replicas serve the base model and the other
// adapter as before. What a good balancer does: the adapter's calls go
// to the other 6 replicas, and the healthy models lose neither a call
// nor r0 and r3. How each policy reads the 500:
//
//   - inferlb names the call's model in the outcome (Outcome.Model), as
//     the HTTP and gRPC adapters do since 2026-12-05, so the balancer can
//     hold the adapter's failures against the adapter on r0 and r3 rather
//     than against the replicas, and retries the call on another replica
//     (PickRetry);
//   - "inferlb no-outcome-model" names none, as the adapters did before:
//     every failure counts against its replica's error rate, breaker and
//     outlier statistics, whatever model it was for;
//   - the baselines retry it once, as any failure, on a new pick
//     (consistent hashing: the same owner, which fails it again).
//
// A failed turn ends its conversation, as in the other chat scenarios.
// The command runs seeds 1-4.
func ModelFailureScenario() *Scenario {
	sc := modelFailureScenario()
	sc.Name = "model-failure"
	sc.Description = "chat at 40 req/s; 8 replicas each serve the base model (50% of sessions) and 2 LoRA adapters (25% each); lora-sql fails (500 at once) on r0 and r3 from 150s to 330s"
	for _, i := range []int{0, 3} {
		sc.Events = append(sc.Events,
			FleetEvent{At: 150 * time.Second, Replica: i, Kind: ModelFail, Model: FailingAdapter},
			FleetEvent{At: 330 * time.Second, Replica: i, Kind: ModelRecover, Model: FailingAdapter})
	}
	return sc
}

// ModelFailureEverywhereScenario is ModelFailureScenario with the adapter
// failing on every replica from 150 s to 330 s: a bad version of it
// rolled out to the fleet, rolled back three minutes later. No policy can
// serve its calls; a good one loses no other call and no replica for it.
func ModelFailureEverywhereScenario() *Scenario {
	sc := modelFailureScenario()
	sc.Name = "model-failure-all"
	sc.Description = "chat at 40 req/s; 8 replicas each serve the base model (50% of sessions) and 2 LoRA adapters (25% each); lora-sql fails (500 at once) on every replica from 150s to 330s"
	for i := range sc.Fleet {
		sc.Events = append(sc.Events,
			FleetEvent{At: 150 * time.Second, Replica: i, Kind: ModelFail, Model: FailingAdapter},
			FleetEvent{At: 330 * time.Second, Replica: i, Kind: ModelRecover, Model: FailingAdapter})
	}
	return sc
}

// modelFailureScenario is the fleet, workload and policies of the
// model-failure scenarios, without the failure.
func modelFailureScenario() *Scenario {
	sc := ChatScenario()
	chat := sc.Workload
	sc.Workload = func(rate float64) Workload {
		w := chat(rate).(*Chat)
		w.Adapters, w.AdapterShare = Adapters[:2], 0.5
		return w
	}
	for i := range sc.Fleet {
		sc.Fleet[i].Models = append([]string{Model}, Adapters[:2]...)
	}
	sc.Rates = []float64{40}
	sc.Headline = 40
	sc.Seeds = 4
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb no-outcome-model", NoOutcomeModel: true}),
	}
	return sc
}

// Context windows of the context-windows scenario's replicas.
const (
	SmallWindow = 8192
	LargeWindow = 32768
)

// ContextWindowsScenario is single-turn traffic on 8 replicas of one
// model whose context windows differ: r0-r3 were started with
// --max-model-len 8192, r4-r7 with 32768 (Qwen3-32B's native window), as
// a fleet is whose pods come from two node pools or two deployment
// templates, one of them sized for more sequences per GPU rather than
// long prompts. Discovery lists them in that order (pools named apart
// sort apart) and says nothing of the windows. 15% of the calls carry a
// long document or retrieved context: 8,000-24,000 prompt tokens and up
// to 1,000 output tokens, so every one needs more than 8,192 tokens and
// only r4-r7 take it; the rest are chat-sized (200-3,000 prompt tokens,
// up to 500 output tokens), which any replica takes. Replicas are
// otherwise alike (LLMServer), so the windows alone set them apart. At
// 10 req/s the fleet is below saturation (~38,000 prefill tokens/s of
// 160,000; the long calls' ~24,000 on the large half's 80,000, whose KV
// caches they fill first: at 16 req/s the large half saturates), and a
// router must put the long calls where they fit without piling the
// short ones there too. A small replica refuses a long call with a 400
// within windowRefusalDelay, before any work. How each policy reads it:
//
//   - inferlb reports Outcome{ContextWindow, Model} and sends the call on
//     with PickRetry (its Request's token counts the true ones), up to 8
//     hops, as the HTTP transport does since fc4a845; the Balancer
//     remembers each small replica's window and later long calls pass
//     them over;
//   - "inferlb no-window" reports the refusal as a failure (Outcome.Err)
//     and retries it once with PickRetry, as any failure: a client whose
//     adapter does not read the 400 and whose retry policy retries it;
//   - the baselines take it for a failure and retry once, on a new pick
//     (consistent hashing: the same owner, which refuses it again);
//   - the oracle knows the windows and never meets a refusal.
//
// The command runs seeds 1-4.
func ContextWindowsScenario() *Scenario {
	mix := MixScenario()
	fl := fleet(8, LLMServer())
	for i := range fl {
		fl[i].Server.MaxModelLen = LargeWindow
		if i < 4 {
			fl[i].Server.MaxModelLen = SmallWindow
		}
	}
	return &Scenario{
		Name:        "context-windows",
		Description: "15% long calls (8-24k prompt, <=1k answer), 85% chat-sized (200-3k prompt, <=500 answer); 4 of 8 replicas have an 8,192-token window (a 400 at once to longer calls), 4 have 32,768",
		Fleet:       fl,
		Workload: func(rate float64) Workload {
			return &Mix{Rate: rate, Heavy: 0.15,
				HeavyPrompt: [2]int{8000, 24000}, HeavyOut: [2]int{200, 1000},
				LightPrompt: [2]int{200, 3000}, LightOut: [2]int{50, 500}}
		},
		Rates:    []float64{10},
		RateUnit: "req/s",
		Headline: 10,
		Warmup:   mix.Warmup, Duration: mix.Duration, Drain: mix.Drain,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Seeds: 4,
		Policies: []Policy{
			RoundRobin(), Random(), LeastRequest(), RingHash(),
			InferLB(Variant{Name: "inferlb"}),
			InferLB(Variant{Name: "inferlb no-window", NoWindow: true}),
			Oracle(),
		},
	}
}

// TenantsScenario is 12 quiet tenants and one that floods the fleet; the
// offered load swept is the noisy tenant's. inferlb with shuffle sharding
// (TenantShardSize 2 of 8) is compared with the same Balancer without it.
func TenantsScenario() *Scenario {
	shard := func() balancer.Options { return balancer.Options{TenantShardSize: 2} }
	return &Scenario{
		Name:        "tenants",
		Description: "12 quiet tenants (1 req/s each: own 2k-token system prompt + 200-token question -> 200 tokens) and one noisy tenant (8k-token unique prompts -> 1k tokens), 8 replicas",
		Fleet:       fleet(8, LLMServer()),
		Workload: func(rate float64) Workload {
			return &Tenants{Quiet: 12, QuietRate: 1, NoisyRate: rate,
				System: 2000, Question: 200, Answer: 200, NoisyPrompt: 8000, NoisyOut: 1000}
		},
		Rates:    []float64{0, 4, 8, 16},
		RateUnit: "noisy req/s",
		Headline: 16,
		Warmup:   60 * time.Second, Duration: 300 * time.Second, Drain: 300 * time.Second,
		Scrape: defaultScrape, DiscoveryDelay: defaultDiscovery,
		Policies: []Policy{
			RoundRobin(), LeastRequest(),
			InferLB(Variant{Name: "inferlb"}),
			InferLB(Variant{Name: "inferlb shards=2", Options: shard}),
		},
	}
}

// SlotAdapters are the LoRA adapters of the lora-slots scenario, most
// popular first, and SlotClasses their request classes.
var (
	SlotAdapters = func() []string {
		out := make([]string, 12)
		for k := range out {
			out[k] = fmt.Sprintf("lora-%02d", k)
		}
		return out
	}()
	SlotClasses = []string{"hot", "hot", "warm", "warm", "warm", "warm", "cold", "cold", "cold", "cold", "cold", "cold"}
)

// slotWeights are Zipf's law with exponent 1 over the adapters: the k-th
// most popular is asked for 1/k as often as the first, so the 2 hot
// adapters take 48% of adapter sessions, the 4 warm ones 31% and the 6
// cold ones 21%.
func slotWeights(n int) []float64 {
	w := make([]float64, n)
	for k := range w {
		w[k] = 1 / float64(k+1)
	}
	return w
}

// NoLoRA is the balancer with the LLM scorer's LoRA factors off
// (scoring.LLM LoRALoad and LoRAWait 1), through the scoring options: it
// receives the servers' adapter telemetry as the default does, and does
// nothing with it (the balancer's passing over of endpoints whose slots
// are full goes with LoRAWait).
func NoLoRA() balancer.Options {
	return balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{
		inferlb.ServiceLLM: &scoring.LLM{LoRALoad: 1, LoRAWait: 1},
	}}
}

// LoRASlotsScenario is the chat workload on 8 replicas that each serve
// the base model and the same 12 LoRA adapters (all in vLLM's CPU
// adapter cache, so any replica serves any adapter), with --max-loras 4:
// a batch runs at most 4 adapters, and vLLM's scheduler skips a request
// for a fifth until every running request of one of the 4 has finished,
// while requests behind it and base-model requests go on. An adapter not
// in one of the GPU's 4 slots is loaded for LoRALoadDelay (20 ms) on the
// step that admits it. 75% of sessions ask for an adapter, with Zipf
// popularity; the rest for the base model. The question is slot
// contention, not where an adapter lives: a router that spreads every
// adapter over every replica puts ~10 adapters' requests on each, and
// the hot adapters, always running somewhere in each batch, can hold the
// cold ones waiting for long: vLLM's scheduler is "simple and NOT fair. It
// can lead to starvation of some LoRAs" (its V1 scheduler's comment since
// vllm-project/vllm#9289; #15422 made it skip rather than stop).
//
// Why these figures: --max-loras 4 is the usual explicit setting (vLLM's
// default, 1, would leave 8 slots for 12 adapters in the fleet, and no
// router could avoid waits); a dozen adapters of one base model and Zipf
// popularity is a multi-tenant fine-tune service; 30 req/s is below the
// load where the fleet's compute saturates (the chat scenario runs 50),
// so what the table shows is slot contention, not a queue. A router that reads vllm:lora_requests_info
// (telemetry.Adapters) can send an adapter where it runs or a slot is
// free. Policies: the baselines, inferlb, and "inferlb no-lora", the same
// Balancer with the scoring's LoRA factors off (NoLoRA). The oracle is
// left out: its cost model knows nothing of adapter slots, so it bounds
// nothing here. The command runs seeds 1-4.
func LoRASlotsScenario() *Scenario {
	sc := ChatScenario()
	chat := sc.Workload
	sc.Name = "lora-slots"
	sc.Description = "chat; 8 replicas each serve the base model (25% of sessions) and the same 12 LoRA adapters (75%, Zipf popularity) with --max-loras 4; 20 ms to load an adapter into a GPU slot"
	sc.Workload = func(rate float64) Workload {
		w := chat(rate).(*Chat)
		w.Adapters, w.AdapterShare = SlotAdapters, 0.75
		w.AdapterWeights, w.AdapterClasses = slotWeights(len(SlotAdapters)), SlotClasses
		return w
	}
	for i := range sc.Fleet {
		sc.Fleet[i].Server.MaxLoRAs = 4
		sc.Fleet[i].Server.LoRALoad = LoRALoadDelay
	}
	sc.Rates = []float64{20, 30, 40}
	sc.Headline = 30
	sc.Seeds = 4
	sc.Policies = []Policy{
		RoundRobin(), Random(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb no-homes", Options: NoAdapterHomes}),
		InferLB(Variant{Name: "inferlb no-lora", Options: NoLoRA}),
	}
	return sc
}

// NoAdapterHomes is the balancer with adapter homes off
// (balancer.Options.AdapterHomes -1): every adapter's calls follow their
// sessions' keys, as before 39495eb.
func NoAdapterHomes() balancer.Options {
	return balancer.Options{AdapterHomes: -1}
}

// UnscrapedReplica is the replica of the partial-telemetry scenario whose
// telemetry never reaches the clients.
const UnscrapedReplica = 7

// PartialTelemetryScenario is the chat workload sent through 8 independent
// clients (each its own Balancer and telemetry, as multi-client) to 8
// replicas, one of which, r7, never has its telemetry reach them: its
// /metrics scrape fails (a wrong port, a NetworkPolicy, an exporter that is
// not enabled) or it exports none, while the other 7 are scraped every
// second as usual (ReplicaSpec.Unscraped). The server counts of the 7
// (Running, Waiting) are every client's calls; of r7 each client knows
// only its own, an eighth. A balancer that compared the two as they are
// saw r7 about 8 times lighter than it was, and every client sent it most
// of its calls; inferlb compares a pair of which only one has such a
// reading on this client's calls alone (since b1b8db7). The rates are
// below the chat scenario's headline, where the fleet saturates: a herd
// onto one replica shows as its queue, not the fleet's. Policies: the
// baselines, which read no telemetry and so treat r7 as the others,
// inferlb, whose calls mostly follow their affinity keys' owners, and
// "inferlb -affinity", whose every call is a pairwise comparison of load
// (where the herd showed: before b1b8db7, 18.6% of the calls to r7 at 20
// req/s, and a p99 TTFT of 30.6s at 40). Result.Share gives each
// replica's share of the calls.
func PartialTelemetryScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "partial-telemetry"
	sc.Description = "chat through 8 independent clients; r7's telemetry never reaches them (its /metrics scrape fails), the other 7 are scraped every second"
	sc.Fleet[UnscrapedReplica].Unscraped = true
	sc.Rates = []float64{20, 30, 40}
	sc.Headline = 40
	sc.Clients = []int{8}
	sc.Policies = []Policy{
		RoundRobin(), LeastRequest(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb -affinity", Options: affinityOff}),
	}
	return sc
}

// HungReplica is the replica of the hung scenario whose engine hangs.
const HungReplica = 0

// HungScenario is the chat workload at 30 req/s (below the fleet's
// saturation) on 8 replicas, one of which, r0, hangs at 150 s: its engine
// stops (a stuck NCCL collective, a deadlocked scheduler) while its API
// server accepts calls, sends a stream's headers and answers its /metrics
// scrape with the gauges frozen as of the hang (Hang). A liveness probe
// restarts it at 270 s, cold. Callers give up on a call after 30 s
// (ClientTimeout) with context.Canceled; every call sent to r0 in between
// is lost work, a failed call in the table. Connections stay up and the
// endpoint stays in service discovery, so connection state and readiness
// see nothing; inferlb learns it from Outcome.Unanswered, a run of calls
// abandoned with nothing back (scoring.LLM.MinAbandoned), and "inferlb
// no-unanswered" never sets it, as the adapters did before 2026-12-07.
func HungScenario() *Scenario {
	sc := ChatScenario()
	sc.Name = "hung"
	sc.Description = "chat at 30 req/s; r0's engine hangs at 150s (accepts calls, answers nothing, /metrics frozen but fresh), restarted cold at 270s; callers give up after 30s"
	sc.Rates = []float64{30}
	sc.Headline = 30
	sc.Warmup, sc.Duration, sc.Drain = 120*time.Second, 360*time.Second, 120*time.Second
	sc.ClientTimeout = 30 * time.Second
	sc.Events = []FleetEvent{
		{At: 150 * time.Second, Replica: HungReplica, Kind: Hang},
		{At: 270 * time.Second, Replica: HungReplica, Kind: Crash},
		{At: 270 * time.Second, Replica: HungReplica, Kind: Restart},
	}
	sc.Policies = []Policy{
		RoundRobin(), Random(), LeastRequest(), RingHash(),
		InferLB(Variant{Name: "inferlb"}),
		InferLB(Variant{Name: "inferlb no-unanswered", NoUnanswered: true}),
		InferLB(Variant{Name: "inferlb -affinity", Options: affinityOff}),
		InferLB(Variant{Name: "inferlb -affinity no-unanswered", Options: affinityOff, NoUnanswered: true}),
		Oracle(),
	}
	return sc
}
