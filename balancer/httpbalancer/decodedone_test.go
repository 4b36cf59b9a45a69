package httpbalancer_test

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TestCallEndsAtItsLastByte: a caller that decodes a JSON answer
// (json.Decoder stops at the value's closing brace) and closes the body
// later, after its own work (a RAG step querying its vector store with
// the embeddings it got, a defer at the end of a long function), has had
// the whole answer once it read the bytes Content-Length announced. Over
// HTTP/1.1 net/http hands over io.EOF with those last bytes; over HTTP/2
// the EOF waits for a Read the decoder never makes, and the call stayed in
// flight on its endpoint, as a phantom load, until the Close.
func TestCallEndsAtItsLastByte(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			b := &backend{name: "a"}
			b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.fakeChat))
			var base http.RoundTripper = http.DefaultTransport
			if h2 {
				b.srv.EnableHTTP2 = true
				b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
				b.srv.StartTLS()
				base = b.srv.Client().Transport
			} else {
				b.srv.Start()
				base = &http.Transport{}
			}
			t.Cleanup(b.srv.Close)
			t.Cleanup(base.(*http.Transport).CloseIdleConnections)
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: b.srv.URL}},
				Base:      base,
				OnResult:  res.on,
			})
			resp, err := tr.RoundTrip(chatRequest(t, 1))
			require.NoError(t, err)
			if h2 {
				require.Equal(t, 2, resp.ProtoMajor, "the test needs HTTP/2")
			}
			require.Positive(t, resp.ContentLength)
			var v map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
			assert.Zero(t, totalInFlight(tr.Balancer()), "the answer is in; the body is not closed yet")
			require.NoError(t, resp.Body.Close())
			r := <-res.c
			assert.NoError(t, r.Outcome.Err)
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}
