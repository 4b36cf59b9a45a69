package httpbalancer_test

import (
	"context"
	"io"
	"net/http"
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

// A forward step of the wall clock is no wait for the transport either,
// whether or not OnResult is set: with it, the transport measured the
// latency it gives the balancer (and OnResult) as the wall clock's time
// since the pick, so two chat calls stopped by their callers 100 ms after
// their picks, with the wall clock stepped an hour forward between, read
// an hour's wait each, made a run of abandoned calls on a replica whose
// answers take a second (Abandoned 2), and the replica was priced as hung;
// without OnResult the balancer measured the wait itself, on its
// monotonic clock (balancer.MonotonicClock), and nothing was marked. Time
// that does pass, 30 s, still counts, with OnResult or without.
func TestForwardClockStepIsNoWaitWithOnResult(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onResult bool
		step     bool // the wall clock steps forward an hour; else 30 s pass
		wantRun  int64
		wantWait time.Duration // the Latency OnResult reads for each stopped call
	}{
		{name: "OnResult, wall clock stepped", onResult: true, step: true, wantRun: 0, wantWait: 100 * time.Millisecond},
		{name: "OnResult, time passed", onResult: true, step: false, wantRun: 2, wantWait: 30*time.Second + 100*time.Millisecond},
		{name: "no OnResult, wall clock stepped", step: true, wantRun: 0},
		{name: "no OnResult, time passed", step: false, wantRun: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewMonoClock()
			var answer atomic.Bool
			answer.Store(true)
			sent := make(chan struct{}, 1)
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				if answer.Load() {
					clock.Advance(time.Second) // the replica's answers take a second
					return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
						Body: io.NopCloser(strings.NewReader(`{"choices":[]}`)), Request: r}, nil
				}
				sent <- struct{}{}
				<-r.Context().Done() // a hung engine: nothing back
				return nil, r.Context().Err()
			})
			res := newResults(4)
			o := httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
				Base:            base,
				BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
			}
			if tc.onResult {
				o.OnResult = res.on
			}
			tr := newTransport(t, o)
			call := func(ctx context.Context) error {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				resp, err := tr.RoundTrip(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.Body.Close()
			}
			require.NoError(t, call(context.Background()))
			if tc.onResult {
				<-res.c
			}

			answer.Store(false)
			for range 2 {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- call(ctx) }()
				<-sent
				clock.Advance(100 * time.Millisecond)
				if tc.step {
					clock.Step(time.Hour)
				} else {
					clock.Advance(30 * time.Second)
				}
				cancel()
				require.Error(t, <-done)
				if tc.onResult {
					r := <-res.c
					assert.True(t, r.Outcome.Unanswered)
					assert.Equal(t, tc.wantWait, r.Outcome.Latency, "the wait OnResult reads")
				}
			}
			s := tr.Balancer().Stats()[0]
			t.Logf("unanswered %d, abandoned run %d", s.Unanswered, s.Abandoned)
			assert.EqualValues(t, 2, s.Unanswered)
			assert.Equal(t, tc.wantRun, s.Abandoned, "run of abandoned generation calls")
		})
	}
}

// An embedding call's latency is its wait for the response headers, which
// the transport measures itself: a forward step of the wall clock while
// the call was out counted as an hour's wait, and raised the endpoint's
// embedding latency to the hour. It counts what passed, 200 ms.
func TestForwardClockStepIsNoEmbeddingLatency(t *testing.T) {
	clock := testutil.NewMonoClock()
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		clock.Advance(100 * time.Millisecond)
		clock.Step(time.Hour)
		clock.Advance(100 * time.Millisecond)
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"data":[]}`)), Request: r}, nil
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
		Base:            base,
		BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
	})
	req, err := http.NewRequest(http.MethodPost, "http://llm.internal/v1/embeddings", strings.NewReader(`{"model":"m","input":"hello"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	s := tr.Balancer().Stats()[0]
	assert.Equal(t, 200*time.Millisecond, s.ServiceLatency[inferlb.ServiceEmbedding], "embedding latency")
}

// stepBody hands out one chunk a Read, running the chunk's action (the
// time it takes to come: clock moves) before it.
type stepBody struct {
	chunks []string
	before []func()
}

func (b *stepBody) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		return 0, io.EOF
	}
	b.before[0]()
	n := copy(p, b.chunks[0])
	b.chunks, b.before = b.chunks[1:], b.before[1:]
	return n, nil
}

func (b *stepBody) Close() error { return nil }

// A forward step of the wall clock while a stream is out is no time to
// its first token, nor between its tokens. The transport stamped the
// stream's data events from the wall clock: a step of an hour before the
// first token (answered in 200 ms) made its TTFT 1h0m0.2s, and set the
// endpoint's TTFT EWMA to it; a step between the third and fourth of five
// tokens 20 ms apart made the time between tokens 15m0.02s, and the
// endpoint's decode speed an hour per token too slow. Without a step the
// stream measures as it did.
func TestForwardClockStepIsNoStreamTiming(t *testing.T) {
	const ev = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	for _, tc := range []struct {
		name   string
		stepAt int // the Read before whose chunk the wall clock steps an hour (-1: none)
	}{
		{name: "no step", stepAt: -1},
		{name: "step before the first token", stepAt: 0},
		{name: "step between tokens", stepAt: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewMonoClock()
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				body := &stepBody{}
				for i := range 5 {
					d := 20 * time.Millisecond
					if i == 0 {
						d = 200 * time.Millisecond
					}
					body.chunks = append(body.chunks, ev)
					body.before = append(body.before, func() {
						clock.Advance(d / 2)
						if i == tc.stepAt {
							clock.Step(time.Hour)
						}
						clock.Advance(d / 2)
					})
				}
				return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: body, Request: r}, nil
			})
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
				Base:            base,
				BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
				OnResult:        res.on,
			})
			req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			r := <-res.c
			s := tr.Balancer().Stats()[0]
			t.Logf("TTFT %v, time between tokens %v; endpoint TTFT %v, time per output token %v",
				r.Outcome.TTFT, r.TimeBetweenTokens, s.TTFT, s.TimePerOutputToken)
			assert.Equal(t, 200*time.Millisecond, r.Outcome.TTFT, "TTFT")
			assert.Equal(t, 20*time.Millisecond, r.TimeBetweenTokens, "time between tokens")
			assert.Equal(t, 200*time.Millisecond, s.TTFT, "endpoint's TTFT")
			assert.Equal(t, 20*time.Millisecond, s.TimePerOutputToken, "endpoint's time per output token")
		})
	}
}
