package httpbalancer

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// RoundTrip takes no lock, as the Transport's doc says: a call answered
// 400 or 404 used to take the Transport's mutex (to count its endpoints
// for the bound on hops), which Update and Discovery hold while they
// apply a set to the Balancer, so every such answer waited on an update
// under way, and all of them contended for one mutex.
func TestRoundTripTakesNoLockOnARefusal(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		const body = `{"error":{"message":"The model ` + "`m`" + ` does not exist.","code":404}}`
		return &http.Response{StatusCode: http.StatusNotFound, ContentLength: int64(len(body)),
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	})
	tr, err := NewTransport(Options{Base: base, Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:8000"}}})
	require.NoError(t, err)
	defer tr.Close()

	tr.mu.Lock() // as an Update applying a set does
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		tr.mu.Unlock()
		assert.Equal(t, http.StatusNotFound, code)
	case <-time.After(10 * time.Second):
		tr.mu.Unlock()
		<-done
		t.Fatal("RoundTrip waited on the Transport's mutex")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
