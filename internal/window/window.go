// Package window reads the texts with which model servers refuse a call
// longer than their context window for its model, before doing any work:
// vLLM's 400 "This model's maximum context length is 4096 tokens.
// However, you requested 5000 tokens (4000 in the messages, 1000 in the
// completion)." (newer: "However, you requested 1000 output tokens and
// your prompt contains at least 4000 input tokens, ..."), SGLang's "The input (5000 tokens) is longer than the
// model's context length (4096 tokens)." (or, when the prompt fits but
// not with max_tokens, "Requested token count exceeds the model's maximum
// context length of 4096 tokens. You requested a total of 5000 tokens:
// 4000 tokens from the input messages and 1000 tokens for the
// completion."), TGI's "`inputs` tokens +
// `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 1000
// `max_new_tokens`" (or, when the prompt alone is longer than its
// max-input-tokens, "`inputs` must have less than 4096 tokens. Given:
// 5000"; Hugging Face TEI's refusal of an input longer than its
// max-input-length says the same), TensorRT-LLM's "Prompt length (5056)
// exceeds maximum sequence length (2048)", vLLM's engine's "The decoder
// prompt (length 8825) is longer than the maximum model length of 8192."
// (a multimodal prompt's image tokens), llama.cpp's "request (13392
// tokens) exceeds the available context size (8192 tokens), try
// increasing it". The adapters report such an answer with
// inferlb.Outcome.ContextWindow: in a fleet whose replicas have
// different windows another replica may take the call.
package window

import (
	"bytes"
	"math"
	"strconv"

	"github.com/inferlb/inferlb"
)

