package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// idleRace is a Base (a real net/http Transport underneath) that loses the
// keep-alive race on demand, the way a client of uvicorn (vLLM, SGLang)
// loses it when the server's 5 s keep-alive timeout closes a connection
// just as the client takes it from its idle pool: net/http then fails a
// POST with its unexported errServerClosedIdle, and the server never saw
// the request.
//
// Armed, the next attempt that gets a reused connection has the server
// close that connection (a real FIN on loopback) from the GotConn hook,
// which runs after net/http took the connection from its pool and before
// it registers the request on it; the hook returns once net/http's read
// loop has seen the EOF and closed the connection (raceConn.closed), so
// the request meets a connection closed while idle. No sleep: the steps
// are sequenced by the hook and the close.
type idleRace struct {
	base  *http.Transport
	armed atomic.Bool
	dials atomic.Int64
	raced atomic.Int64 // connections the race closed

	mu   sync.Mutex
	srv  map[string]net.Conn // each connection's server side, by the client's address
	errs []error             // what base returned, per attempt
}

func newIdleRace(t testing.TB) *idleRace {
	t.Helper()
	r := &idleRace{srv: map[string]net.Conn{}}
	base := http.DefaultTransport.(*http.Transport).Clone()
	var d net.Dialer
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		r.dials.Add(1)
		return &raceConn{Conn: c, closed: make(chan struct{})}, nil
	}
	t.Cleanup(base.CloseIdleConnections)
	r.base = base
	return r
}

// backend starts a fake chat server whose connections the race can close.
func (r *idleRace) backend(t testing.TB, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.fakeChat))
	r.track(b.srv)
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b
}

// track records the server side of each connection s accepts.
func (r *idleRace) track(s *httptest.Server) {
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			r.mu.Lock()
			r.srv[c.RemoteAddr().String()] = c
			r.mu.Unlock()
		}
	}
}

func (r *idleRace) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.armed.Load() {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: r.gotConn}))
	}
	resp, err := r.base.RoundTrip(req)
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
	return resp, err
}

func (r *idleRace) CloseIdleConnections() { r.base.CloseIdleConnections() }

func (r *idleRace) gotConn(info httptrace.GotConnInfo) {
	if !info.Reused || !r.armed.CompareAndSwap(true, false) {
		return
	}
	c := info.Conn.(*raceConn)
	c.discard.Store(true)
	r.mu.Lock()
	s := r.srv[c.LocalAddr().String()]
	r.mu.Unlock()
	_ = s.Close() // the server's keep-alive timeout
	<-c.closed    // net/http's read loop saw the EOF with no request expected
	r.raced.Add(1)
}

// attempts returns what base returned, per attempt, in order.
func (r *idleRace) attempts() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// raceConn is a client connection whose Close the race waits for.
//
// Once net/http closed it, a raced connection also swallows writes: the
// request may reach net/http's write loop before that loop sees the
// connection closed (it selects between the two at random), and the
// write to the closed socket then fails with nothing written, which
// net/http resends by itself when GetBody is set: the same race, ended
// inside net/http, where the Transport never sees it. Swallowed, the
// request goes nowhere, as when the write loop had already exited, and
// the attempt ends as that case does, with errServerClosedIdle. The
// server gets no byte of the request in either case.
type raceConn struct {
	net.Conn
	once    sync.Once
	closed  chan struct{}
	discard atomic.Bool
}

