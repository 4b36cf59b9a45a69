package fleetsim_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// The tests that run simulations for a second or more under the race
// detector call t.Parallel, so that CI's -race run of this package, which
// came within a minute of go test's 10-minute limit on a loaded machine,
// runs them on both cores. A simulation is one goroutine over its own
// scenario (the Scenario functions build a new one each call); the
// package's variables are never written. The testing package starts them
// only once every other test of the binary has returned, so the live
// server's goleak checks never see them.

// smallSharedPrefix is the shared-prefix scenario cut to run in about a
// second (several under -race): 4 replicas, 60 groups whose contexts
// (360k tokens) exceed one replica's cache, shorter answers.
func smallSharedPrefix() *fleetsim.Scenario {
	sc := fleetsim.SharedPrefixScenario()
	sc.Fleet = sc.Fleet[:4]
	sc.Workload = func(rate float64) fleetsim.Workload {
		return &fleetsim.SharedPrefix{Groups: 60, Users: 5, Context: 6000, Question: 1200, Output: 200, Rate: rate}
	}
	sc.Headline = 24
	sc.Warmup, sc.Duration, sc.Drain = 30*time.Second, 90*time.Second, 60*time.Second
	return sc
}

func smallEmbedding() *fleetsim.Scenario {
	sc := fleetsim.EmbeddingScenario()
	sc.Warmup, sc.Duration, sc.Drain = 5*time.Second, 25*time.Second, 30*time.Second
	return sc
}

func runAt(sc *fleetsim.Scenario, p fleetsim.Policy, clients int, seed uint64) fleetsim.Result {
	return fleetsim.Run(sc, p, fleetsim.RunConfig{
		Rate: sc.Headline, Clients: clients, Seed: seed,
		Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape,
	})
}

func TestSameSeedSameResult(t *testing.T) {
	t.Parallel()
	sc := smallSharedPrefix()
	sc.Warmup, sc.Duration, sc.Drain = 10*time.Second, 40*time.Second, 20*time.Second
	for _, p := range []fleetsim.Policy{fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), fleetsim.Oracle()} {
		a := runAt(sc, p, 3, 7)
		b := runAt(sc, p, 3, 7)
		assert.Equal(t, a, b, "%s: same seed, same result", p.Name)
		assert.Positive(t, a.Completed, p.Name)
	}
	c := runAt(sc, fleetsim.RoundRobin(), 3, 8)
	assert.NotEqual(t, runAt(sc, fleetsim.RoundRobin(), 3, 7), c, "the seed matters")
}

func TestInferLBBeatsRoundRobinOnSharedPrefixes(t *testing.T) {
	t.Parallel()
	sc := smallSharedPrefix()
	rr := runAt(sc, fleetsim.RoundRobin(), 1, 1)
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	t.Logf("round-robin: %.0f tok/s, p90 TTFT %.2fs, hit %.2f", rr.Throughput, rr.TTFTP90, rr.CacheHit)
	t.Logf("inferlb:     %.0f tok/s, p90 TTFT %.2fs, hit %.2f", lb.Throughput, lb.TTFTP90, lb.CacheHit)
	assert.Greater(t, lb.CacheHit, rr.CacheHit+0.3, "affinity keeps shared contexts cached")
	assert.Greater(t, lb.Throughput, 1.3*rr.Throughput)
	assert.Less(t, lb.TTFTP90, rr.TTFTP90/5)
}

// Eight independent callers share nothing but the servers' telemetry. Each
// sees an eighth of the calls, so its own count of an owner's calls says
// little about the owner's load; the bound must read the load the servers
// report, or each caller spills keys at its own moments and the fleet's
// caches hold several copies of many prefixes. Before the bound read it,
// eight callers lost 4.6-6.5 points of cache hits against one (and p90 TTFT
// went from 0.05-0.08s to 0.19-0.33s), seeds 1-3.
func TestManyCallersKeepTheCacheHitsOfOne(t *testing.T) {
	t.Parallel()
	sc := smallSharedPrefix()
	lb := fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"})
	for seed := uint64(1); seed <= 3; seed++ {
		one, eight := runAt(sc, lb, 1, seed), runAt(sc, lb, 8, seed)
		t.Logf("seed %d: hit %.3f / %.3f, p90 TTFT %.2fs / %.2fs (1 / 8 callers)", seed, one.CacheHit, eight.CacheHit, one.TTFTP90, eight.TTFTP90)
		assert.Greater(t, eight.CacheHit, one.CacheHit-0.03, "seed %d", seed)
		assert.Less(t, eight.TTFTP90, 0.15, "seed %d", seed)
	}
}