// Refusal reads an error's text (an HTTP 400's, 422's or 413's body, a
// gRPC status's message) for a refusal of a call longer than the context window: the
// window, and the prompt and output tokens the server counted (-1 each
// when it did not say). window 0: not a refusal. promptOnly says the
// window bounds the prompt alone (inferlb.Outcome.PromptWindow).
func Refusal(body []byte) (window, prompt, output int, promptOnly bool) {
	lb := bytes.ToLower(body)
	prompt, output = -1, -1
	switch {
	case bytes.Contains(lb, []byte("maximum context length is ")):
		// vLLM's (and OpenAI's) texts.
		window = numberAfter(lb, "maximum context length is ")
		switch {
		case bytes.Contains(lb, []byte(" in the messages")):
			// "you requested N tokens (P in the messages, O in the completion)",
			// or for a call without max_tokens "you requested P tokens in
			// the messages, Please reduce ..." (v0.5 to v0.9)
			prompt, output = numberBefore(lb, " in the messages"), numberBefore(lb, " in the completion")
			if prompt < 0 {
				prompt = numberAfter(lb, "you requested ")
			}
		case bytes.Contains(lb, []byte("your prompt contains at least ")):
			// "you requested O output tokens and your prompt contains at
			// least P input tokens, for a total of at least T tokens"
			// (v0.10 on); without the first clause in older ones.
			prompt = numberAfter(lb, "your prompt contains at least ")
			if bytes.Contains(lb, []byte(" output tokens and your prompt")) {
				output = numberAfter(lb, "you requested ")
			}
		case bytes.Contains(lb, []byte("your request has ")):
			// "your request has P input tokens", after "'max_tokens' or
			// 'max_completion_tokens' is too large: O." when that is why
			prompt, output = numberAfter(lb, "your request has "), numberAfter(lb, "is too large: ")
		default:
			prompt = numberAfter(lb, "you requested ") // an embedding's input
		}
	case bytes.Contains(lb, []byte("longer than the model's context length (")):
		// SGLang's.
		window = numberAfter(lb, "longer than the model's context length (")
		prompt = numberAfter(lb, "the input (")
	case bytes.Contains(lb, []byte("maximum context length of ")):
		// SGLang's when the prompt fits but not with max_tokens: "Requested
		// token count exceeds the model's maximum context length of W
		// tokens. You requested a total of T tokens: P tokens from the
		// input messages and O tokens for the completion."
		window = numberAfter(lb, "maximum context length of ")
		prompt, output = numberBefore(lb, " tokens from the input"), numberBefore(lb, " tokens for the completion")
	case bytes.Contains(lb, []byte("`inputs` tokens + `max_new_tokens` must be <= ")):
		// TGI's. Not its "`max_new_tokens` must be <= N. Given: M" (v1,
		// without a fast tokenizer), a bound on max_new_tokens alone.
		window = numberAfter(lb, "`max_new_tokens` must be <= ")
		prompt, output = numberAfter(lb, "given: "), numberBefore(lb, " `max_new_tokens`")
	case bytes.Contains(lb, []byte("`inputs` must have less than ")):
		// TGI's when the prompt and max_new_tokens fit its
		// max-total-tokens (checked first) but the prompt alone is longer
		// than its max-input-tokens: "`inputs` must have less than W
		// tokens. Given: P" (a prompt of W tokens is taken). W bounds the
		// prompt alone (promptOnly): remembered as a window for prompt and
		// output, it would pass the endpoint over for every call of W
		// tokens in all, short prompts with long answers too.
		// TEI's (core/src/tokenization.rs) when one input, or one query
		// and text pair of a rerank, is longer than its max-input-length
		// and auto-truncate is off: the same text, W bounding each input
		// (a pooling call's LongestInput, which Fit sets).
		window = numberAfter(lb, "`inputs` must have less than ")
		prompt, promptOnly = numberAfter(lb, "given: "), true
	case bytes.Contains(lb, []byte("decoder prompt (length ")) && bytes.Contains(lb, []byte("longer than the maximum model length of ")):
		// vLLM's engine (input processor), for a prompt the serving
		// layer's check let through: most often a multimodal one, whose
		// image tokens only the engine counts. "The decoder prompt
		// (length 8825) is longer than the maximum model length of
		// 8192." (or, for a prompt of exactly the window, "... (length
		// 8192) plus the number of requested output tokens (at least 1)
		// is longer than ..."). max-model-len bounds the prompt and
		// output, as vLLM's other texts say. Not its "encoder prompt"
		// text: that bound is the encoder cache's, not the window.
		window = numberAfter(lb, "longer than the maximum model length of ")
		prompt = numberAfter(lb, "decoder prompt (length ")
	case bytes.Contains(lb, []byte("exceeds the available context size")) || bytes.Contains(lb, []byte("exceed_context_size_error")):
		// llama.cpp's server (exceed_context_size_error): "request (13392
		// tokens) exceeds the available context size (8192 tokens), try
		// increasing it", older "the request exceeds the available
		// context size, try increasing it", and for an embedding's input
		// "input is larger than the max context size. skipping", with the
		// fields "n_prompt_tokens":13392,"n_ctx":8192. It checks the
		// prompt alone against a slot's context (promptOnly): the output
		// stops at the context's end, or shifts it, refused for no
		// max_tokens.
		window = numberAfter(lb, "available context size (")
		if window < 0 {
			window = numberAfter(lb, `"n_ctx":`)
		}
		prompt = numberAfter(lb, "request (")
		if prompt < 0 {
			prompt = numberAfter(lb, `"n_prompt_tokens":`)
		}
		promptOnly = true
	case bytes.Contains(lb, []byte("prompt length (")) && bytes.Contains(lb, []byte(") exceeds maximum ")):
		// TensorRT-LLM's executor: "Prompt length (5056) exceeds maximum
		// sequence length (2048)" (or "input length").
		// The input length bounds the prompt alone (promptOnly).
		window = numberAfter(lb, "exceeds maximum sequence length (")
		if window < 0 {
			window, promptOnly = numberAfter(lb, "exceeds maximum input length ("), true
		}
		prompt = numberAfter(lb, "prompt length (")
	}
	return max(window, 0), prompt, output, promptOnly && window > 0
}

