package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// preferUntilFailed makes endpoint id the cheapest until it has failed, so
// the first attempt deterministically goes there.
type preferUntilFailed string

func (p preferUntilFailed) Cost(_ *inferlb.Request, s scoring.State) float64 {
	if s.Endpoint.Key() == string(p) {
		return 10 * s.ErrorRate
	}
	return 0.5
}

func preferOpts(id string) balancer.Options {
	return balancer.Options{
		Rand:     testutil.NewRand(1),
		Scorers:  map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: preferUntilFailed(id)},
		Affinity: balancer.AffinityOff, // else the key's owner is picked whatever the scorer says
	}
}

func TestFailoverRetriesOnAnotherEndpoint(t *testing.T) {
	good := newBackend(t, "good")
	// A pipe body is replayable once the peek read it whole; an in-memory
	// one (known, strings, buffer) is copied, not read, by the peek, and
	// replayed by GetBody, or from the copy when there is no GetBody. A
	// body the transport cannot see into (wrapped, rewinding), larger than
	// the peek, is sent from a GetBody copy and replayed from another.
	for _, tc := range []struct {
		mode, maxPeek int
	}{
		{knownLength, 0}, {pipe, 0}, {stringsBody, 0}, {bufferBody, 0}, {noGetBody, 0}, {lengthOnly, 0},
		{wrapped, 0}, {rewinding, 0}, {knownLength, 8}, {bufferBody, 8}, {wrapped, 8}, {rewinding, 8},
	} {
		mode := tc.mode
		t.Run(fmt.Sprintf("%s/peek=%d", modeNames[mode], tc.maxPeek), func(t *testing.T) {
			good.hits.Store(0)
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{ID: "dead", Addr: testutil.RefusedAddr(t)}, {ID: "good", Addr: good.addr()}},
				BalancerOptions: preferOpts("dead"),
				OnResult:        res.on,
				MaxPeek:         tc.maxPeek,
			})
			sendBody(t, &http.Client{Transport: tr}, []byte(chatBody(1, false)), mode)
			require.EqualValues(t, 2, res.n.Load(), "attempts")
			first, second := <-res.c, <-res.c
			assert.Equal(t, "dead", first.Endpoint)
			assert.True(t, first.FailedOver)
			assert.Error(t, first.Outcome.Err)
			assert.Equal(t, "good", second.Endpoint)
			assert.NoError(t, second.Outcome.Err)
			assert.EqualValues(t, 1, good.hits.Load())
			st := statsByID(tr.Balancer())
			assert.EqualValues(t, 1, st["dead"].Failures, "the failed attempt is reported first")
			assert.EqualValues(t, 1, st["good"].Successes)
			assert.EqualValues(t, 1, tr.Balancer().RetryStats().Allowed)
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}

// TestFailoverFromAffinityOwner: a request whose prompt key is owned by a
// dead endpoint is retried elsewhere, not on the owner again.
func TestFailoverFromAffinityOwner(t *testing.T) {
	good := newBackend(t, "good")
	res := newResults(64)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "dead", Addr: testutil.RefusedAddr(t)}, {ID: "good", Addr: good.addr()}},
		BalancerOptions: balancer.Options{Rand: testutil.NewRand(1), AffinitySeed: 1},
		Keyer:           cache.NewKeyer(1),
		OnResult:        res.on,
	})
	client := &http.Client{Transport: tr}
	for i := range 20 {
		resp, _ := post(t, client, chatBody(i, false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	failedOver := 0
	for range res.n.Load() {
		if r := <-res.c; r.FailedOver {
			failedOver++
			assert.Equal(t, "dead", r.Endpoint)
		}
	}
	t.Logf("20 requests, %d failed over from the dead owner", failedOver)
	assert.Positive(t, failedOver)
	assert.EqualValues(t, 20, good.hits.Load())
}

// TestNoFailover: the cases where a second attempt would be wrong or
// impossible get exactly one attempt and the caller sees the error.
func TestNoFailover(t *testing.T) {
	good := newBackend(t, "good")
	arrived := make(chan struct{}, 1)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices the client leaving only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	defer hang.Close()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		fmt.Fprint(w, "partial")
		w.(http.Flusher).Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	defer cut.Close()

	for _, tc := range []struct {
		name    string
		addr    string
		opts    func(*httpbalancer.Options)
		body    func() io.Reader
		ctx     func() (context.Context, context.CancelFunc)
		started bool // the response started: the error shows on the body
	}{
		{name: "body not replayable", addr: testutil.RefusedAddr(t),
			opts: func(o *httpbalancer.Options) { o.MaxPeek = -1 },
			body: func() io.Reader { return onlyReader{strings.NewReader(chatBody(1, false))} }},
		{name: "body over the peek and not replayable", addr: testutil.RefusedAddr(t),
			opts: func(o *httpbalancer.Options) { o.MaxPeek = 8 },
			body: func() io.Reader { return onlyReader{strings.NewReader(chatBody(1, false))} }},
		{name: "failover disabled", addr: testutil.RefusedAddr(t),
			opts: func(o *httpbalancer.Options) { o.DisableFailover = true }},
		{name: "retry budget spent", addr: testutil.RefusedAddr(t),
			opts: func(o *httpbalancer.Options) { o.BalancerOptions.RetryRatio, o.BalancerOptions.RetryFloor = -1, -1 }},
		{name: "context canceled", addr: strings.TrimPrefix(hang.URL, "http://"),
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				return ctx, cancel
			}},
		{name: "response started", addr: strings.TrimPrefix(cut.URL, "http://"), started: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good.hits.Store(0)
			res := newResults(4)
			o := httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{ID: "bad", Addr: tc.addr}, {ID: "good", Addr: good.addr()}},
				BalancerOptions: preferOpts("bad"),
				OnResult:        res.on,
			}
			if tc.opts != nil {
				tc.opts(&o)
			}
			tr := newTransport(t, o)
			var body io.Reader = strings.NewReader(chatBody(1, false))
			if tc.body != nil {
				body = tc.body()
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, body)
			var err error
			if tc.ctx != nil {
				// Cancel once the hung backend holds the request.
				done := make(chan error, 1)
				go func() {
					resp, err := tr.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
					}
					done <- err
				}()
				<-arrived
				cancel()
				err = <-done
			} else {
				var resp *http.Response
				resp, err = tr.RoundTrip(req)
				if tc.started {
					require.NoError(t, err)
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
			}
			require.Error(t, err)
			assert.Zero(t, good.hits.Load(), "no second attempt")
			require.EqualValues(t, 1, res.n.Load(), "one attempt reported")
			r := <-res.c
			assert.Equal(t, "bad", r.Endpoint)
			assert.False(t, r.FailedOver)
			assert.Zero(t, totalInFlight(tr.Balancer()))
			if tc.ctx != nil {
				assert.True(t, r.Outcome.Canceled(), "a canceled call says nothing about the endpoint: %v", r.Outcome.Err)
			}
		})
	}
}