func TestInferLBAvoidsASlowEmbeddingReplica(t *testing.T) {
	t.Parallel()
	sc := smallEmbedding()
	rr := runAt(sc, fleetsim.RoundRobin(), 1, 1)
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	t.Logf("p99 latency: round-robin %.3fs, inferlb %.3fs", rr.E2EP99, lb.E2EP99)
	require.Positive(t, lb.Completed)
	assert.Less(t, lb.E2EP99, rr.E2EP99/2, "peak-EWMA latency steers around the 3x slower replica")
}

// twoCalls sends one long prefill (five chunks) and one short chat at once.
type twoCalls struct{}

func (twoCalls) Start(s fleetsim.Sim) {
	s.Submit(&fleetsim.Request{Service: inferlb.ServiceLLM, Prompt: fleetsim.NewPrompt(fleetsim.Segment{ID: 1, Tokens: 40000}), OutputTokens: 1, MaxOutputTokens: 1})
	s.Submit(&fleetsim.Request{Service: inferlb.ServiceLLM, Prompt: fleetsim.NewPrompt(fleetsim.Segment{ID: 2, Tokens: 100}), OutputTokens: 200, MaxOutputTokens: 200})
}

func (twoCalls) Done(fleetsim.Sim, *fleetsim.Request, bool) {}

func TestDataParallelRanksStepTogether(t *testing.T) {
	// Round-robin puts the two calls on different replicas. Independent,
	// the chat decodes at its own pace; as two ranks of one engine, its
	// steps last as long as the other rank's prefill chunks.
	run := func(dpGroup int) fleetsim.Result {
		fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer(), DPGroup: dpGroup}, {Server: fleetsim.LLMServer(), DPGroup: dpGroup}}
		sc := &fleetsim.Scenario{Name: "dp", Fleet: fl, Workload: func(float64) fleetsim.Workload { return twoCalls{} }}
		return fleetsim.Run(sc, fleetsim.RoundRobin(), fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
	}
	alone, coupled := run(0), run(1)
	require.Equal(t, 2, alone.Completed)
	require.Equal(t, 2, coupled.Completed)
	p := fleetsim.LLMServer()
	chunk := (time.Duration(p.MaxBatchedTokens) * p.PerPrefillToken).Seconds() // one full prefill chunk
	assert.Less(t, alone.ITLP99, chunk/4, "an independent replica decodes at its own pace")
	assert.Greater(t, coupled.ITLP99, chunk, "a rank waits for the other rank's prefill chunk every step")
	assert.Greater(t, coupled.E2EP99, alone.E2EP99+chunk, "so the chat ends later")
}

// A fleet that sheds load past capacity with an overload answer and no
// hint (Triton's, SGLang's and Ollama's 503): read as overloads, the
// answers cool a replica down for a second; read as failures, five in a
// row open its breaker and eject it, and the fleet fails more calls with
// fewer replicas. The shedding scenario at its headline rate, past
// capacity (seeds 1-4: 2.0-3.1 times as many failed calls).
func TestShedAnswersAreOverloadsNotFailures(t *testing.T) {
	t.Parallel()
	sc := fleetsim.SheddingScenario()
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	asFailure := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb shed-as-failure", ShedAsFailure: true}), 1, 1)
	t.Logf("failed %d / %d, %.0f / %.0f tok/s (overloads / failures)", lb.Failed, asFailure.Failed, lb.Throughput, asFailure.Throughput)
	require.Positive(t, lb.Failed, "the rate is past what the fleet can take")
	assert.Greater(t, asFailure.Failed, 3*lb.Failed/2)
	assert.Greater(t, lb.Throughput, asFailure.Throughput)
}