// Fit sets req's token counts to those of a refusal (Refusal's results):
// the prompt and output tokens the server counted, where it said, and at
// least one token past window in all, so that a retry's pick passes over
// the endpoints whose remembered window is this small.
//
// A pooling call's (Pooling) server counts one
// input, or one query and document pair, against its window: that count
// is the call's LongestInput, at least one token past window, and its
// PromptTokens, the whole batch's, stay.
//
// With promptOnly (the window bounds the prompt alone), the prompt is
// what the server counted, at least one token past window, and the output
// stays.
//
// A generation call of several sequences (LongestInput > 0: n > 1, a
// batch of prompts) is refused for one sequence, whose counts the server
// gives: they are its LongestInput and SequenceOutputTokens, by the rules
// above, and its PromptTokens and MaxOutputTokens, every sequence's, stay.
func Fit(req *inferlb.Request, window, prompt, output int, promptOnly bool) {
	if Pooling(req) {
		req.LongestInput = max(prompt, window+1)
		return
	}
	if req.LongestInput > 0 {
		// One sequence, a generation call's (not Pooling).
		seq := inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: req.LongestInput, MaxOutputTokens: int(req.SequenceOutputTokens)}
		Fit(&seq, window, prompt, output, promptOnly)
		req.LongestInput = max(seq.PromptTokens, 1)
		req.SequenceOutputTokens = int32(min(max(seq.MaxOutputTokens, 0), math.MaxInt32))
		return
	}
	if promptOnly {
		if prompt <= 0 {
			prompt = req.PromptTokens
		}
		req.PromptTokens = max(prompt, window+1)
		return
	}
	if prompt > 0 {
		req.PromptTokens = prompt
		if output >= 0 {
			req.MaxOutputTokens = output
		}
	}
	if req.Tokens() <= int64(window) {
		req.PromptTokens = window + 1 - max(req.MaxOutputTokens, 0)
	}
}

// Pooling reports whether req is a pooling call, whose server bounds each
// input by its window, not the call (see inferlb.Request.LongestInput):
// ServiceEmbedding, ServiceRerank, and a ServiceUnknown call that names
// no model (TEI's /predict).
func Pooling(req *inferlb.Request) bool {
	return req.Service == inferlb.ServiceEmbedding || req.Service == inferlb.ServiceRerank ||
		req.Service == inferlb.ServiceUnknown && req.Model == ""
}

// Need returns the tokens of req that a server weighs against its context
// window, and those it weighs against a limit on the prompt alone
// (inferlb.Outcome.PromptWindow): a pooling call's LongestInput for both
// (0 when not known: no window bounds it); a call of several sequences'
// (LongestInput > 0) longest, LongestInput + SequenceOutputTokens, and
// LongestInput; any other call's Tokens and PromptTokens. Fit sets the
// counts a refusal gives where Need reads them, and the Balancer's window
// check weighs Need's: the two must not differ.
func Need(req *inferlb.Request) (need, needP int64) {
	switch {
	case Pooling(req):
		return int64(req.LongestInput), int64(req.LongestInput)
	case req.LongestInput > 0:
		needP = int64(min(req.LongestInput, math.MaxInt32))
		return needP + int64(max(req.SequenceOutputTokens, 0)), needP
	}
	return req.Tokens(), int64(max(req.PromptTokens, 0))
}

// numberAfter returns the decimal number that follows the first s in b,
// or -1.
func numberAfter(b []byte, s string) int {
	i := bytes.Index(b, []byte(s))
	if i < 0 {
		return -1
	}
	b = b[i+len(s):]
	j := 0
	for j < len(b) && j < 10 && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(string(b[:j]))
	if err != nil {
		return -1
	}
	return n
}

// numberBefore returns the decimal number that ends right before the last
// s in b, or -1.
func numberBefore(b []byte, s string) int {
	i := bytes.LastIndex(b, []byte(s))
	if i < 0 {
		return -1
	}
	j := i
	for j > 0 && i-j < 10 && b[j-1] >= '0' && b[j-1] <= '9' {
		j--
	}
	n, err := strconv.Atoi(string(b[j:i]))
	if err != nil {
		return -1
	}
	return n
}
