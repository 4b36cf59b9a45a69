package httpbalancer_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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

// TestStaleGetBodyDoesNotReplaceTheBody: a body larger than the peek that
// the transport cannot see into is sent from a GetBody copy, so that its
// model past the peek can be read. A caller that replaced Body after
// http.NewRequest (a middleware rewriting the request) and left the old
// GetBody would then have sent the old body, or failed with a length
// mismatch blamed on the endpoint. When the copy visibly differs from the
// body (its length, or the bytes the peek read), the body goes, as
// net/http sends it.
func TestStaleGetBodyDoesNotReplaceTheBody(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a), MaxPeek: 64})
	client := &http.Client{Transport: tr}
	msgs := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}],`
	old := msgs + `"model":"alias"}`
	for name, rewritten := range map[string]string{
		"other length":        msgs + `"model":"llama-3"}`,
		"other first bytes":   strings.Replace(old, `"user"`, `"USER"`, 1),
		"unknown length":      strings.Replace(old, `"user"`, `"USER"`, 1),
		"the same, rewinding": old,
	} {
		req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(old))
		require.NoError(t, err)
		shared := bytes.NewReader([]byte(rewritten))
		req.Body, req.ContentLength = wrapper{io.NopCloser(shared)}, int64(len(rewritten))
		switch name {
		case "unknown length":
			req.ContentLength = -1
		case "the same, rewinding": // as openai-go's GetBody for a *bytes.Reader
			req.GetBody = func() (io.ReadCloser, error) {
				_, err := shared.Seek(0, io.SeekStart)
				return io.NopCloser(shared), err
			}
		}
		resp, err := client.Do(req)
		require.NoError(t, err, name)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		sum := sha256.Sum256([]byte(rewritten))
		assert.Equal(t, hex.EncodeToString(sum[:]), resp.Header.Get("X-Body-Sha256"), "%s: the backend got %s bytes, the body has %d", name, resp.Header.Get("X-Body-Len"), len(rewritten))
	}
	assert.Zero(t, statsByID(tr.Balancer())["a"].Failures)
}
