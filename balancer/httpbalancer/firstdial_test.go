package httpbalancer_test

import (
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

// slowFirstAccept moves a fake clock on by delay when it accepts its
// first connection, before the server reads a byte of it: on the clock
// the balancer reads, the first call over it waits that much more than
// the calls after it, as a slow first TCP or TLS handshake makes it.
type slowFirstAccept struct {
	net.Listener
	clock *testutil.Clock
	delay time.Duration
	n     atomic.Int64
}

func (l *slowFirstAccept) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.n.Add(1) == 1 {
		l.clock.Advance(l.delay)
	}
	return c, err
}

// Three embedding servers on loopback answer in 2 ms, the first
// connection to "slowdial" 100 ms later. Its first answer made its
// peak-EWMA, and calls sent one at a time never put one in flight
// elsewhere, so it drew 1 call of 150 (the balancer probes it again
// once that EWMA has decayed below its peers', 30 s and more at the
// default LatencyDecay). Its first answer is held aside: it draws the
// next call too, and its latency is that of its calls, not of its
// handshake.
//
// The time is a fake clock's, which the servers move on (the handshake in
// Accept, the answer in the handler) before the client can read their
// answers. On the wall clock, a 2-core runner under load that stalled one
// of slowdial's counted answers past 50 ms made its peak-EWMA read that
// stall, and the test failed (2 of 510 runs on a loaded 2-core machine;
// one read 60 ms).
func TestSlowFirstDialDoesNotShunEndpoint(t *testing.T) {
	clock := testutil.NewClock()
	names := []string{"slowdial", "b", "c"}
	hits := make([]atomic.Int64, len(names))
	var eps []inferlb.Endpoint
	for i, name := range names {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			hits[i].Add(1)
			clock.Advance(2 * time.Millisecond) // the embedding
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`)
		}))
		if i == 0 {
			srv.Listener = &slowFirstAccept{Listener: srv.Listener, clock: clock, delay: 100 * time.Millisecond}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: name, Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       eps,
		BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
	})
	embed := func() {
		req, err := http.NewRequest(http.MethodPost, "http://embed.internal/v1/embeddings", strings.NewReader(`{"model":"e5","input":"a"}`))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	for range 150 {
		embed()
	}
	t.Logf("calls: slowdial %d, b %d, c %d", hits[0].Load(), hits[1].Load(), hits[2].Load())
	assert.GreaterOrEqual(t, hits[0].Load(), int64(2), "calls slowdial drew")
	st := statsByID(tr.Balancer())["slowdial"]
	assert.Less(t, st.ServiceLatency[inferlb.ServiceEmbedding], 50*time.Millisecond, "slowdial's embedding latency: its calls' 2 ms, not the 102 ms of its first")
}
