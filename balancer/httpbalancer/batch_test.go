package httpbalancer_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// TestInspectBatchesMultiplyTheOutputBound: a /v1/completions prompt given
// as a list of strings or of token-ID lists, and SGLang's text or
// input_ids given so, is a batch: the server generates a completion (n
// choices) per prompt, so the output bound is max_tokens × n × prompts. A
// batch of three prompts of 256 tokens counted 256, and SGLang's
// sampling_params given as a list (one object per prompt) was stepped
// over, so its bound read 0. A flat list of token IDs is one prompt, and
// lists that are not prompts (/v1/responses input items, embeddings and
// rerank inputs) multiply nothing.
func TestInspectBatchesMultiplyTheOutputBound(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"string prompt", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":256}`, 256},
		{"list of strings", "/v1/completions", `{"model":"m","prompt":["a","b","c"],"max_tokens":256}`, 768},
		{"list of one string", "/v1/completions", `{"model":"m","prompt":["a"],"max_tokens":256}`, 256},
		{"list of token-ID lists", "/v1/completions", `{"model":"m","prompt":[[1,2],[3,4],[5]],"max_tokens":256}`, 768},
		{"flat token-ID list", "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":256}`, 256},
		{"empty list", "/v1/completions", `{"model":"m","prompt":[],"max_tokens":256}`, 256},
		{"batch times n", "/v1/completions", `{"model":"m","prompt":["a","b"],"max_tokens":10,"n":3}`, 60},
		{"batch after the bound", "/v1/completions", `{"max_tokens":10,"model":"m","prompt":["a","b"]}`, 20},
		{"responses input items", "/v1/responses", `{"model":"m","input":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}],"max_output_tokens":256}`, 256},
		{"embeddings input list", "/v1/embeddings", `{"model":"e5","input":["a","b","c"]}`, 0},
		{"embeddings token-ID lists", "/v1/embeddings", `{"model":"e5","input":[[1,2],[3]]}`, 0},
		{"rerank documents", "/v1/rerank", `{"model":"bge","query":"q","documents":["a","b","c"]}`, 0},
		{"sglang text list, params object", "/generate", `{"text":["a","b","c"],"sampling_params":{"max_new_tokens":100,"n":2}}`, 600},
		{"sglang text list, params list", "/generate", `{"text":["a","b"],"sampling_params":[{"max_new_tokens":100},{"max_new_tokens":300,"n":2}]}`, 1200},
		{"sglang params list first", "/generate", `{"sampling_params":[{"max_new_tokens":5,"n":3},{"max_new_tokens":7,"n":1}],"text":["a","b"]}`, 42},
		{"sglang params list without n", "/generate", `{"text":["a","b"],"n":2,"sampling_params":[{"max_new_tokens":5},{"max_new_tokens":7}]}`, 28},
		{"sglang input_ids batch", "/generate", `{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":10}}`, 20},
		{"sglang flat input_ids", "/generate", `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":10}}`, 10},
		{"sglang single text, params list", "/generate", `{"text":"a","sampling_params":[{"max_new_tokens":10}]}`, 10},
		{"tgi inputs", "/generate", `{"inputs":"abcd","parameters":{"max_new_tokens":12}}`, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, inspect(tc.path, tc.body, true).MaxOutputTokens, tc.body)
		})
	}
}

// TestInspectBatchBoundIsCapped: a hostile body of a million one-byte
// prompts counts them (the bound stays below MaxTokenEstimate while it
// can), cannot overflow the product, and claims no more than
// MaxTokenEstimate.
func TestInspectBatchBoundIsCapped(t *testing.T) {
	const path = "/v1/completions"
	prompts := "[" + strings.TrimSuffix(strings.Repeat(`"a",`, 1_000_000), ",") + "]"
	assert.Equal(t, 4_000_000, inspect(path, `{"model":"m","prompt":`+prompts+`,"max_tokens":4}`, true).MaxOutputTokens)
	for _, extra := range []string{`"max_tokens":5`, `"max_tokens":2147483647,"n":128`} {
		info := inspect(path, `{"model":"m","prompt":`+prompts+`,`+extra+`}`, true)
		assert.Equal(t, httpbalancer.MaxTokenEstimate, info.MaxOutputTokens, extra)
	}
}

// TestInspectBatchPastThePeek: a batch larger than the peek counts every
// prompt when the body is held in memory (the read of the rest counts
// them), wherever the prompts end; a streamed one counts the prompts the
// peek holds (a lower bound: the rest is not read before sending).
func TestInspectBatchPastThePeek(t *testing.T) {
	const peek = 64 << 10
	var sb strings.Builder
	for i := range 300 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "%q", strings.Repeat(fmt.Sprint(i%10), 1000))
	}
	texts := "[" + sb.String() + "]"
	ids := "[" + strings.TrimSuffix(strings.Repeat("["+strings.TrimSuffix(strings.Repeat("100000,", 200), ",")+"],", 300), ",") + "]"
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","prompt":` + texts + `,"max_tokens":16}`},
		{"/v1/completions", `{"model":"m","max_tokens":16,"prompt":` + ids + `}`},
		{"/generate", `{"text":` + texts + `,"sampling_params":{"max_new_tokens":16}}`},
		{"/generate", `{"sampling_params":[` + strings.TrimSuffix(strings.Repeat(`{"max_new_tokens":16},`, 300), ",") + `],"input_ids":` + ids + `}`},
	} {
		name := fmt.Sprintf("%s %.40s", tc.path, tc.body)
		whole := inspect(tc.path, tc.body, true)
		assert.Equal(t, 300*16, whole.MaxOutputTokens, name)
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, strings.NewReader(tc.body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(tc.body[:peek]), false, &info)
		assert.Equal(t, whole.MaxOutputTokens, info.MaxOutputTokens, "in memory: "+name)

		r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, io.MultiReader(strings.NewReader(tc.body)))
		r.ContentLength = int64(len(tc.body))
		info = httpbalancer.Info{}
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(tc.body[:peek]), false, &info)
		if !strings.Contains(tc.body[:peek], "max_") {
			assert.Zero(t, info.MaxOutputTokens, "streamed, the bound past the peek: "+name)
			continue
		}
		assert.Greater(t, info.MaxOutputTokens, 16, "streamed: "+name)
		assert.Less(t, info.MaxOutputTokens, whole.MaxOutputTokens, "streamed: "+name)
	}
}