func (c *raceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

func (c *raceConn) Write(p []byte) (int, error) {
	if c.discard.Load() {
		select {
		case <-c.closed:
			return len(p), nil
		default:
		}
	}
	return c.Conn.Write(p)
}

const errServerClosedIdleText = "http: server closed idle connection" // net/http's, unexported

// TestIdleCloseRaceIsSentAgainOnTheSameEndpoint: a call whose reused
// connection the server closed while idle (net/http's "server closed idle
// connection", which it resends by itself only for idempotent requests)
// is sent again, once, to the same endpoint over a new connection: the
// server never saw it, so it blames no endpoint, spends no retry budget
// and stays where its prompt is cached. It used to count as a failure of
// the endpoint and fail over (or fail, in a fleet of one).
func TestIdleCloseRaceIsSentAgainOnTheSameEndpoint(t *testing.T) {
	for _, fleet := range []int{1, 2} {
		for _, mode := range []int{knownLength, pipe, noGetBody, wrapped} {
			t.Run(fmt.Sprintf("fleet=%d/%s", fleet, modeNames[mode]), func(t *testing.T) {
				race := newIdleRace(t)
				a, b := race.backend(t, "a"), race.backend(t, "b")
				eps := endpointsOf(a, b)[:fleet]
				res := newResults(8)
				tr := newTransport(t, httpbalancer.Options{
					Endpoints:       eps,
					Base:            race,
					BalancerOptions: preferOpts("a"),
					OnResult:        res.on,
				})
				client := &http.Client{Transport: tr}
				body := []byte(chatBody(1, false))
				sendBody(t, client, body, mode) // leaves an idle connection to a
				<-res.c

				race.armed.Store(true)
				sendBody(t, client, body, mode)

				require.EqualValues(t, 1, race.raced.Load(), "the race happened")
				errs := race.attempts()
				require.Len(t, errs, 3, "attempts through Base")
				require.EqualError(t, errs[1], errServerClosedIdleText)
				assert.NoError(t, errs[2])
				assert.EqualValues(t, 2, a.hits.Load(), "a served the call again")
				assert.Zero(t, b.hits.Load(), "no failover")
				assert.EqualValues(t, 2, race.dials.Load(), "sent again over a new connection")

				require.EqualValues(t, 2, res.n.Load(), "one Result per call")
				r := <-res.c
				assert.Equal(t, "a", r.Endpoint)
				assert.NoError(t, r.Outcome.Err)
				assert.False(t, r.FailedOver)
				st := statsByID(tr.Balancer())
				assert.Equal(t, balancer.EndpointStats{}, zeroLoad(st["b"]), "b untouched")
				assert.EqualValues(t, 2, st["a"].Picks, "one pick per call")
				assert.EqualValues(t, 2, st["a"].Successes)
				assert.Zero(t, st["a"].Failures)
				assert.Zero(t, st["a"].ErrorRate)
				assert.False(t, st["a"].BreakerOpen)
				assert.Equal(t, balancer.RetryStats{}, tr.Balancer().RetryStats(), "no retry budget spent")
				assert.Zero(t, totalInFlight(tr.Balancer()))
			})
		}
	}
}

// zeroLoad keeps the counters of s that traffic moves.
func zeroLoad(s balancer.EndpointStats) balancer.EndpointStats {
	return balancer.EndpointStats{Picks: s.Picks, Successes: s.Successes, Failures: s.Failures, Overloads: s.Overloads,
		InFlight: s.InFlight, Trips: s.Trips, Ejections: s.Ejections}
}

// realServerClosedIdle returns net/http's own errServerClosedIdle, made by
// the race on loopback with nothing of this package in the way.
func realServerClosedIdle(t *testing.T) error {
	t.Helper()
	race := newIdleRace(t)
	a := race.backend(t, "a")
	post := func() error {
		req, err := http.NewRequest(http.MethodPost, a.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		resp, err := race.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return err
	}
	require.NoError(t, post())
	race.armed.Store(true)
	err := post()
	require.EqualValues(t, 1, race.raced.Load(), "the race happened")
	require.Error(t, err)
	return err
}

// TestServerClosedIdle holds the classifier to net/http's real error, which
// it matches by its text (the error is unexported): a Go release that
// changes the text fails here. Wrapped with %w it is still seen; anything
// else a reused connection can fail with is not, since the server may have
// read the request.
func TestServerClosedIdle(t *testing.T) {
	closed := realServerClosedIdle(t)
	assert.Equal(t, errServerClosedIdleText, closed.Error())
	for name, err := range map[string]error{
		"net/http's":            closed,
		"wrapped":               fmt.Errorf("otelhttp: %w", closed),
		"in a url.Error":        &url.Error{Op: "Post", URL: chatURL, Err: closed},
		"joined":                errors.Join(io.ErrUnexpectedEOF, closed),
		"in an EndpointError":   &httpbalancer.EndpointError{Endpoint: "a", Err: closed},
		"wrapped in a join":     errors.Join(errors.New("x"), fmt.Errorf("y: %w", closed)),
		"twice wrapped in join": fmt.Errorf("z: %w", errors.Join(fmt.Errorf("y: %w", closed))),
	} {
		assert.True(t, httpbalancer.ServerClosedIdle(err), name)
	}
	for name, err := range map[string]error{
		"nil":               nil,
		"EOF":               io.EOF, // a server that read the request and hung up, as net/http returns it
		"unexpected EOF":    io.ErrUnexpectedEOF,
		"connection broken": fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.EOF),
		"read from server":  errors.New("net/http: Transport failed to read from server: EOF"),
		"reset while idle":  fmt.Errorf("readLoopPeekFailLocked: %w", syscall.ECONNRESET),
		"text, not wrapped": fmt.Errorf("proxy: %v", closed),
		"canceled":          context.Canceled,
	} {
		assert.False(t, httpbalancer.ServerClosedIdle(err), name)
	}
}
