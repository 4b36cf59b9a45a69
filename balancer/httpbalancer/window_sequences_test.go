package httpbalancer_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A generation call of several sequences is weighed by its longest one
// (Info.LongestInput + Info.SequenceOutputTokens), while its load counts
// every sequence.
func TestInspectSeveralSequences(t *testing.T) {
	a := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		name, path, body          string
		prompt, out, longest, seq int
	}{
		{"one chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + a(400) + `"}],"max_tokens":50}`, 100, 50, 0, 0},
		{"chat, n = 4", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + a(400) + `"}],"max_tokens":50,"n":4}`, 100, 200, 100, 50},
		{"chat, n = 4, no max_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + a(400) + `"}],"n":4}`, 100, 0, 100, 0},
		{"batch of completions", "/v1/completions", `{"model":"m","prompt":["` + a(80) + `","` + a(400) + `","` + a(40) + `"],"max_tokens":50}`, 130, 150, 100, 50},
		{"batch of completions, n = 2", "/v1/completions", `{"model":"m","prompt":["` + a(80) + `","` + a(400) + `"],"max_tokens":50,"n":2}`, 120, 200, 100, 50},
		{"SGLang, n = 3", "/generate", `{"text":"` + a(400) + `","sampling_params":{"max_new_tokens":50,"n":3}}`, 100, 150, 100, 50},
		{"SGLang batch", "/generate", `{"text":["` + a(80) + `","` + a(400) + `"],"sampling_params":[{"max_new_tokens":20},{"max_new_tokens":50}]}`, 120, 100, 100, 50},
		{"one prompt in a list", "/v1/completions", `{"model":"m","prompt":["` + a(400) + `"],"max_tokens":50}`, 100, 50, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := inspect(tc.path, tc.body, true)
			assert.Equal(t, [2]int{tc.prompt, tc.out}, [2]int{info.PromptTokens, info.MaxOutputTokens}, "the load: every sequence")
			assert.Equal(t, [2]int{tc.longest, tc.seq}, [2]int{info.LongestInput, int(info.SequenceOutputTokens)}, "the longest sequence")
		})
	}
}

// chatN is a chat of about tokens prompt tokens asking for n choices of up
// to maxTokens each, distinct for each i.
func chatN(i, tokens, maxTokens, n int) string {
	text := fmt.Sprintf("%06d ", i) + strings.Repeat("word ", tokens*4/5-2)
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d,"n":%d}`, text, maxTokens, n)
}

// vLLM checks each sequence, one prompt plus max_tokens, against
// max-model-len, whatever n. The balancer weighed a chat with n = 4,
// max_tokens = 1,000 and a 2,000-token prompt as 6,000 tokens, so a
// replica remembered at 4,096 (which takes it: 3,000 a sequence) got none
// of such calls once it had refused a long one. Now it gets its share,
// and refuses none of them.
func TestSeveralSequencesFitTheWindow(t *testing.T) {
	small, large := newWindowBackend(t, "small", 4096), newWindowBackend(t, "large", 16384)
	tr := newWindowTransport(t, small, large)
	c := &http.Client{Transport: tr}
	for i := 0; small.refused.Load() == 0; i++ {
		require.Less(t, i, 50, "the small replica was never tried")
		resp, _ := post(t, c, chatN(i, 5000, 200, 1))
		require.Equal(t, http.StatusOK, resp.StatusCode, "a 5,200-token call, which the large replica takes")
	}
	require.EqualValues(t, 1, statsByID(tr.Balancer())["small"].TooLong)

	before := small.hits.Load()
	for i := range 40 {
		resp, _ := post(t, c, chatN(100+i, 2000, 1000, 4))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.EqualValues(t, 1, small.refused.Load(), "no sequence of 3,000 tokens is refused by a window of 4,096")
	assert.Greater(t, small.hits.Load()-before, int64(10), "chats of 4 sequences of 3,000 tokens fit the small replica's 4,096")
}
