package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// A call larger than the engine's KV cache is the client's error (400, as
// vLLM answers one longer than its context), streamed or not; a call after
// the engine stopped is the server's (503), not an empty answer.
func TestBackendAnswersRefusedCallsWithAnErrorStatus(t *testing.T) {
	p := fleetsim.LLMServer()
	p.KVTokens = 1000
	e := fleetsim.NewLiveServer(p, 1, 100)
	defer e.Close()
	b := &backend{engine: e}
	call := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		b.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		return w
	}
	for _, stream := range []string{"false", "true"} {
		w := call(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5000,"stream":` + stream + `}`)
		assert.Equal(t, http.StatusBadRequest, w.Code, "stream %s: %s", stream, w.Body)
	}
	w := call(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
	require.Equal(t, http.StatusOK, w.Code)
	assert.Contains(t, w.Body.String(), "data: [DONE]")
	e.Close()
	for _, stream := range []string{"false", "true"} {
		w := call(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":` + stream + `}`)
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, "stream %s: %s", stream, w.Body)
	}
}
