package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strings"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// backend is an OpenAI-compatible chat completions server whose engine is
// the fleet simulator's vLLM-style replica running in scaled real time: a
// prefix cache, continuous batching and chunked prefill, no GPU.
type backend struct {
	engine *fleetsim.LiveServer
}

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens int  `json:"max_tokens"`
	Stream    bool `json:"stream"`
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.Error(w, `{"error":{"message":"only POST /v1/chat/completions"}}`, http.StatusNotFound)
		return
	}
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad JSON"}}`, http.StatusBadRequest)
		return
	}
	// The engine sees the rendered conversation as tokens, as vLLM sees the
	// chat template's output; equal text prefixes share KV blocks.
	var text strings.Builder
	for _, m := range req.Messages {
		fmt.Fprintf(&text, "<|%s|>%s<|end|>", m.Role, m.Content)
	}
	text.WriteString("<|assistant|>")
	out := req.MaxTokens
	if out <= 0 {
		out = 64
	}
	tokens := b.engine.Generate(fleetsim.PromptFromTokens(fleetsim.TextTokens(text.String())), out)

	if !req.Stream {
		n := 0
		for t := range tokens {
			if t.End && t.Err != nil {
				engineError(w, t.Err)
				return
			}
			n = max(n, t.N)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"length"}],"usage":{"completion_tokens":%d}}`,
			req.Model, strings.Repeat("tok ", n), n)
		return
	}
	// A call refused or stopped before its first token gets an error
	// status, not an empty stream that looks like a finished answer.
	first := <-tokens
	if first.End && first.Err != nil {
		engineError(w, first.Err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	for t := range prepend(first, tokens) {
		if t.End {
			if t.Err != nil {
				return // cut short: no [DONE], so the client sees a truncated stream
			}
			break
		}
		if _, err := fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n"); err != nil {
			// The client went away; drain so the engine's sends never block
			// (the channel is buffered for the whole answer anyway).
			for range tokens {
			}
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// engineError answers a call the engine refused (400, as vLLM answers a
// request longer than its context) or stopped (503).
func engineError(w http.ResponseWriter, err error) {
	if errors.Is(err, fleetsim.ErrTooLong) {
		http.Error(w, `{"error":{"message":"prompt and max_tokens exceed the KV cache"}}`, http.StatusBadRequest)
		return
	}
	http.Error(w, `{"error":{"message":"engine stopped"}}`, http.StatusServiceUnavailable)
}

// prepend yields t, then what ch carries.
func prepend(t fleetsim.Token, ch <-chan fleetsim.Token) iter.Seq[fleetsim.Token] {
	return func(yield func(fleetsim.Token) bool) {
		if !yield(t) {
			return
		}
		for t := range ch {
			if !yield(t) {
				return
			}
		}
	}
}