// A multi-LoRA fleet that does not declare which replica loaded which
// adapter: a replica without the adapter a call names answers at once that
// the model does not exist. Read as a success, as the adapters did before
// 2026-12-05, that answer reaches the caller as a 404 and the adapter's
// conversations whose calls land there end; reported as not served, the
// call goes on to a replica with the adapter and the balancer keeps the
// others out of that adapter's picks for NotServedMemory (30s), so they
// meet its calls about once per replica and adapter in that time. The lora
// scenario at its headline rate, in a shorter window.
func TestNotServedAnswersAreRememberedNotSuccesses(t *testing.T) {
	t.Parallel()
	sc := fleetsim.LoRAScenario()
	sc.Warmup, sc.Duration, sc.Drain = 30*time.Second, 120*time.Second, 60*time.Second
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	asSuccess := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb not-served-as-success", NotServedAsSuccess: true}), 1, 1)
	t.Logf("of %d / %d calls: failed %d / %d, not-served answers %d / %d, %.0f / %.0f tok/s (not served / success)",
		lb.Requests, asSuccess.Requests, lb.Failed, asSuccess.Failed, lb.NotServed, asSuccess.NotServed, lb.Throughput, asSuccess.Throughput)
	assert.LessOrEqual(t, lb.Failed, lb.Requests/1000, "each call goes on to a replica with its adapter")
	assert.Greater(t, asSuccess.Failed, asSuccess.Requests/50, "read as successes, the 404s reach the callers")
	// 4 adapters x 6 replicas without each: a pair is met again only
	// once its memory has lapsed, at most 4 times in the 90s window (3
	// times in every seed of 1-8).
	pairs := len(fleetsim.Adapters) * (len(sc.Fleet) - 2)
	assert.LessOrEqual(t, lb.NotServed, pairs*4, "the replicas without an adapter do not draw its calls")
	assert.Greater(t, lb.Throughput, 1.2*asSuccess.Throughput, "the adapters' conversations go on")
}

// TestUnauthorizedReplicaIsShunned: a replica with the wrong API key
// answers every call 401 in a millisecond. Read as successes (as the
// adapters did before 2026-12-07) its answers were the fleet's fastest and
// it held no call, so the embedding scan sent it nearly every call, each
// one failed; read as client errors, it draws a few calls a minute. The
// unauthorized scenario at its headline rate, in a shorter window.
func TestUnauthorizedReplicaIsShunned(t *testing.T) {
	t.Parallel()
	sc := fleetsim.UnauthorizedScenario()
	sc.Warmup, sc.Duration, sc.Drain = 10*time.Second, 40*time.Second, 20*time.Second
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	asSuccess := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb client-error-as-success", ClientErrorAsSuccess: true}), 1, 1)
	t.Logf("of %d / %d calls, answered 401: %d / %d (client error / success)", lb.Requests, asSuccess.Requests, lb.Unauthorized, asSuccess.Unauthorized)
	assert.LessOrEqual(t, lb.Unauthorized, lb.Requests/200, "the replica answering 401 is passed over")
	assert.Positive(t, lb.Unauthorized, "and still tried now and then")
	assert.Greater(t, asSuccess.Unauthorized, asSuccess.Requests*9/10, "read as successes, its 401s draw the calls")
	assert.Equal(t, lb.Unauthorized, lb.Failed)
}

// TestUnauthorizedChatReplicaLosesItsConversations: chats carry prefix
// keys, and the affinity walk picks their calls. It took a key's owner
// whatever its share of client errors, so r0, answering 401, kept the
// conversations it owns, and each failed at its first call: with affinity
// inferlb failed more calls than without it (99 against 63 in this
// window). It now passes r0 over as an owner whose breaker is open, and
// fails no more calls than two choices do (61: the trickle r0 draws as
// its share fades), while the other conversations keep their caches.
func TestUnauthorizedChatReplicaLosesItsConversations(t *testing.T) {
	t.Parallel()
	sc := fleetsim.UnauthorizedChatScenario()
	sc.Warmup, sc.Duration, sc.Drain = 60*time.Second, 240*time.Second, 60*time.Second
	policy := func(name string) fleetsim.Policy {
		i := slices.IndexFunc(sc.Policies, func(p fleetsim.Policy) bool { return p.Name == name })
		require.GreaterOrEqual(t, i, 0, name)
		return sc.Policies[i]
	}
	lb := runAt(sc, policy("inferlb"), 1, 1)
	p2c := runAt(sc, policy("inferlb -affinity"), 1, 1)
	t.Logf("of %d / %d calls, answered 401: %d / %d (inferlb / -affinity); cache hit %.1f%% / %.1f%%",
		lb.Requests, p2c.Requests, lb.Unauthorized, p2c.Unauthorized, 100*lb.CacheHit, 100*p2c.CacheHit)
	assert.LessOrEqual(t, lb.Unauthorized, p2c.Unauthorized*5/4, "affinity sends r0 no more calls than two choices do")
	assert.Positive(t, lb.Unauthorized, "r0 is still tried now and then")
	assert.Greater(t, lb.CacheHit, p2c.CacheHit+0.2, "the other conversations keep their keys")
}
