package httpbalancer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/internal/testutil"
)

// TestStreamScanDoesNotAllocate: following a stream's chunks (the role
// chunk, token chunks, the empty-delta finish chunk, the usage chunk that
// the output token count is read from) allocates nothing, in reads of any
// size: the scanner runs on every chunk of every stream.
func TestStreamScanDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	const head = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1765000000,"model":"m","choices":`
	body := []byte(head + `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		strings.Repeat(head+`[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`+"\n\n", 50) +
		head + `[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" +
		head + `[],"usage":{"prompt_tokens":9,"completion_tokens":50,"total_tokens":59}}` + "\n\n" + "data: [DONE]\n\n")
	s := new(sseState)
	for _, n := range []int{1, 7, 64, len(body)} {
		allocs := testing.AllocsPerRun(10, func() {
			*s = sseState{counting: true}
			for p := body; len(p) > 0; p = p[min(len(p), n):] {
				s.scan(p[:min(len(p), n)], clock)
			}
		})
		assert.Zero(t, allocs, "%d bytes a read", n)
		assert.EqualValues(t, 50, s.events.Load(), "%d bytes a read", n)
		assert.EqualValues(t, 50, s.outTokens.Load(), "%d bytes a read", n)
	}
}
