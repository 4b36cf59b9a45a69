package httpbalancer_test

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestEmptyAnswerEndsAtItsHeaders: a 200 whose length is known to be zero
// has nothing to wait for, and the call ends with its headers, reported
// once, whether or not the caller reads or closes the body. Over HTTP/1.1
// net/http gives such an answer http.NoBody; over HTTP/2 an empty body of
// its own (the stream ended with the headers, or its Content-Length says
// 0 and the end is yet to come), which the transport wrapped and waited
// on: a caller that took the status and left the empty body alone (net/http
// holds nothing open for it) left the call in flight on its endpoint for
// good, a phantom load. A Base that wraps the body (a tracing middleware)
// keeps the Content-Length: 0 that says so.
func TestEmptyAnswerEndsAtItsHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h2      bool
		wrapped bool // a Base that wraps every body, as tracing middleware does
	}{{"HTTP/1.1", false, false}, {"HTTP/1.1 wrapped", false, true}, {"HTTP/2", true, false}, {"HTTP/2 wrapped", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/held" {
					// The headers go out now; the stream ends later.
					w.Header().Set("Content-Length", "0")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					<-release
				}
				// Otherwise nothing written: Content-Length: 0, and over
				// HTTP/2 the headers end the stream.
			}))
			var base *http.Transport
			if tc.h2 {
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
			t.Cleanup(func() { // before srv.Close, which waits for the handler
				select {
				case <-release:
				default:
					close(release)
				}
			})
			var rt http.RoundTripper = base
			if tc.wrapped {
				rt = baseFunc(func(r *http.Request) (*http.Response, error) {
					resp, err := base.RoundTrip(r)
					if err == nil {
						resp.Body = struct{ io.ReadCloser }{resp.Body}
					}
					return resp, err
				})
			}
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: srv.URL}},
				Base:      rt,
				OnResult:  res.on,
			})
			for i, path := range []string{"/v1/chat/completions", "/held"} {
				req, err := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(chatBody(1, false)))
				require.NoError(t, err)
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				if tc.h2 {
					require.Equal(t, 2, resp.ProtoMajor, "the test needs HTTP/2")
				}
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Zero(t, resp.ContentLength)
				assert.Zero(t, totalInFlight(tr.Balancer()), "%s: nothing to wait for; the body is neither read nor closed", path)
				require.EqualValues(t, 1, res.n.Load(), "%s: reported at the headers", path)
				r := <-res.c
				assert.NoError(t, r.Outcome.Err)
				assert.Equal(t, http.StatusOK, r.Status)
				if path == "/held" {
					close(release)
				}
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				assert.Empty(t, b)
				require.NoError(t, resp.Body.Close())
				assert.EqualValues(t, 1, res.n.Load(), "%s: reported once", path)
				assert.Equal(t, uint64(i+1), statsByID(tr.Balancer())["a"].Successes, "%s: counted once", path)
				res.n.Store(0)
			}
		})
	}
}
