package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
	"github.com/inferlb/inferlb/telemetry"
)

// scripted routes the n-th pick to script[n] and records every outcome.
type scripted struct {
	script   []int
	n        int
	retry    bool
	outcomes []inferlb.Outcome
}

func (s *scripted) Pick(*fleetsim.Request) (int, func(inferlb.Outcome), error) {
	i := s.script[s.n]
	s.n++
	return i, func(o inferlb.Outcome) { s.outcomes = append(s.outcomes, o) }, nil
}
func (s *scripted) SetMembers([]int)                    {}
func (s *scripted) Publish(int, telemetry.Sample)       {}
func (s *scripted) AllowRetry() bool                    { return s.retry }
func (s *scripted) policy() fleetsim.Policy             { return fleetsim.Policy{Name: "scripted", New: s.router} }
func (s *scripted) router(fleetsim.Env) fleetsim.Router { return s }

// calls sends its requests 1ms into the run, after the measurement window
// has opened.
type calls []*fleetsim.Request

func (c calls) Start(s fleetsim.Sim) {
	s.After(time.Millisecond, func() {
		for _, r := range c {
			s.Submit(r)
		}
	})
}

func (calls) Done(fleetsim.Sim, *fleetsim.Request, bool) {}

func llmCall(id uint64, prompt, out int) *fleetsim.Request {
	return &fleetsim.Request{Service: inferlb.ServiceLLM, Prompt: fleetsim.NewPrompt(fleetsim.Segment{ID: id, Tokens: prompt}),
		OutputTokens: out, MaxOutputTokens: out, AnswerID: id + 1000}
}

func runScripted(fl []fleetsim.ReplicaSpec, w calls, rt *scripted, events ...fleetsim.FleetEvent) fleetsim.Result {
	sc := &fleetsim.Scenario{Name: "scripted", Fleet: fl, Events: events, DiscoveryDelay: 10 * time.Second,
		Workload: func(float64) fleetsim.Workload { return w }}
	return fleetsim.Run(sc, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
}

func TestRetriedCallTimesItsFirstTokenFromTheAttemptThatAnswers(t *testing.T) {
	// The call streams on r0 until r0 crashes at 5s, then is retried on r1,
	// which generates the whole answer again: the answer the user gets
	// starts after 5s, and the outcome of the second attempt reports its own
	// time to first token, not one from before the attempt began.
	rt := &scripted{script: []int{0, 1}, retry: true}
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	res := runScripted(fl, calls{llmCall(1, 1000, 1000)}, rt, fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash})
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 1, res.Retries)
	require.Len(t, rt.outcomes, 2)
	require.Error(t, rt.outcomes[0].Err)
	assert.Greater(t, res.TTFTP50, 5.0, "TTFT of the answer delivered")
	assert.Positive(t, rt.outcomes[1].TTFT, "the balancer's TTFT is the attempt's own")
	assert.Less(t, rt.outcomes[1].TTFT, time.Second)
}

func TestCrashedRankDoesNotStallItsEngine(t *testing.T) {
	// r0 and r1 are ranks of one data-parallel engine. r0 crashes while both
	// decode; r1's call must go on without waiting for another arrival.
	rt := &scripted{script: []int{1, 0}}
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer(), DPGroup: 1}, {Server: fleetsim.LLMServer(), DPGroup: 1}}
	res := runScripted(fl, calls{llmCall(1, 100, 1000), llmCall(2, 100, 1000)}, rt, fleetsim.FleetEvent{At: 2 * time.Second, Replica: 0, Kind: fleetsim.Crash})
	assert.Equal(t, 1, res.Failed)
	assert.Equal(t, 1, res.Completed)
	assert.Zero(t, res.Unfinished)
	assert.Less(t, res.E2EP99, 30.0, "1,000 tokens at ~12ms a step")
}

func TestPreemptedRecomputeIsNotACacheHit(t *testing.T) {
	// Two unrelated calls outgrow a 128-block cache, so the newer one is
	// preempted and later recomputes its prompt and answer so far, mostly
	// from its own blocks. vLLM counts such re-admissions apart from its
	// prefix-cache hit rate (PrefixCacheStats.preempted_*); no prompt here
	// shares a prefix with another, so the hit rate is 0.
	p := fleetsim.LLMServer()
	p.KVTokens = 128 * fleetsim.BlockSize
	rt := &scripted{script: []int{0, 0}}
	res := runScripted([]fleetsim.ReplicaSpec{{Server: p}}, calls{llmCall(1, 800, 600), llmCall(2, 800, 600)}, rt)
	require.Equal(t, 2, res.Completed)
	require.Positive(t, res.Preemptions)
	assert.Zero(t, res.CacheHit)
}

func TestThroughputLeavesOutTheTokensOfAnAttemptThatCrashed(t *testing.T) {
	// The call streams on r0 until r0 crashes at 5s, then is retried on r1,
	// which generates the whole answer again. The client keeps one answer
	// of 1,000 tokens: the tokens r0 streamed before it died were thrown
	// away, and counting them would credit a policy for the calls it lost.
	rt := &scripted{script: []int{0, 1}, retry: true}
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	res := runScripted(fl, calls{llmCall(1, 1000, 1000)}, rt, fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash})
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 1, res.Retries)
	assert.InDelta(t, 1000, res.Throughput*time.Minute.Seconds(), 1e-6, "tokens delivered in the one-minute window")
}

