package httpbalancer_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// unansweredTransport is a Transport over one endpoint whose Base is base,
// reporting its attempts to the returned results.
// A maxPeek > 0 is Options.MaxPeek.
func unansweredTransport(t *testing.T, maxPeek int, base baseFunc) (*httpbalancer.Transport, *results) {
	t.Helper()
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
		Base:      base, OnResult: res.on, MaxPeek: maxPeek,
	})
	return tr, res
}

// A call its caller cancels while the endpoint has sent nothing back (a
// hung GPU, a dead connection) is reported Unanswered, whether the caller
// cancelled its context or closed Request.Cancel: the balancer may read
// the wait as a lower bound on the endpoint's latency.
func TestCancelBeforeHeadersIsUnanswered(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		sent := make(chan struct{})
		tr, res := unansweredTransport(t, 0, func(r *http.Request) (*http.Response, error) {
			close(sent)
			//lint:ignore SA1019 honoured as net/http honours it
			cancel := r.Cancel
			select {
			case <-r.Context().Done():
				return nil, r.Context().Err()
			case <-cancel:
				return nil, errNetHTTPCanceled
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		stop := cancel
		if legacy {
			ch := make(chan struct{})
			//lint:ignore SA1019 the deprecated field is the point
			req.Cancel = ch
			stop = func() { close(ch) }
		}
		go func() {
			<-sent
			stop()
		}()
		_, err = tr.RoundTrip(req)
		require.Error(t, err)
		r := <-res.c
		assert.True(t, r.Outcome.Canceled(), "legacy %v: %v", legacy, r.Outcome.Err)
		assert.True(t, r.Outcome.Unanswered, "legacy %v", legacy)
		cancel()
	}
}

// errNetHTTPCanceled is what net/http fails a call with when its
// Request.Cancel is closed.
var errNetHTTPCanceled = errors.New("net/http: request canceled")

// A cancel after the first byte of a JSON answer, or after a stream's
// first token (a user stopping an answer it was reading), is not
// Unanswered: the endpoint answered. (A stream cancelled before its first
// token: TestStreamCancelledBeforeItsFirstTokenIsUnanswered; a JSON answer
// before its first byte: TestAnswerGivenUpBeforeItsFirstByte.)
func TestCancelMidBodyIsAnswered(t *testing.T) {
	for _, ct := range []string{"application/json", "text/event-stream"} {
		tr, res := unansweredTransport(t, 0, func(r *http.Request) (*http.Response, error) {
			h := http.Header{"Content-Type": {ct}}
			body := &silentBody{ctx: r.Context(), first: `{"id":"chatcmpl-1",`}
			if ct == "text/event-stream" {
				body.first = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
			}
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: body, ContentLength: -1, Request: r}, nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, ct != "application/json")))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, err = resp.Body.Read(make([]byte, 256)) // the first token, the JSON's first bytes
		require.NoError(t, err)
		cancel()
		_, err = io.ReadAll(resp.Body)
		require.ErrorIs(t, err, context.Canceled)
		require.NoError(t, resp.Body.Close())
		r := <-res.c
		assert.True(t, r.Outcome.Canceled(), "%s: %v", ct, r.Outcome.Err)
		assert.False(t, r.Outcome.Unanswered, ct)
	}
}

// silentBody is a response body that sends first, then nothing until its
// context ends.
type silentBody struct {
	ctx   context.Context
	first string
}

