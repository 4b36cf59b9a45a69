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
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// slowFirstAccept holds the first connection it accepts for delay before
// handing it to the server, as a slow first TCP or TLS handshake: the
// first call over it waits that long more than the calls after it.
type slowFirstAccept struct {
	net.Listener
	delay time.Duration
	n     atomic.Int64
}

func (l *slowFirstAccept) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.n.Add(1) == 1 {
		time.Sleep(l.delay)
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
// handshake. (Its share of the run after that depends on loopback
// noise: each endpoint's highest sample is its peak, and calls go to the
// lowest.)
func TestSlowFirstDialDoesNotShunEndpoint(t *testing.T) {
	names := []string{"slowdial", "b", "c"}
	hits := make([]atomic.Int64, len(names))
	var eps []inferlb.Endpoint
	for i, name := range names {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			hits[i].Add(1)
			time.Sleep(2 * time.Millisecond) // the embedding
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`)
		}))
		if i == 0 {
			srv.Listener = &slowFirstAccept{Listener: srv.Listener, delay: 100 * time.Millisecond}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: name, Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps})
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
	assert.Less(t, st.ServiceLatency[inferlb.ServiceEmbedding], 50*time.Millisecond, "slowdial's embedding latency")
}