func TestRetriesCountOnlyMeasuredCalls(t *testing.T) {
	// The call arrives in the warm-up, so it is not one of the run's
	// Requests, and neither its failure nor its latency is counted; its
	// retry must not be either, or Retries counts calls Requests does not.
	rt := &scripted{script: []int{0, 1}, retry: true}
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	sc := &fleetsim.Scenario{Name: "scripted", Fleet: fl, DiscoveryDelay: 10 * time.Second,
		Events:   []fleetsim.FleetEvent{{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash}},
		Workload: func(float64) fleetsim.Workload { return calls{llmCall(1, 1000, 1000)} }}
	res := fleetsim.Run(sc, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1,
		Warmup: 10 * time.Second, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
	require.Len(t, rt.outcomes, 2, "the call was retried")
	assert.Zero(t, res.Requests)
	assert.Zero(t, res.Retries)
}

func TestZeroScrapeIntervalIsTheDefault(t *testing.T) {
	// A RunConfig without a Scrape interval rescheduled every scrape at
	// the same instant, so virtual time never moved and Run never
	// returned. The zero value is the scenarios' default, one second.
	run := func(scrape time.Duration) fleetsim.Result {
		sc := &fleetsim.Scenario{Name: "scripted", Fleet: []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}},
			Workload: func(float64) fleetsim.Workload { return calls{llmCall(1, 1000, 100)} }}
		return fleetsim.Run(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}),
			fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: scrape})
	}
	res := run(0)
	assert.Equal(t, 1, res.Completed)
	assert.Equal(t, run(time.Second), res)
}

func TestInferLBRetriesOnAnotherReplica(t *testing.T) {
	// Eight long calls spread over two replicas; r0 crashes at 5s. Each call
	// r0 was streaming is retried, and the library's adapters retry with
	// PickRetry, on another endpoint than the one that failed: every retry
	// lands on r1 and every call completes. Picking the retry afresh, as
	// the simulator did, sent some of them back to the dead r0 (its
	// breaker not yet open), where they failed for good.
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	var w calls
	for i := range 8 {
		w = append(w, llmCall(uint64(i+1)*10_000, 1000, 1000))
	}
	sc := &fleetsim.Scenario{Name: "retry", Fleet: fl, DiscoveryDelay: 10 * time.Second,
		Events:   []fleetsim.FleetEvent{{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash}},
		Workload: func(float64) fleetsim.Workload { return w }}
	for seed := uint64(1); seed <= 5; seed++ {
		res := fleetsim.Run(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), fleetsim.RunConfig{
			Rate: 1, Seed: seed, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
		require.Equal(t, 8, res.Requests, "seed %d", seed)
		assert.Positive(t, res.Retries, "seed %d: some calls were on r0", seed)
		assert.Zero(t, res.Failed, "seed %d", seed)
		assert.Equal(t, 8, res.Completed, "seed %d", seed)
	}
}

func TestNotServedAnswerIsQuickAndRetriedByABaseline(t *testing.T) {
	// r0 has not loaded the adapter the call asks for: it answers at once
	// that the model does not exist, with no GPU work, and a router that
	// knows nothing of such answers takes it for a failure, which it
	// retries once as any other (here on r1, which has the adapter).
	rt := &scripted{script: []int{0, 1}, retry: true}
	fl := []fleetsim.ReplicaSpec{
		{Server: fleetsim.LLMServer(), Models: []string{fleetsim.Model}},
		{Server: fleetsim.LLMServer(), Models: []string{fleetsim.Model, "lora-sql"}},
	}
	call := llmCall(1, 1000, 100)
	call.Model = "lora-sql"
	res := runScripted(fl, calls{call}, rt)
	require.Equal(t, 1, res.Completed)
	assert.Equal(t, 1, res.NotServed)
	assert.Equal(t, 1, res.Retries)
	require.Len(t, rt.outcomes, 2)
	// The server answered: the outcome names the call's model, as the
	// HTTP transport's does (the balancer reads NotServedModel first).
	assert.Equal(t, inferlb.Outcome{NotServedModel: "lora-sql", Model: "lora-sql"}, rt.outcomes[0])
	assert.Less(t, res.TTFTP50, 0.2, "the 404 cost milliseconds, then the prefill on r1")
	assert.Equal(t, 2.0, res.MaxMean, "only r1 ran the call")

	// Both replicas without the adapter: the retry meets the 404 too, and
	// the call fails.
	rt = &scripted{script: []int{0, 0}, retry: true}
	res = runScripted(fl[:1], calls{call}, rt)
	assert.Equal(t, 1, res.Failed)
	assert.Equal(t, 2, res.NotServed)
	assert.Zero(t, res.GPUBusy)
}

func TestCallBetweenAttemptsAtTheEndCountsWithItsLatencySoFar(t *testing.T) {
	// The call reaches r0, which lacks its model and answers so within
	// milliseconds; the run's drain ends before that answer. The call is
	// unfinished, and an unfinished call counts with its latency so far,
	// whether it sits in a replica's queue or waits for an answer no GPU
	// works on: left out, it counted in Unfinished but in no percentile.
	rt := &scripted{script: []int{0, 0}, retry: true}
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer(), Models: []string{fleetsim.Model}}}
	call := llmCall(1, 1000, 100)
	call.Model = "lora-sql"
	sc := &fleetsim.Scenario{Name: "scripted", Fleet: fl, DiscoveryDelay: 10 * time.Second,
		Workload: func(float64) fleetsim.Workload { return calls{call} }}
	res := fleetsim.Run(sc, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1,
		Duration: 2 * time.Millisecond, Drain: time.Millisecond, Scrape: time.Second})
	require.Equal(t, 1, res.Requests)
	require.Equal(t, 1, res.Unfinished)
	assert.InDelta(t, 0.002, res.E2EP99, 1e-9, "arrived at 1ms, still out at 3ms")
	assert.InDelta(t, 0.002, res.TTFTP99, 1e-9)
}
