package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// The simulator reports Outcome.Model as the adapters do: the call's model
// on a success and on a failure the replica answered (a 500 for a model
// that fails there, whether the call was waiting, streaming or new), never
// on one it could not answer (a stream its crash cut, a refused dial).
func TestOutcomeNamesTheModelOfCallsTheReplicaAnswered(t *testing.T) {
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}, {Server: fleetsim.LLMServer()}}
	call := func() *fleetsim.Request {
		c := llmCall(1, 1000, 1000)
		c.Model = "lora-sql"
		return c
	}
	fail := fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.ModelFail, Model: "lora-sql"}

	// Streaming on r0 when its lora-sql fails: the stream ends with an
	// error the server sent, and the retry on r1 generates the answer anew;
	// the tokens r0 streamed are not throughput.
	rt := &scripted{script: []int{0, 1}, retry: true}
	res := runScripted(fl, calls{call()}, rt, fail)
	require.Equal(t, 1, res.Completed)
	require.Len(t, rt.outcomes, 2)
	require.Error(t, rt.outcomes[0].Err)
	assert.Equal(t, "lora-sql", rt.outcomes[0].Model, "a failure the server answered")
	assert.NoError(t, rt.outcomes[1].Err)
	assert.Equal(t, "lora-sql", rt.outcomes[1].Model, "a success")
	assert.InDelta(t, 1000, res.Throughput*time.Minute.Seconds(), 1e-6, "tokens of the answer delivered")
	require.NotNil(t, res.Broken)
	assert.Equal(t, []int{1, 1}, res.Broken.Attempts)
	assert.Equal(t, 1, res.Broken.Completed)
	assert.Equal(t, fleetsim.ModelResult{Attempts: []int{0, 0}}, *res.Healthy)

	// A new call for it there is answered 500 in milliseconds, with no
	// GPU work; another model's call is served.
	rt = &scripted{script: []int{0, 0}}
	other := llmCall(2, 1000, 100)
	other.Model = fleetsim.Model
	fail.At = 0
	res = runScripted(fl, calls{call(), other}, rt, fail)
	require.Len(t, rt.outcomes, 2)
	assert.Equal(t, "lora-sql", rt.outcomes[0].Model)
	require.Error(t, rt.outcomes[0].Err)
	assert.Equal(t, fleetsim.Model, rt.outcomes[1].Model)
	assert.NoError(t, rt.outcomes[1].Err)
	assert.Equal(t, 1, res.Broken.Failed)
	assert.Equal(t, 1, res.Healthy.Completed)

	// A crash cuts the stream: no answer, no model.
	rt = &scripted{script: []int{0, 1}, retry: true}
	res = runScripted(fl, calls{call()}, rt, fleetsim.FleetEvent{At: 5 * time.Second, Replica: 0, Kind: fleetsim.Crash})
	require.Equal(t, 1, res.Completed)
	require.Len(t, rt.outcomes, 2)
	require.Error(t, rt.outcomes[0].Err)
	assert.Empty(t, rt.outcomes[0].Model, "the endpoint's failure")
	assert.Equal(t, "lora-sql", rt.outcomes[1].Model)
	assert.Nil(t, res.Healthy, "no model fails in this run")
}

// shortModelFailure is sc (a model-failure scenario) cut to run in a few
// seconds under -race: a 2-minute window, the model failing from 45 s
// and serving again at 135 s.
func shortModelFailure(sc *fleetsim.Scenario) *fleetsim.Scenario {
	sc.Warmup, sc.Duration, sc.Drain = 30*time.Second, 150*time.Second, 60*time.Second
	for i, ev := range sc.Events {
		switch ev.Kind {
		case fleetsim.ModelFail:
			sc.Events[i].At = 45 * time.Second
		case fleetsim.ModelRecover:
			sc.Events[i].At = 135 * time.Second
		}
	}
	return sc
}

// healthyOn is the share of the healthy models' attempts that went to r0
// and r3, where the model-failure scenario's adapter fails.
func healthyOn(r fleetsim.Result) float64 {
	on, all := 0, 0
	for i, n := range r.Healthy.Attempts {
		all += n
		if i == 0 || i == 3 {
			on += n
		}
	}
	return float64(on) / float64(all)
}

