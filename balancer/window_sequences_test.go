package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A call of several sequences (n > 1, a batch of prompts) is weighed by
// its longest sequence, which is what a server bounds by its window (vLLM:
// one prompt plus max_tokens against max-model-len, whatever n), not by
// its Tokens, which count every sequence: a chat of a 2,000-token prompt
// with n = 4 and max_tokens = 1,000 (6,000 tokens of load, sequences of
// 3,000) passed over endpoints remembered at 4,096 that take it, and a
// retry found none to go to.
func TestContextWindowSeveralSequences(t *testing.T) {
	b := newBalancer(t, 3, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5)})
	eps := endpoints(3)
	small := eps[0].Addr
	refuse(t, b, small, "llama", 4096)

	n4 := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 2000, MaxOutputTokens: 4000, LongestInput: 2000, SequenceOutputTokens: 1000}
	assert.Greater(t, picksOf(t, b, n4, 300)[small], 60, "sequences of 3,000 tokens fit 4,096")
	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 3500, MaxOutputTokens: 4000, LongestInput: 3500, SequenceOutputTokens: 1000}
	assert.Zero(t, picksOf(t, b, long, 300)[small], "sequences of 4,500 do not")
	batch := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 6000, MaxOutputTokens: 3000, LongestInput: 2500, SequenceOutputTokens: 1000}
	assert.Greater(t, picksOf(t, b, batch, 300)[small], 60, "three prompts of up to 2,500 tokens, each with 1,000 of output, fit 4,096")

	// Every endpoint remembered at 4,096: a retry of the n = 4 chat still
	// has somewhere to go.
	refuse(t, b, eps[1].Addr, "llama", 4096)
	refuse(t, b, eps[2].Addr, "llama", 4096)
	p, err := b.PickRetry(n4, small)
	require.NoError(t, err, "sequences of 3,000 fit the others' 4,096")
	p.Done(inferlb.Outcome{})
	_, err = b.PickRetry(long, small)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
}

// A limit on the prompt alone (TGI's max-input-tokens) is weighed against
// the longest prompt of a batch, not the batch's sum of prompts.
func TestPromptWindowSeveralSequences(t *testing.T) {
	b := newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(6)})
	small := endpoints(2)[0].Addr
	for range 1000 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama"})
		require.NoError(t, err)
		if p.ID() == small {
			p.Done(inferlb.Outcome{ContextWindow: 1024, PromptWindow: true, Model: "llama"})
			break
		}
		p.Done(inferlb.Outcome{})
	}
	require.EqualValues(t, 1, stat(t, b, small).TooLong)
	batch := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 2400, MaxOutputTokens: 300, LongestInput: 800, SequenceOutputTokens: 100}
	assert.Greater(t, picksOf(t, b, batch, 300)[small], 60, "three prompts of up to 800 tokens fit 1,024 each")
	longer := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 2400, MaxOutputTokens: 300, LongestInput: 1200, SequenceOutputTokens: 100}
	assert.Zero(t, picksOf(t, b, longer, 300)[small], "a prompt of 1,200 does not")
}
