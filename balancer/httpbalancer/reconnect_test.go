package httpbalancer_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// handshakeListener moves a fake clock on by delay for each connection it
// accepts, before the server reads a byte of it: on the clock the
// balancer reads, every new connection's first call waits that much more,
// as a TCP and TLS handshake makes it.
type handshakeListener struct {
	net.Listener
	clock *testutil.Clock
	delay time.Duration
}

func (l *handshakeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.clock.Advance(l.delay)
	}
	return c, err
}

// connSeen is when a server connection last answered, on the fake clock.
type connSeen struct{ last time.Time }

type connSeenKey struct{}

// Three embedding servers on loopback answer in 20 ms of a fake clock, and
// "a" pays a 30 ms handshake for each new connection (on that clock); a
// connection unused for over 4 s is gone, as the default Base's
// IdleConnTimeout makes it (the server drops it when a call comes on it,
// and net/http sends the call again on a new one, which the
// Idempotency-Key lets it do: the call dials, as it does after an idle
// close). One call a second for two minutes; one of a's answers takes
// 40 ms. That answer's peak kept a out until its EWMA had decayed below
// its peers', over 4 s, so the probe that brought it back dialed: 50 ms,
// a new peak, and a drew 11 calls against 55 and 54 for b and c, each
// over a new connection. The probe's latency is held aside now
// (Outcome.Dialed), and the call after it, on the new connection, counts:
// a draws 37, against 42 and 41.
func TestReconnectingEndpointKeepsItsShare(t *testing.T) {
	clock := testutil.NewClock()
	names := []string{"a", "b", "c"}
	hits := make([]atomic.Int64, len(names))
	var aCalls atomic.Int64
	var eps []inferlb.Endpoint
	for i, name := range names {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			seen := r.Context().Value(connSeenKey{}).(*connSeen)
			if !seen.last.IsZero() && clock.Now().Sub(seen.last) > 4*time.Second {
				// Idle too long: the connection is gone.
				conn, _, err := w.(http.Hijacker).Hijack()
				if assert.NoError(t, err) {
					_ = conn.Close()
				}
				return
			}
			hits[i].Add(1)
			took := 20 * time.Millisecond // the embedding
			if name == "a" && aCalls.Add(1) == 3 {
				took = 40 * time.Millisecond
			}
			clock.Advance(took)
			seen.last = clock.Now()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`)
		}))
		srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connSeenKey{}, new(connSeen))
		}
		if name == "a" {
			srv.Listener = &handshakeListener{Listener: srv.Listener, clock: clock, delay: 30 * time.Millisecond}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: name, Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	var aDialed atomic.Int64
	// The default Base (Options.Base nil), whose dials the Transport
	// watches; Close closes its idle connections.
	tr, err := httpbalancer.NewTransport(httpbalancer.Options{
		Endpoints:       eps,
		BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
		OnResult: func(r httpbalancer.Result) {
			if r.Endpoint == "a" && r.Outcome.Dialed {
				aDialed.Add(1)
			}
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	for range 120 {
		clock.Advance(time.Second)
		req, err := http.NewRequest(http.MethodPost, "http://embed.internal/v1/embeddings", strings.NewReader(`{"model":"e5","input":"a"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k")
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	a, b, c := hits[0].Load(), hits[1].Load(), hits[2].Load()
	t.Logf("calls: a %d (%d of them dialed), b %d, c %d", a, aDialed.Load(), b, c)
	assert.GreaterOrEqual(t, a, int64(30), "calls a drew of 120")
	assert.Positive(t, aDialed.Load(), "a's calls over a new connection")
}