// One adapter fails on two replicas of 8 that also serve the base model
// and another adapter (the model-failure scenario, in a shorter window).
// With Outcome.Model named, the balancer holds the adapter's failures
// against the adapter there: its calls go elsewhere, the other models
// lose none and keep their share of both replicas (a quarter of their
// attempts), and outlier detection ejects neither. Counted against the
// replicas, as when no outcome names its model, the same failures raise
// their error rates and get them ejected or tripped: the other models
// keep 5-16% of their attempts there and lose 2.5-4.4% of their tokens
// (seeds 1-8).
func TestModelFailureKeepsTheReplicasForOtherModels(t *testing.T) {
	t.Parallel()
	sc := shortModelFailure(fleetsim.ModelFailureScenario())
	for seed := uint64(1); seed <= 2; seed++ {
		lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, seed)
		old := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb no-outcome-model", NoOutcomeModel: true}), 1, seed)
		t.Logf("seed %d: healthy attempts on r0+r3 %.1f%% / %.1f%%, tokens %.0f / %.0f, p99 TTFT %.3fs / %.3fs; lora-sql failed %d / %d; balancer %+v / %+v (model named / not)",
			seed, 100*healthyOn(lb), 100*healthyOn(old), lb.Healthy.Throughput, old.Healthy.Throughput, lb.Healthy.TTFTP99, old.Healthy.TTFTP99,
			lb.Broken.Failed, old.Broken.Failed, *lb.Balancer, *old.Balancer)
		require.NotNil(t, lb.Healthy)
		assert.Zero(t, lb.Healthy.Failed, "seed %d: the other models lose no call", seed)
		assert.Greater(t, healthyOn(lb), 0.2, "seed %d: the other models keep r0 and r3", seed)
		assert.LessOrEqual(t, lb.Broken.Failed, 5, "seed %d: the adapter's calls go on to where it works", seed)
		assert.Positive(t, lb.Balancer.ModelFailures, "seed %d", seed)
		assert.Positive(t, lb.Balancer.ModelFailing, "seed %d: its picks pass r0 and r3 over", seed)
		assert.Zero(t, lb.Balancer.Ejections, "seed %d", seed)

		assert.Zero(t, old.Healthy.Failed, "seed %d", seed)
		assert.Less(t, healthyOn(old), healthyOn(lb)-0.08, "seed %d: counted against the replicas, the failures steer the other models away", seed)
		assert.Positive(t, old.Balancer.Trips+old.Balancer.Ejections, "seed %d", seed)
		assert.Zero(t, old.Balancer.ModelFailures, "seed %d", seed)
		assert.Less(t, old.Healthy.Throughput, lb.Healthy.Throughput, "seed %d", seed)
	}
}

// The adapter fails on every replica (a bad version rolled out): no
// policy serves its calls. Counted against the replicas, its failures
// trip half the fleet, and MaxEjectedFraction holds off the other half's
// trips (EventCapped); held against the adapter, most of them leave the
// replicas' breakers alone. Some replicas still trip: when the adapter
// breaks, its calls in flight there fail at once, and where the latest
// success was the adapter's own no other model's shows the replica
// healthy before the breaker's five in a row (modelfail.go), so 1-3
// replicas trip against the old reading's 4-5 (seeds 1-8), and the
// others' p99 TTFT is lower on every seed.
func TestModelFailingEverywhereIsHeldAgainstTheModel(t *testing.T) {
	t.Parallel()
	sc := shortModelFailure(fleetsim.ModelFailureEverywhereScenario())
	lb := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"}), 1, 1)
	old := runAt(sc, fleetsim.InferLB(fleetsim.Variant{Name: "inferlb no-outcome-model", NoOutcomeModel: true}), 1, 1)
	t.Logf("healthy p99 TTFT %.3fs / %.3fs, tokens %.0f / %.0f; lora-sql failed %d / %d of %d; balancer %+v / %+v (model named / not)",
		lb.Healthy.TTFTP99, old.Healthy.TTFTP99, lb.Healthy.Throughput, old.Healthy.Throughput,
		lb.Broken.Failed, old.Broken.Failed, lb.Broken.Requests, *lb.Balancer, *old.Balancer)
	assert.Zero(t, lb.Healthy.Failed)
	assert.Zero(t, old.Healthy.Failed)
	assert.Positive(t, old.Balancer.Capped, "half the fleet tripped, the cap held the rest in")
	assert.Zero(t, lb.Balancer.Capped)
	assert.Less(t, lb.Balancer.Trips, old.Balancer.Trips)
	assert.Greater(t, lb.Balancer.ModelFailures, 4*lb.Balancer.Failures, "most failures held against the adapter")
	assert.Less(t, lb.Healthy.TTFTP99, old.Healthy.TTFTP99)
	assert.Greater(t, lb.Broken.Failed, lb.Broken.Requests/2, "the adapter fails wherever it goes")
}
