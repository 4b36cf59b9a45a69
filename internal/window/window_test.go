package window

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
)

// refusalTexts are the texts Refusal is tested with; TestCarriedEveryRefusal
// reads them too.
var refusalTexts = []struct {
	name, body             string
	window, prompt, output int
	promptOnly             bool
}{
	{"vLLM", `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`, 4096, 4000, 1000, false},
	// Without max_tokens (v0.5-v0.9): no parenthesis, the prompt
	// right after "you requested".
	{"vLLM messages", `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, Please reduce the length of the messages.","type":"BadRequestError","param":null,"code":400}`, 4096, 5000, -1, false},
	{"vLLM input", `{"error":{"message":"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}}`, 4096, 5000, -1, false},
	{"vLLM max_tokens", `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).","type":"BadRequestError","param":null,"code":400}}`, 4096, 3500, 1000, false},
	// vLLM's VLLMValidationError (v0.10 on): the first number after
	// "you requested" is the output asked for, not the prompt.
	{"vLLM output and prompt", `{"error":{"message":"This model's maximum context length is 32768 tokens. However, you requested 8192 output tokens and your prompt contains at least 24577 input tokens, for a total of at least 32769 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=24577)","type":"BadRequestError","param":"input_tokens","code":400}}`, 32768, 24577, 8192, false},
	{"vLLM prompt alone", `{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 0 output tokens and your prompt contains at least 4097 input tokens, for a total of at least 4097 tokens.","code":400}}`, 4096, 4097, 0, false},
	{"vLLM embedding", `{"object":"error","message":"This model's maximum context length is 512 tokens. However, you requested 600 tokens in the input for embedding generation. Please reduce the length of the input.","type":"BadRequestError","param":null,"code":400}`, 512, 600, -1, false},
	{"SGLang", `{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}`, 4096, 5000, -1, false},
	{"SGLang total", `{"object":"error","message":"Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of 5000 tokens: 4000 tokens from the input messages and 1000 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.","type":"BadRequestError","param":null,"code":400}`, 4096, 4000, 1000, false},
	{"TGI", `{"error":"Input validation error: ` + "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`" + `","error_type":"validation"}`, 4096, 4000, 200, false},
	// TGI's InputLength (router/src/validation.rs): the prompt alone
	// is longer than max-input-tokens; it says nothing of the output.
	{"TGI input", `{"error":"Input validation error: ` + "`inputs` must have less than 1024 tokens. Given: 2000" + `","error_type":"validation"}`, 1024, 2000, -1, true},
	// TEI's refusal of an input longer than its max-input-length
	// (core/src/tokenization.rs, encode_input): 413 up to v1.8, 422
	// from v1.9, in its native and OpenAI-compatible bodies.
	{"TEI", `{"error":"Input validation error: ` + "`inputs` must have less than 512 tokens. Given: 600" + `","error_type":"Validation"}`, 512, 600, -1, true},
	{"TEI OpenAI", `{"message":"Input validation error: ` + "`inputs` must have less than 512 tokens. Given: 600" + `","code":413,"type":"Validation"}`, 512, 600, -1, true},
	{"TEI batch size", `{"message":"batch size 64 > maximum allowed batch size 32","code":413,"type":"Validation"}`, 0, -1, -1, false},
	// TGI v1 without a fast tokenizer (ValidationError::MaxNewTokens):
	// max_new_tokens above max-total-tokens less max-input-tokens, no
	// window and no prompt in it.
	{"TGI max_new_tokens", `{"error":"Input validation error: ` + "`max_new_tokens` must be <= 1024. Given: 2000" + `","error_type":"validation"}`, 0, -1, -1, false},
	{"TensorRT-LLM", `{"object":"error","message":"Encountered an error when fetching new request: Prompt length (5056) exceeds maximum sequence length (2048).","type":"BadRequestError","code":400}`, 2048, 5056, -1, false},
	{"TensorRT-LLM input", `{"message":"Prompt length (200) exceeds maximum input length (128)"}`, 128, 200, -1, true},
	// vLLM's engine, for a prompt its serving layer let through (a
	// multimodal one: image tokens are counted there).
	{"vLLM engine", `{"object":"error","message":"The decoder prompt (length 8825) is longer than the maximum model length of 8192. Make sure that ` + "`max_model_len`" + ` is no smaller than the number of text tokens plus multimodal tokens. For image inputs, the number of image tokens depends on the number of images, and possibly their aspect ratios as well.","type":"BadRequestError","param":null,"code":400}`, 8192, 8825, -1, false},
	{"vLLM engine at the window", `{"error":{"message":"The decoder prompt (length 8192) plus the number of requested output tokens (at least 1) is longer than the maximum model length of 8192. Make sure that ` + "`max_model_len`" + ` is no smaller than the number of text tokens (prompt + requested output tokens).","type":"BadRequestError","param":null,"code":400}}`, 8192, 8192, -1, false},
	// An encoder prompt's bound is vLLM's encoder cache, not the
	// model's window.
	{"vLLM engine encoder", `{"error":{"message":"The encoder prompt (length 1600) is longer than the maximum model length of 1500. Make sure that ` + "`max_model_len`" + ` is no smaller than the number of text tokens.","type":"BadRequestError","code":400}}`, 0, -1, -1, false},
	// llama.cpp's server: the prompt alone against a slot's context.
	{"llama.cpp", `{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}}`, 8192, 13392, -1, true},
	{"llama.cpp older", `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`, 4096, 5000, -1, true},
	{"llama.cpp embedding", `{"error":{"code":400,"message":"input is larger than the max context size. skipping","type":"exceed_context_size_error","n_prompt_tokens":600,"n_ctx":512}}`, 512, 600, -1, true},
	// Older, without the counts: no window to remember.
	{"llama.cpp embedding, no counts", `{"error":{"code":400,"message":"input is larger than the max context size. skipping","type":"invalid_request_error"}}`, 0, -1, -1, false},
	{"other 400", `{"object":"error","message":"temperature must be non-negative","type":"BadRequestError","code":400}`, 0, -1, -1, false},
	{"no number", `{"message":"maximum context length is large"}`, 0, -1, -1, false},
}

