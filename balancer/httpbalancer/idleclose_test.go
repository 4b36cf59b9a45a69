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

// raceFleet is a Transport over backends a and b (the first fleet of them)
// that prefers a, sending through race, with its Results in res; o adds
// options of the test's own.
func raceFleet(t testing.TB, fleet int, o httpbalancer.Options) (race *idleRace, a, b *backend, res *results, tr *httpbalancer.Transport) {
	race = newIdleRace(t)
	a, b = race.backend(t, "a"), race.backend(t, "b")
	res = newResults(8)
	o.Endpoints, o.Base, o.BalancerOptions, o.OnResult = endpointsOf(a, b)[:fleet], race, preferOpts("a"), res.on
	return race, a, b, res, newTransport(t, o)
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
				race, a, b, res, tr := raceFleet(t, fleet, httpbalancer.Options{})
				client := &http.Client{Transport: tr}
				body := []byte(chatBody(1, false))
				sendBody(t, client, body, mode) // leaves an idle connection to a
				require.False(t, (<-res.c).Resent, "the first call met no idle close")

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
				assert.True(t, r.Resent, "sent twice to a")
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

// TestHangUpAfterTheRequestStillCounts: a server that read the request on
// a reused connection and then closed it (a crash, a restart, a server
// that hangs up) may have acted on the call: net/http returns io.EOF, and
// that is the endpoint's failure, failed over as before, not sent again.
func TestHangUpAfterTheRequestStillCounts(t *testing.T) {
	race := newIdleRace(t) // unarmed: a Base that records net/http's errors
	var hangUps atomic.Int64
	a := &backend{name: "a"}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hang-Up") == "" {
			a.fakeChat(w, r)
			return
		}
		hangUps.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(a.srv.Close)
	b := newBackend(t, "b")
	res := newResults(8)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(a, b),
		Base:            race,
		BalancerOptions: preferOpts("a"),
		OnResult:        res.on,
	})
	client := &http.Client{Transport: tr}
	post(t, client, chatBody(1, false)) // leaves an idle connection to a
	<-res.c

	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(2, false)))
	require.NoError(t, err)
	req.Header.Set("X-Hang-Up", "1")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())

	errs := race.attempts()
	require.Len(t, errs, 3, "attempts through Base")
	require.ErrorIs(t, errs[1], io.EOF, "net/http's error for a hang-up on a reused connection")
	assert.False(t, httpbalancer.ServerClosedIdle(errs[1]))
	assert.EqualValues(t, 2, race.dials.Load(), "a's, which the hang-up reused, and b's")
	assert.EqualValues(t, 1, hangUps.Load(), "not sent to a again")
	assert.EqualValues(t, 1, b.hits.Load(), "failed over")
	first, second := <-res.c, <-res.c
	assert.Equal(t, "a", first.Endpoint)
	assert.True(t, first.FailedOver)
	assert.ErrorIs(t, first.Outcome.Err, io.EOF)
	assert.False(t, first.Outcome.Canceled())
	assert.Equal(t, "b", second.Endpoint)
	st := statsByID(tr.Balancer())
	assert.EqualValues(t, 1, st["a"].Failures)
	assert.Positive(t, st["a"].ErrorRate)
	assert.EqualValues(t, 1, st["b"].Successes)
	assert.Equal(t, balancer.RetryStats{Allowed: 1}, tr.Balancer().RetryStats())
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestIdleCloseRaceThenServerGone: uvicorn's graceful shutdown (a rolling
// restart) closes its idle connections and stops listening. The call that
// met the closed connection is sent to the same endpoint again, is
// refused there, and then fails over: the refusal is the endpoint's
// failure, the idle close is not.
func TestIdleCloseRaceThenServerGone(t *testing.T) {
	race, a, b, res, tr := raceFleet(t, 2, httpbalancer.Options{})
	client := &http.Client{Transport: tr}
	post(t, client, chatBody(1, false))
	<-res.c

	require.NoError(t, a.srv.Listener.Close()) // shutting down: its last connection is idle
	race.armed.Store(true)
	post(t, client, chatBody(2, false))

	require.EqualValues(t, 1, race.raced.Load(), "the race happened")
	errs := race.attempts()
	require.Len(t, errs, 4, "attempts through Base: the race, the refusal, b")
	require.EqualError(t, errs[1], errServerClosedIdleText)
	var op *net.OpError
	require.ErrorAs(t, errs[2], &op, "refused")
	assert.Equal(t, "dial", op.Op)
	assert.NoError(t, errs[3])
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
	refused, onB := <-res.c, <-res.c
	assert.Equal(t, "a", refused.Endpoint)
	assert.True(t, refused.FailedOver)
	assert.True(t, refused.Resent, "a's attempt was sent twice")
	assert.False(t, onB.Resent, "b's was not")
	assert.ErrorAs(t, refused.Outcome.Err, &op)
	assert.Equal(t, "b", onB.Endpoint)
	assert.EqualValues(t, 3, res.n.Load(), "the idle close is no attempt of its own")
	st := statsByID(tr.Balancer())
	assert.EqualValues(t, 2, st["a"].Picks)
	assert.EqualValues(t, 1, st["a"].Failures, "the refusal, not the idle close")
	assert.Equal(t, balancer.RetryStats{Allowed: 1}, tr.Balancer().RetryStats(), "the failover's")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestIdleCloseRaceWithABodyThatCannotBeSentAgain: a call whose body
// cannot be had again fails with net/http's error, naming the endpoint,
// and blames it for nothing; it cannot fail over either.
func TestIdleCloseRaceWithABodyThatCannotBeSentAgain(t *testing.T) {
	race, _, b, res, tr := raceFleet(t, 2, httpbalancer.Options{MaxPeek: -1})
	client := &http.Client{Transport: tr}
	post(t, client, chatBody(1, false))
	<-res.c

	race.armed.Store(true)
	req, err := http.NewRequest(http.MethodPost, chatURL, onlyReader{strings.NewReader(chatBody(2, false))})
	require.NoError(t, err)
	_, err = client.Do(req)
	require.Error(t, err)
	require.EqualValues(t, 1, race.raced.Load(), "the race happened")
	var ee *httpbalancer.EndpointError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, "a", ee.Endpoint)
	assert.EqualError(t, ee.Err, errServerClosedIdleText)
	assert.Len(t, race.attempts(), 2, "not sent again")
	assert.Zero(t, b.hits.Load())
	r := <-res.c
	assert.Equal(t, "a", r.Endpoint)
	assert.False(t, r.FailedOver)
	assert.True(t, r.Outcome.Canceled(), "no endpoint to blame: %v", r.Outcome.Err)
	st := statsByID(tr.Balancer())
	assert.Zero(t, st["a"].Failures)
	assert.Zero(t, st["a"].ErrorRate)
	assert.Equal(t, balancer.RetryStats{}, tr.Balancer().RetryStats())
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// closedIdleBase fails the first n attempts to endpoint addr with err
// (net/http's errServerClosedIdle) and sends the others through base. Its
// hook, if set, runs at each failed attempt.
type closedIdleBase struct {
	base http.RoundTripper
	addr string
	err  error
	n    atomic.Int64
	hook func(*http.Request)
}

func (c *closedIdleBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host == c.addr && c.n.Add(-1) >= 0 {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		if c.hook != nil {
			c.hook(r)
		}
		return nil, c.err
	}
	return c.base.RoundTrip(r)
}

// TestIdleCloseRaceIsSentAgainOnce: a call sent again that meets another
// connection closed while idle is not sent a third time; it fails over as
// any call that failed before a response, but still blames no endpoint.
// A call whose context ended, or whose GetBody panics, is not sent again,
// and its pick is finished. DisableFailover does not stop the resend, which
// is no failover.
func TestIdleCloseRaceIsSentAgainOnce(t *testing.T) {
	closed := realServerClosedIdle(t)
	a, b := newBackend(t, "a"), newBackend(t, "b")
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	for _, tc := range []struct {
		name            string
		fleet, failures int
		hook            func(*http.Request)
		getBody         func() (io.ReadCloser, error)
		wantA, wantB    int64 // attempts reaching each
		wantResults     int
		wantErr         bool
		wantPanic       bool
		wantRetries     balancer.RetryStats
	}{
		{name: "twice, fails over", fleet: 2, failures: 2, wantB: 1, wantResults: 2, wantRetries: balancer.RetryStats{Allowed: 1}},
		{name: "twice, nowhere to go", fleet: 1, failures: 2, wantResults: 1, wantErr: true},
		{name: "once", fleet: 2, failures: 1, wantA: 1, wantResults: 1},
		{name: "failover disabled", fleet: 2, failures: 1, wantA: 1, wantResults: 1},
		{name: "context ended", fleet: 2, failures: 1, wantResults: 1, wantErr: true},
		{name: "GetBody panics", fleet: 2, failures: 1, wantResults: 1, wantPanic: true,
			getBody: func() (io.ReadCloser, error) { panic("GetBody") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.hits.Store(0)
			b.hits.Store(0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fb := &closedIdleBase{base: base, addr: a.addr(), err: closed}
			fb.n.Store(int64(tc.failures))
			if tc.name == "context ended" {
				fb.hook = func(*http.Request) { cancel() }
			}
			res := newResults(8)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       endpointsOf(a, b)[:tc.fleet],
				Base:            fb,
				BalancerOptions: preferOpts("a"),
				OnResult:        res.on,
				MaxPeek:         -1, // replays come from GetBody
				DisableFailover: tc.name == "failover disabled",
			})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
			require.NoError(t, err)
			if tc.getBody != nil {
				req.GetBody = tc.getBody
			}
			send := func() {
				resp, err := tr.RoundTrip(req)
				if tc.wantErr {
					require.Error(t, err)
					return
				}
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				require.NoError(t, resp.Body.Close())
			}
			if tc.wantPanic {
				require.PanicsWithValue(t, "GetBody", send)
			} else {
				send()
			}
			assert.Equal(t, tc.wantA, a.hits.Load(), "attempts on a past the closed connections")
			assert.Equal(t, tc.wantB, b.hits.Load())
			require.EqualValues(t, tc.wantResults, res.n.Load())
			r := <-res.c
			assert.Equal(t, "a", r.Endpoint)
			if tc.wantA == 0 {
				assert.True(t, r.Outcome.Canceled(), "a is not to blame: %v", r.Outcome.Err)
			}
			st := statsByID(tr.Balancer())
			assert.EqualValues(t, 1, st["a"].Picks)
			assert.Zero(t, st["a"].Failures)
			assert.Zero(t, st["a"].ErrorRate)
			assert.Equal(t, tc.wantRetries, tr.Balancer().RetryStats())
			resends := uint64(1) // a call not sent again is not counted
			if tc.name == "context ended" || tc.wantPanic {
				resends = 0
			}
			assert.Equal(t, httpbalancer.TransportStats{Resends: resends, Failovers: tc.wantRetries.Allowed}, tr.Stats())
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}
