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

// TestBodilessAnswerEndsAtItsHeaders: the answer to a HEAD, a 204 and a
// 304 has no body, so the call ends with its headers, over either
// protocol. net/http's HTTP/1 transport gives such a response http.NoBody,
// but its HTTP/2 transport an empty body of its own, which the transport
// wrapped and waited on: a caller that did not close the body of a HEAD or
// a 204 (net/http holds nothing open for it) left the call in flight on
// its endpoint for good, a phantom load.
func TestBodilessAnswerEndsAtItsHeaders(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/204":
					w.WriteHeader(http.StatusNoContent)
				case "/304":
					w.WriteHeader(http.StatusNotModified)
				default: // a HEAD that announces the GET's length
					w.Header().Set("Content-Length", "100")
					w.Header().Set("Content-Type", "application/json")
				}
			}))
			var base *http.Transport
			if h2 {
				srv.EnableHTTP2 = true
				srv.Config.ErrorLog = log.New(io.Discard, "", 0)
				srv.StartTLS()
				base = srv.Client().Transport.(*http.Transport)
			} else {
				srv.Start()
				base = &http.Transport{}
			}
			t.Cleanup(srv.Close)
			t.Cleanup(base.CloseIdleConnections)
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: srv.URL}},
				Base:      base,
				OnResult:  res.on,
			})
			for _, c := range []struct {
				method, path string
				status       int
			}{
				{http.MethodHead, "/v1/models", http.StatusOK},
				{http.MethodDelete, "/204", http.StatusNoContent},
				{http.MethodGet, "/304", http.StatusNotModified},
			} {
				req, err := http.NewRequest(c.method, "http://llm.internal"+c.path, nil)
				require.NoError(t, err)
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				if h2 {
					require.Equal(t, 2, resp.ProtoMajor, "the test needs HTTP/2")
				}
				require.Equal(t, c.status, resp.StatusCode)
				assert.Zero(t, totalInFlight(tr.Balancer()), "%s %s: no body to wait for; not closed yet", c.method, c.path)
				require.EqualValues(t, 1, res.n.Load(), "%s %s: reported at the headers", c.method, c.path)
				r := <-res.c
				assert.NoError(t, r.Outcome.Err)
				assert.Equal(t, c.status, r.Status)
				require.NoError(t, resp.Body.Close())
				assert.EqualValues(t, 1, res.n.Load(), "%s %s: reported once", c.method, c.path)
				res.n.Store(0)
			}
		})
	}
}
