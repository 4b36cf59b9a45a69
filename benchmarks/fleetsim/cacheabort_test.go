package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// Blocks enter the prefix cache when the step that computes them is
// planned (cacheScheduled). When that step never runs to its end, the
// blocks' KV was never computed, and no later request may find them: a
// data-parallel rank's crash drops the step its engine's other ranks were
// running, and a sequence a model failure took out of that step is not
// scheduled again to compute what it had registered.
func TestAbortedStepLeavesNoUncomputedBlocksInTheCache(t *testing.T) {
	fl := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer(), DPGroup: 1}, {Server: fleetsim.LLMServer(), DPGroup: 1}}
	ctx := fleetsim.Segment{ID: 7, Tokens: 8000}
	broken := sharedCall(ctx, 1, 100, 10)
	broken.Model = "broken"
	w := at{
		// ~0.42 s step on rank 0: 8,100 prompt tokens, the context's 500
		// blocks registered when it is planned.
		{time.Millisecond, broken},
		// Waits on rank 0 behind that step.
		{150 * time.Millisecond, sharedCall(ctx, 2, 100, 10)},
	}
	sc := &fleetsim.Scenario{Name: "abort", Fleet: fl, DiscoveryDelay: 10 * time.Second,
		Events: []fleetsim.FleetEvent{
			// The first call leaves rank 0's batch mid-step.
			{At: 100 * time.Millisecond, Replica: 0, Kind: fleetsim.ModelFail, Model: "broken"},
			// Rank 1's crash drops the engine's step before it ends: the
			// context was never computed.
			{At: 200 * time.Millisecond, Replica: 1, Kind: fleetsim.Crash},
		},
		Workload: func(float64) fleetsim.Workload { return w }}
	rt := &scripted{script: []int{0, 0}}
	res := fleetsim.Run(sc, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 1, res.Failed)
	assert.Zero(t, res.CacheHit, "the second call found blocks no step computed")
	// It prefills the whole context in a step planned at 0.2 s: ~0.42 s.
	assert.Greater(t, res.TTFTP99, 0.4, "the second call skipped a prefill nobody did")
}