func TestRefusal(t *testing.T) {
	for _, tc := range refusalTexts {
		w, p, o, po := Refusal([]byte(tc.body))
		assert.Equal(t, [3]int{tc.window, tc.prompt, tc.output}, [3]int{w, p, o}, tc.name)
		assert.Equal(t, tc.promptOnly, po, "%s: bounds the prompt alone", tc.name)
	}
}

func FuzzRefusal(f *testing.F) {
	f.Add([]byte("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion)."))
	f.Add([]byte("`inputs` tokens + `max_new_tokens` must be <= 99999999999999999999. Given: 1 `inputs` tokens and 2 `max_new_tokens`"))
	f.Fuzz(func(t *testing.T, body []byte) {
		w, p, o, po := Refusal(body)
		if w < 0 || p < -1 || o < -1 || po && w == 0 {
			t.Fatalf("%d %d %d", w, p, o)
		}
	})
}

// refusalTemplates are the servers' texts with their counts left open:
// window, prompt and output, in that order (%[1]d, %[2]d, %[3]d), with
// what Refusal reads of them (-1: not said), and whether the window bounds
// the prompt alone.
var refusalTemplates = []struct {
	text               string
	prompt, output, po bool
}{
	{"This model's maximum context length is %[1]d tokens. However, you requested 5000 tokens (%[2]d in the messages, %[3]d in the completion). Please reduce the length of the messages or completion.", true, true, false},
	{"This model's maximum context length is %[1]d tokens. However, you requested %[3]d output tokens and your prompt contains at least %[2]d input tokens, for a total of at least 1 tokens.", true, true, false},
	{"'max_tokens' or 'max_completion_tokens' is too large: %[3]d. This model's maximum context length is %[1]d tokens and your request has %[2]d input tokens (1 > 2 - 3).", true, true, false},
	{"The input (%[2]d tokens) is longer than the model's context length (%[1]d tokens).", true, false, false},
	{"Requested token count exceeds the model's maximum context length of %[1]d tokens. You requested a total of 7 tokens: %[2]d tokens from the input messages and %[3]d tokens for the completion.", true, true, false},
	{"Input validation error: `inputs` tokens + `max_new_tokens` must be <= %[1]d. Given: %[2]d `inputs` tokens and %[3]d `max_new_tokens`", true, true, false},
	{"Input validation error: `inputs` must have less than %[1]d tokens. Given: %[2]d", true, false, true},
	{"Encountered an error when fetching new request: Prompt length (%[2]d) exceeds maximum sequence length (%[1]d).", true, false, false},
	{"Prompt length (%[2]d) exceeds maximum input length (%[1]d)", true, false, true},
	{"The decoder prompt (length %[2]d) is longer than the maximum model length of %[1]d. Make sure that `max_model_len` is no smaller than the number of text tokens.", true, false, false},
	{"request (%[2]d tokens) exceeds the available context size (%[1]d tokens), try increasing it", true, false, true},
}