func (b *silentBody) Read(p []byte) (int, error) {
	if b.first != "" {
		n := copy(p, b.first)
		b.first = b.first[n:]
		return n, nil
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (b *silentBody) Close() error { return nil }

// A call ended by its caller's own request body failing (a gateway whose
// client dropped its upload, and with it the gateway's context) is no
// wait on the endpoint, which never had the whole request: canceled, not
// Unanswered. Nor is a call whose Base panicked as its caller gave up.
func TestCallerBodyFailureIsNotUnanswered(t *testing.T) {
	t.Run("body", func(t *testing.T) {
		tr, res := unansweredTransport(t, 16, func(r *http.Request) (*http.Response, error) {
			_, err := io.Copy(io.Discard, r.Body)
			_ = r.Body.Close()
			if err == nil {
				return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
			}
			return nil, err
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		body := &cancelingBody{brokenBody: brokenBody{r: strings.NewReader(chatBody(1, false))}, cancel: cancel}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, body)
		require.NoError(t, err)
		_, err = tr.RoundTrip(req)
		require.Error(t, err)
		r := <-res.c
		assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
		assert.False(t, r.Outcome.Unanswered)
	})
	t.Run("panic", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		tr, res := unansweredTransport(t, 0, func(*http.Request) (*http.Response, error) {
			cancel()
			panic("middleware bug")
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		assert.Panics(t, func() { _, _ = tr.RoundTrip(req) })
		r := <-res.c
		assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
		assert.False(t, r.Outcome.Unanswered)
	})
}

// cancelingBody is a brokenBody that cancels its request's context as it
// fails.
type cancelingBody struct {
	brokenBody
	cancel context.CancelFunc
}

func (b *cancelingBody) Read(p []byte) (int, error) {
	n, err := b.brokenBody.Read(p)
	if err != nil {
		b.cancel()
	}
	return n, err
}

// An endpoint's refusal (a 404 saying it does not serve the model, a 400
// saying the call is longer than its window) is an answer. Should the
// caller's code panic while the call's retry elsewhere is set up (its
// GetBody), as the caller's context ends, the refused attempt is reported
// canceled, blaming no one, but not Unanswered: the endpoint had answered,
// and its wait is no lower bound on its latency.
func TestRefusalWhoseRetryPanicsIsNotUnanswered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		// panicAt is the GetBody call that is the retry's: a window
		// refusal reads the call's body once before (carriesRefusal).
		panicAt int
	}{
		{"not served", http.StatusNotFound, `{"error":{"message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`, 1},
		{"too long", http.StatusBadRequest, `{"object":"error","message":"This model's maximum context length is 1000 tokens. However, you requested 3199 tokens (2999 in the messages, 200 in the completion).","type":"BadRequestError","param":null,"code":400}`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type boom struct{}
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
				Base: baseFunc(func(r *http.Request) (*http.Response, error) {
					_ = r.Body.Close()
					h := http.Header{"Content-Type": {"application/json"}}
					return &http.Response{StatusCode: tc.status, Header: h, Body: io.NopCloser(strings.NewReader(tc.body)), ContentLength: int64(len(tc.body)), Request: r}, nil
				}),
				OnResult: res.on,
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := chatBody(1, false)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(body))
			require.NoError(t, err)
			calls := 0
			req.GetBody = func() (io.ReadCloser, error) {
				if calls++; calls < tc.panicAt {
					return io.NopCloser(strings.NewReader(body)), nil
				}
				cancel()
				panic(boom{})
			}
			func() {
				defer func() { assert.Equal(t, boom{}, recover()) }()
				_, _ = tr.RoundTrip(req)
				t.Error("RoundTrip returned")
			}()
			require.EqualValues(t, 1, res.n.Load())
			r := <-res.c
			assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
			assert.False(t, r.Outcome.Unanswered, "the endpoint answered")
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}

// hangingStream is a stream body that sends chunks, then blocks its next
// Read for wait (on clock) until the caller gives up (cancel): a replica
// whose engine hung after its API server sent the headers.
type hangingStream struct {
	clock  *testutil.Clock
	chunks []string
	wait   time.Duration
	cancel context.CancelFunc
	ctx    context.Context
}

func (s *hangingStream) Read(p []byte) (int, error) {
	if len(s.chunks) > 0 {
		n := copy(p, s.chunks[0])
		s.chunks = s.chunks[1:]
		return n, nil
	}
	s.clock.Advance(s.wait)
	s.cancel()
	return 0, s.ctx.Err()
}

func (s *hangingStream) Close() error { return nil }

// A stream whose headers came at once (vLLM sends them before its first
// token, also when its engine hangs) and whose reader gave up waiting in
// Read for its first token had nothing of its answer: Unanswered. One
// whose tokens had begun was answered (a user stopping a stream it was
// reading), and so was one whose reader came back to it only to give up
// (away for 20 s after the headers, its Read ended at once): the token
// may have been waiting.
func TestStreamCancelledBeforeItsFirstTokenIsUnanswered(t *testing.T) {
	const token = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	for _, tc := range []struct {
		name       string
		chunks     []string
		away, wait time.Duration
		unanswered bool
	}{
		{"reader waited, no token", nil, 0, 10 * time.Second, true},
		{"reader waited, role chunk only", []string{"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"}, 0, 10 * time.Second, true},
		{"tokens began", []string{token}, 0, 10 * time.Second, false},
		{"reader away, gave up at once", nil, 20 * time.Second, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := streamGivenUp(t, 0, tc.chunks, tc.away, tc.wait)
			assert.Equal(t, tc.unanswered, o.Unanswered)
		})
	}
}

// streamGivenUp is the outcome of a chat stream whose headers come after
// headers (on a fake clock), then chunks, after which it hangs; its reader
// comes to it away after the headers and gives up (cancels the call's
// context) after waiting wait in a Read. The outcome must be a cancel.
func streamGivenUp(t *testing.T, headers time.Duration, chunks []string, away, wait time.Duration) inferlb.Outcome {
	t.Helper()
	clock := testutil.NewClock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			clock.Advance(headers)
			h := http.Header{"Content-Type": {"text/event-stream"}}
			body := &hangingStream{clock: clock, chunks: chunks, wait: wait, cancel: cancel, ctx: ctx}
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: body, ContentLength: -1, Request: r}, nil
		}),
		BalancerOptions: balancer.Options{Clock: clock},
		OnResult:        res.on,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	clock.Advance(away)
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
	return r.Outcome
}
