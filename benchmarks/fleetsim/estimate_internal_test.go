package fleetsim

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
)

// What a Balancer is told of a call's size: the truth by default; with
// an Estimate, the prompt off by a factor within the error, the same for
// the same text and different across texts, and max_tokens scaled.
func TestEstimatePutsTheSizesOff(t *testing.T) {
	req := func(id uint64) *Request {
		return &Request{Service: inferlb.ServiceLLM, Prompt: NewPrompt(Segment{ID: id, Tokens: 1000}), MaxOutputTokens: 100}
	}
	exact := &inferlbRouter{}
	got := exact.request(req(1))
	assert.Equal(t, 1000, got.PromptTokens)
	assert.Equal(t, 100, got.MaxOutputTokens)

	off := &inferlbRouter{est: Estimate{PromptError: 0.3, OutputFactor: 4}}
	seen := map[int]bool{}
	for id := range uint64(200) {
		a, b := off.request(req(id)), off.request(req(id))
		assert.Equal(t, a.PromptTokens, b.PromptTokens, "the same text, the same estimate")
		assert.InDelta(t, 1000, a.PromptTokens, 300)
		assert.Equal(t, 400, a.MaxOutputTokens)
		seen[a.PromptTokens/100] = true
	}
	assert.GreaterOrEqual(t, len(seen), 6, "spread over the range, not one value")
	assert.True(t, seen[7] && seen[12], "both ends reached: %v", seen)
}