// refusalMarkers are the phrases Refusal looks for: text around a refusal
// that holds one may be read for it.
var refusalMarkers = []string{
	"context", "requested", "in the messages", "in the completion", "your prompt", "your request", "too large",
	"the input (", "tokens from the input", "tokens for the completion", "max_new_tokens", "inputs", "given:",
	"decoder prompt", "maximum model length", "request (", "n_ctx", "n_prompt_tokens", "prompt length (", "exceeds maximum",
}

// FuzzRefusalReadsTheCounts: each server's text, with any counts a server
// can give (up to 2^31-1), inside any text that does not itself hold a
// refusal's phrases (a JSON body, a gRPC status), reads as those counts.
func FuzzRefusalReadsTheCounts(f *testing.F) {
	for i := range refusalTemplates {
		f.Add(uint8(i), uint32(4096), uint32(5000), uint32(1000), `{"object":"error","message":"`, `","code":400}`)
	}
	f.Add(uint8(0), uint32(0), uint32(1<<31-1), uint32(7), "", "")
	f.Fuzz(func(t *testing.T, which uint8, w, p, o uint32, before, after string) {
		if after != "" && after[0] >= '0' && after[0] <= '9' {
			return // a count that ends a text ("Given: 600") goes on
		}
		lower := strings.ToLower(before + "\x00" + after)
		for _, m := range refusalMarkers {
			if strings.Contains(lower, m) {
				return
			}
		}
		tpl := refusalTemplates[int(which)%len(refusalTemplates)]
		w, p, o = w%(1<<31), p%(1<<31), o%(1<<31)
		body := before + fmt.Sprintf(tpl.text, w, p, o) + after
		gw, gp, gotO, gpo := Refusal([]byte(body))
		wantP, wantO := -1, -1
		if tpl.prompt {
			wantP = int(p)
		}
		if tpl.output {
			wantO = int(o)
		}
		if gw != int(w) || gp != wantP || gotO != wantO || gpo != (tpl.po && w > 0) {
			t.Fatalf("%q: %d %d %d %v, want %d %d %d %v", body, gw, gp, gotO, gpo, w, wantP, wantO, tpl.po && w > 0)
		}
	})
}

func TestFit(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		req                    inferlb.Request
		window, prompt, output int
		wantPrompt, wantOut    int
	}{
		{"server's counts", inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 50}, 4096, 4000, 1000, 4000, 1000},
		{"prompt only", inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 50}, 4096, 5000, -1, 5000, 50},
		{"no counts: one past the window", inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 50}, 4096, -1, -1, 4047, 50},
		{"counts that fit: one past the window", inferlb.Request{Service: inferlb.ServiceLLM}, 4096, 4000, 10, 4087, 10},
		{"no output asked", inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 10, MaxOutputTokens: -1}, 100, -1, -1, 101, -1},
	} {
		r := tc.req
		Fit(&r, tc.window, tc.prompt, tc.output, false)
		assert.Equal(t, [2]int{tc.wantPrompt, tc.wantOut}, [2]int{r.PromptTokens, r.MaxOutputTokens}, tc.name)
		assert.Greater(t, r.Tokens(), int64(tc.window), tc.name)
	}
}

// A pooling server counts one input (query and document pair) against its
// window: the count is the call's LongestInput, its PromptTokens (the
// batch's) stay. A call of no known service that names no model (TEI's
// /predict, whose LongestInput the transport does not know) is one: its
// count went to PromptTokens, which the Balancer does not weigh for it,
// and its retry passed over no replica remembered too small.
func TestFitPooling(t *testing.T) {
	for _, svc := range []inferlb.Service{inferlb.ServiceEmbedding, inferlb.ServiceRerank, inferlb.ServiceUnknown} {
		for _, longest := range []int{0, 300} {
			for _, promptOnly := range []bool{false, true} {
				r := inferlb.Request{Service: svc, PromptTokens: 10000, LongestInput: longest}
				Fit(&r, 512, 600, -1, promptOnly)
				assert.Equal(t, [2]int{10000, 600}, [2]int{r.PromptTokens, r.LongestInput}, "%v %d %v: the server's count", svc, longest, promptOnly)
				r = inferlb.Request{Service: svc, PromptTokens: 10000, LongestInput: longest}
				Fit(&r, 512, -1, -1, promptOnly)
				assert.Equal(t, [2]int{10000, 513}, [2]int{r.PromptTokens, r.LongestInput}, "%v %d %v: one past the window", svc, longest, promptOnly)
			}
		}
	}
}