// TestFailoverStoppedBackend: stopping one of three backends during a run of
// a few hundred concurrent requests fails none of them, and the calls sent
// to it stop once its breaker trips.
//
// The backend is stopped between calls: the workers finish the calls they
// have in flight and wait. A call still in flight when its server went might
// have failed or not (its answer was on the wire or already in the client),
// and a success among the failures restarts the breaker's count of them:
// the failures on c then ranged from 5 to 10, against a bound of 10, as the
// workers happened to be scheduled. Stopped between calls, every call sent
// to c fails, so the breaker trips at its BreakerFailures-th failure, and
// only the calls the other workers had already sent there fail after it.
func TestFailoverStoppedBackend(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(a, b, c),
		BalancerOptions: balancer.Options{Rand: testutil.NewRand(3)},
	})
	client := &http.Client{Transport: tr}
	const total, workers, stopAt = 300, 4, 100
	jobs := make(chan int, total)
	for i := range total {
		jobs <- i
	}
	close(jobs)
	var completed, failed atomic.Int64
	var stop sync.Once
	var calls sync.RWMutex // each call holds it shared; stopping c, exclusively
	var hitsAtStop int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				calls.RLock()
				req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				calls.RUnlock()
				if err != nil {
					failed.Add(1)
					t.Errorf("request %d: %v", i, err)
				}
				if completed.Add(1) == stopAt {
					stop.Do(func() {
						calls.Lock()
						defer calls.Unlock()
						c.srv.CloseClientConnections() // its idle keep-alive connections
						c.srv.Close()
						hitsAtStop = c.hits.Load()
					})
				}
			}
		})
	}
	wg.Wait()
	st := statsByID(tr.Balancer())
	t.Logf("hits a=%d b=%d c=%d (c stopped at %d); attempts failed on c: %d; retries %+v",
		a.hits.Load(), b.hits.Load(), c.hits.Load(), hitsAtStop, st["c"].Failures, tr.Balancer().RetryStats())
	assert.Zero(t, failed.Load(), "lost requests")
	assert.LessOrEqual(t, st["c"].Failures, uint64(balancer.DefaultBreakerFailures+workers-1),
		"traffic to the stopped backend must stop once its breaker trips")
	assert.Equal(t, hitsAtStop, c.hits.Load(), "c answered nothing once stopped")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// preferAlways makes endpoint id the cheapest whatever its errors.
type preferAlways string

func (p preferAlways) Cost(_ *inferlb.Request, s scoring.State) float64 {
	if s.Endpoint.Key() == string(p) {
		return 0
	}
	return 1
}

