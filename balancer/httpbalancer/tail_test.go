package httpbalancer_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TestLargeMemberInTheTailKeepsThePeeksReading: reading past the peek of
// a large body bounds the members it copies (16 KiB); one over the bound
// must not undo what the peek read of it. TGI's parameters carry
// max_new_tokens next to a grammar (a JSON schema) that can exceed the
// bound; with a long input after them the body exceeds the peek, and the
// output bound the peek found was lost.
func TestLargeMemberInTheTailKeepsThePeeksReading(t *testing.T) {
	schema := `{"type":"object","properties":{` + strings.Repeat(`"field":{"type":"string","description":"a long description of the field"},`, 300) + `"last":{"type":"string"}}}`
	body := []byte(`{"parameters":{"max_new_tokens":20,"grammar":{"type":"json","value":` + schema + `}},"inputs":"` + strings.Repeat("x", 100<<10) + `"}`)
	require.Greater(t, len(schema), 16<<10)
	var want struct {
		Parameters struct {
			MaxNewTokens int `json:"max_new_tokens"`
		} `json:"parameters"`
	}
	require.NoError(t, json.Unmarshal(body, &want))

	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}},
		Base:      base,
		MaxPeek:   32 << 10, // holds the parameters, not the input
		OnResult:  res.on,
	})
	req, err := http.NewRequest(http.MethodPost, "http://llm.internal/generate", bytes.NewReader(body))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.Equal(t, want.Parameters.MaxNewTokens, r.Request.MaxOutputTokens)
}