// What Fit sets is what Need weighs: after a refusal, every kind of call
// weighs more than the window that refused it (the prompt more than a
// limit on the prompt alone), so that its retry passes over the endpoints
// remembered this small. A pooling call and a call of several sequences
// keep their load.
func TestNeedAfterFit(t *testing.T) {
	for _, r := range []inferlb.Request{
		{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 50},
		{Model: "m", PromptTokens: 100, MaxOutputTokens: 50},
		{PromptTokens: 10000},
		{PromptTokens: 10000, LongestInput: 100},
		{Service: inferlb.ServiceEmbedding, PromptTokens: 10000},
		{Service: inferlb.ServiceRerank, PromptTokens: 10000, LongestInput: 100},
		{Service: inferlb.ServiceLLM, PromptTokens: 1800, MaxOutputTokens: 4000, LongestInput: 450, SequenceOutputTokens: 1000},
		{Model: "m", PromptTokens: 1800, LongestInput: 450},
	} {
		for _, promptOnly := range []bool{false, true} {
			fit := r
			Fit(&fit, 2048, -1, -1, promptOnly)
			need, needP := Need(&fit)
			if promptOnly {
				assert.Greater(t, needP, int64(2048), "%+v", r)
			} else {
				assert.Greater(t, need, int64(2048), "%+v", r)
			}
			if Pooling(&r) || r.LongestInput > 0 {
				assert.Equal(t, [2]int{r.PromptTokens, r.MaxOutputTokens}, [2]int{fit.PromptTokens, fit.MaxOutputTokens}, "%+v: the call's load stays", r)
			}
		}
	}
}

// A limit on the prompt alone (TGI's max-input-tokens): the prompt is the
// server's count, at least one past the limit, and the output asked for
// stays, which the limit says nothing of.
func TestFitPromptOnly(t *testing.T) {
	r := inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 900, MaxOutputTokens: 3000}
	Fit(&r, 1024, 2000, -1, true)
	assert.Equal(t, [2]int{2000, 3000}, [2]int{r.PromptTokens, r.MaxOutputTokens}, "the server's count")
	r = inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 900, MaxOutputTokens: 3000}
	Fit(&r, 1024, -1, -1, true)
	assert.Equal(t, [2]int{1025, 3000}, [2]int{r.PromptTokens, r.MaxOutputTokens}, "one past the limit")
}

// A generation call of several sequences (n > 1, a batch of prompts) is
// refused for one sequence: the server's counts are its LongestInput and
// SequenceOutputTokens, and its PromptTokens and MaxOutputTokens (every
// sequence's, its load) stay.
func TestFitSeveralSequences(t *testing.T) {
	n4 := inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 1800, MaxOutputTokens: 4000, LongestInput: 1800, SequenceOutputTokens: 1000}
	for _, tc := range []struct {
		name                   string
		window, prompt, output int
		promptOnly             bool
		wantLongest, wantSeq   int
	}{
		{"server's counts", 2048, 2000, 1000, false, 2000, 1000},
		{"prompt only given", 2048, 2000, -1, false, 2000, 1000},
		{"no counts: one past the window", 4096, -1, -1, false, 3097, 1000},
		{"limit on the prompt", 1024, 2000, -1, true, 2000, 1000},
		{"limit on the prompt, no count", 1024, -1, -1, true, 1800, 1000},
	} {
		r := n4
		Fit(&r, tc.window, tc.prompt, tc.output, tc.promptOnly)
		assert.Equal(t, [2]int{tc.wantLongest, tc.wantSeq}, [2]int{r.LongestInput, int(r.SequenceOutputTokens)}, tc.name)
		assert.Equal(t, [2]int{1800, 4000}, [2]int{r.PromptTokens, r.MaxOutputTokens}, "%s: the call's load stays", tc.name)
		if tc.promptOnly {
			assert.Greater(t, r.LongestInput, tc.window, tc.name)
		} else {
			assert.Greater(t, r.LongestInput+int(r.SequenceOutputTokens), tc.window, tc.name)
		}
	}
}
