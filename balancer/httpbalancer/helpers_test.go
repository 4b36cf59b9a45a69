package httpbalancer_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchServerEnv) != "" {
		serveBench() // the test binary re-run as a benchmark's server process
		return
	}
	goleak.VerifyTestMain(m)
}

// chatURL is the logical URL every test calls; no such host exists.
const chatURL = "http://llm.internal/v1/chat/completions"

// backend is a fake OpenAI-compatible server on loopback.
type backend struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
	port *testutil.PortHold // srv's port, where newBackendOn started it; else nil
}

// fakeChat answers /v1/chat/completions like vLLM: JSON, or an SSE stream of
// `chunks` data events and [DONE] when the body asks for "stream": true. It
// echoes the SHA-256 and length of the body it received in headers, so
// tests can check bodies arrive byte for byte.
func (b *backend) fakeChat(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	w.Header().Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
	w.Header().Set("X-Body-Len", fmt.Sprint(len(body)))
	w.Header().Set("X-Backend", b.name)
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range chunks {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", req.Model, i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hello from %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`, req.Model, b.name)
}

// chunks is how many data events a fake stream sends before [DONE].
const chunks = 5

func newBackend(t testing.TB, name string) *backend {
	t.Helper()
	return newBackendOn(t, name, testutil.HoldPort(t))
}

// newBackendOn starts a backend on port: a fresh one, or a killed
// backend's, to restart it where it was.
func newBackendOn(t testing.TB, name string, port *testutil.PortHold) *backend {
	t.Helper()
	b := &backend{name: name, port: port}
	b.srv = serveOn(t, port, http.HandlerFunc(b.fakeChat))
	return b
}

// serveOn starts a test server for h on port until the test ends. The
// port is held for the test (testutil.PortHold): once a test closes the
// server, as it kills a backend, the backend's address refuses
// connections until the test ends, or until a server is started on the
// port again, and no other test's listener can be given the port in
// between, as one could a port the closed listener gave back.
func serveOn(t testing.TB, port *testutil.PortHold, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := port.Listen()
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	_ = srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

func endpointsOf(bs ...*backend) []inferlb.Endpoint {
	eps := make([]inferlb.Endpoint, len(bs))
	for i, b := range bs {
		eps[i] = inferlb.Endpoint{ID: b.name, Addr: b.addr()}
	}
	return eps
}

// newTransport builds a Transport over a private http.Transport whose idle
// connections are closed at cleanup (goleak would see their goroutines).
func newTransport(t testing.TB, o httpbalancer.Options) *httpbalancer.Transport {
	t.Helper()
	if o.Base == nil {
		base := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(base.CloseIdleConnections)
		o.Base = base
	}
	tr, err := httpbalancer.NewTransport(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func chatBody(i int, stream bool) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}],"stream":%t,"max_tokens":16}`, i, stream)
}

// post sends a chat completion and reads the whole response.
func post(t testing.TB, c *http.Client, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, out
}

// statsByID indexes Balancer.Stats by endpoint ID.
func statsByID(b *balancer.Balancer) map[string]balancer.EndpointStats {
	m := map[string]balancer.EndpointStats{}
	for _, s := range b.Stats() {
		m[s.ID] = s
	}
	return m
}

// totalInFlight sums in-flight calls over all endpoints.
func totalInFlight(b *balancer.Balancer) int64 {
	var n int64
	for _, s := range b.Stats() {
		n += s.InFlight
	}
	return n
}

// results collects OnResult reports.
type results struct {
	n atomic.Int64
	c chan httpbalancer.Result
}

func newResults(size int) *results { return &results{c: make(chan httpbalancer.Result, size)} }

func (r *results) on(res httpbalancer.Result) {
	r.n.Add(1)
	select {
	case r.c <- res:
	default:
	}
}

// baseFunc is a Base transport from a function.
type baseFunc func(*http.Request) (*http.Response, error)

func (f baseFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// heldStream is a server that sends one SSE event and holds the stream open
// until the request's context ends or the test is over.
func heldStream(t *testing.T, event string) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, event)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close) // runs after close(release): handlers return first
	t.Cleanup(func() { close(release) })
	return srv
}
