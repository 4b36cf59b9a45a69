package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// sharedCall is a call whose prompt is a context shared with other calls
// followed by a question of its own.
func sharedCall(ctx fleetsim.Segment, id uint64, question, out int) *fleetsim.Request {
	return &fleetsim.Request{Service: inferlb.ServiceLLM,
		Prompt:       fleetsim.NewPrompt(ctx, fleetsim.Segment{ID: id, Tokens: question}),
		OutputTokens: out, MaxOutputTokens: out, AnswerID: id + 1000}
}

// vLLM V1 registers the full blocks of the tokens it schedules in the
// prefix cache when it schedules them (allocate_slots calls cache_blocks),
// not when the step that computes them ends, and admits waiting requests
// after scheduling the running ones: a request admitted in the step that
// prefills its prefix for another request hits those blocks.
func TestBlocksEnterThePrefixCacheWhenScheduled(t *testing.T) {
	one := []fleetsim.ReplicaSpec{{Server: fleetsim.LLMServer()}}
	run := func(w at) fleetsim.Result {
		s := &fleetsim.Scenario{Name: "sched", Fleet: one, DiscoveryDelay: 10 * time.Second,
			Workload: func(float64) fleetsim.Workload { return w }}
		rt := &scripted{script: make([]int, len(w))}
		return fleetsim.Run(s, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
	}

	t.Run("same step", func(t *testing.T) {
		// An unrelated call's prefill (~0.06 s) is under way when two calls
		// sharing a 2,000-token context arrive; they wait, and the next
		// step admits both within its 8,192 tokens: the first is scheduled
		// with its 2,100 tokens, the second, admitted after it, finds the
		// 125 blocks of the shared context.
		ctx := fleetsim.Segment{ID: 7, Tokens: 2000}
		res := run(at{
			{time.Millisecond, llmCall(9, 1000, 10)},
			{10 * time.Millisecond, sharedCall(ctx, 1, 100, 10)},
			{10 * time.Millisecond, sharedCall(ctx, 2, 100, 10)},
		})
		require.Equal(t, 3, res.Completed)
		assert.InDelta(t, 2000.0/5200, res.CacheHit, 1e-9, "the second call's 2,000 context tokens of 5,200 admitted")
	})

	t.Run("next chunk", func(t *testing.T) {
		// The first call's 12,400-token prompt takes two chunks: 8,192
		// tokens in the first step (~0.42 s), 4,208 in the second. The
		// second call arrives during the first step and is admitted in the
		// second, with the 3,984 tokens of budget left: it finds the whole
		// 12,000-token context (750 blocks), the second chunk's blocks
		// included, and prefills only its question in that step. Had the
		// blocks entered the cache only when computed, it would find the
		// first chunk's 512 and need a third step for the rest.
		ctx := fleetsim.Segment{ID: 7, Tokens: 12000}
		res := run(at{{time.Millisecond, sharedCall(ctx, 1, 400, 10)}, {100 * time.Millisecond, sharedCall(ctx, 2, 400, 10)}})
		require.Equal(t, 2, res.Completed)
		assert.InDelta(t, 12000.0/24800, res.CacheHit, 1e-9, "750 of the second call's blocks")
		// Both first tokens come at the end of the second step: 12 ms +
		// 8,192 x 50 µs, then 12 ms + 4,608 x 50 µs, ~0.66 s from 1 ms.
		assert.Less(t, res.TTFTP99, 0.7, "both prompts done in two steps")
	})
}