// TestFailoverWithNowhereToGoSpendsNoRetry: a failover that finds no
// other endpoint (a fleet of one, or every other one out of rotation,
// which is when budgets matter) retries nothing, so it spends none of the
// retry budget and counts as no retry: the budget is left for a failover
// that can happen. It used to be spent first and the call then failed
// with nowhere to go.
func TestFailoverWithNowhereToGoSpendsNoRetry(t *testing.T) {
	good := newBackend(t, "good")
	dead := inferlb.Endpoint{ID: "dead", Addr: testutil.RefusedAddr(t)}
	res := newResults(8)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{dead},
		BalancerOptions: balancer.Options{
			Rand:     testutil.NewRand(1),
			Clock:    testutil.NewClock(),
			Scorers:  map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: preferAlways("dead")},
			Affinity: balancer.AffinityOff,
			// The floor only, on a clock that stands still: one retry.
			RetryRatio: -1, RetryFloor: 1,
		},
		OnResult: res.on,
	})
	client := &http.Client{Transport: tr}
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
		_, err := client.Do(req)
		require.Error(t, err)
		r := <-res.c
		assert.Equal(t, "dead", r.Endpoint)
		assert.False(t, r.FailedOver, "nothing to fail over to")
	}
	assert.Equal(t, balancer.RetryStats{}, tr.Balancer().RetryStats())

	require.NoError(t, tr.Update([]inferlb.Endpoint{dead, {ID: "good", Addr: good.addr()}}))
	resp, _ := post(t, client, chatBody(9, false))
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the budget's one retry is still there")
	assert.EqualValues(t, 1, good.hits.Load())
	assert.Equal(t, balancer.RetryStats{Allowed: 1}, tr.Balancer().RetryStats())
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestFailoverWithoutABodySpendsNoRetry: a failover whose body cannot be
// had again (the caller's GetBody fails) retries nothing, so it spends
// none of the retry budget either.
func TestFailoverWithoutABodySpendsNoRetry(t *testing.T) {
	good := newBackend(t, "good")
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "dead", Addr: testutil.RefusedAddr(t)}, {ID: "good", Addr: good.addr()}},
		BalancerOptions: preferOpts("dead"),
		OnResult:        res.on,
		MaxPeek:         -1, // so the body is replayed by GetBody alone
	})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no replay") }
	_, err = (&http.Client{Transport: tr}).Do(req)
	require.Error(t, err)
	require.EqualValues(t, 1, res.n.Load())
	assert.False(t, (<-res.c).FailedOver)
	assert.Equal(t, balancer.RetryStats{}, tr.Balancer().RetryStats())
	assert.Zero(t, good.hits.Load())
}

// failingAfter is a request body that gives n spaces and then fails, as a
// caller's upload does when its client drops it.
type failingAfter struct{ n int }

func (f *failingAfter) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, io.ErrClosedPipe
	}
	k := min(len(p), f.n)
	copy(p, strings.Repeat(" ", k))
	f.n -= k
	return k, nil
}

// TestFailoverBodyFromABadGetBodyBlamesNoEndpoint: the failover's body
// comes from the caller's GetBody, and when that copy is not the body (a
// GetBody left over from before a middleware replaced Body, of another
// length) or fails while it is sent, the endpoint the call failed over to
// is not blamed, as it is not for the first attempt's body: the stale copy
// is not sent, and one that fails or turns out of another length counts
// as the caller's. Each used to count as a failure of the healthy
// endpoint, and the call's error to name it.
func TestFailoverBodyFromABadGetBodyBlamesNoEndpoint(t *testing.T) {
	good := newBackend(t, "good")
	body := chatBody(1, false)
	for _, tc := range []struct {
		name    string
		getBody func() (io.ReadCloser, error)
		sent    bool // the copy reaches Base (it cannot be told from the body before)
	}{
		{name: "stale in memory", getBody: func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(body + "   ")), nil
		}},
		{name: "shorter", sent: true, getBody: func() (io.ReadCloser, error) {
			return opaque{strings.NewReader(body[:len(body)-3])}, nil
		}},
		{name: "longer", sent: true, getBody: func() (io.ReadCloser, error) {
			return opaque{strings.NewReader(body + "   ")}, nil
		}},
		{name: "failing", sent: true, getBody: func() (io.ReadCloser, error) {
			return opaque{&failingAfter{n: 10}}, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good.hits.Store(0)
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{ID: "dead", Addr: testutil.RefusedAddr(t)}, {ID: "good", Addr: good.addr()}},
				BalancerOptions: preferOpts("dead"),
				OnResult:        res.on,
			})
			req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(body))
			require.NoError(t, err)
			req.GetBody = tc.getBody
			resp, err := tr.RoundTrip(req)
			if err == nil {
				// net/http may see the server's answer to the bytes it
				// was promised before it notices the body is longer.
				_, _ = io.Copy(io.Discard, resp.Body)
				require.NoError(t, resp.Body.Close())
			} else {
				var ee *httpbalancer.EndpointError
				if errors.As(err, &ee) {
					assert.Equal(t, "dead", ee.Endpoint, "the error names the endpoint that failed: %v", err)
				}
			}
			st := statsByID(tr.Balancer())
			assert.Zero(t, st["good"].Failures, "the failover's endpoint blamed: %v", err)
			assert.EqualValues(t, 1, st["dead"].Failures)
			assert.Zero(t, totalInFlight(tr.Balancer()))
			if !tc.sent {
				assert.EqualValues(t, 1, res.n.Load(), "one attempt, no failover")
				assert.Zero(t, st["good"].Picks)
			}
		})
	}
}
