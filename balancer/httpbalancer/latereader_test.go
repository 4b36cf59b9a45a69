package httpbalancer_test

import (
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

// TestLateReaderFirstToken: the time of a stream's first token is the
// endpoint's only when the caller was in Read, or came for it soon after
// the headers. One that gets the response and comes back to read it a
// second later (setting up, logging, a handoff to another goroutine) finds
// the first tokens buffered: its first Read returns one at once, and the
// endpoint's 50ms to the first token read as 1s, and, as the caller then
// caught up on the buffered tokens, its 20ms per token as 10ms, so it
// looked twice as fast at decoding as it is. A Read that waits for the
// first token measures it however late it began.
func TestLateReaderFirstToken(t *testing.T) {
	const (
		tokens = 100
		ttft   = 50 * time.Millisecond // after the headers
		gap    = 20 * time.Millisecond // between tokens
	)
	// run has the caller read the body late after the headers, then
	// promptly to its end; the endpoint sends a token at ttft, and every gap
	// after it, from the headers on. It returns the attempt's Result and
	// the endpoint's stats.
	run := func(t *testing.T, late, ttft time.Duration) (httpbalancer.Result, balancer.EndpointStats) {
		clock := testutil.NewClock()
		var results []httpbalancer.Result
		base := baseFunc(func(r *http.Request) (*http.Response, error) {
			// Each token's wait is how long a Read that asks for it
			// blocks: 0 for one that arrived before the caller came.
			s := &scriptedStream{clock: clock}
			reader := late // the reader's time since the headers
			for i := range tokens {
				at := ttft + time.Duration(i)*gap
				s.chunks = append(s.chunks, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
				s.waits = append(s.waits, max(at-reader, 0))
				reader = max(reader, at)
			}
			s.chunks = append(s.chunks, "data: [DONE]\n\n")
			s.waits = append(s.waits, 0)
			h := http.Header{"Content-Type": {"text/event-stream"}}
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: s, ContentLength: -1, Request: r}, nil
		})
		tr := newTransport(t, httpbalancer.Options{
			Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:8000"}},
			Base:            base,
			BalancerOptions: balancer.Options{Clock: clock},
			OnResult:        func(r httpbalancer.Result) { results = append(results, r) },
		})
		req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		clock.Advance(late)
		buf := make([]byte, 4096)
		for {
			_, err := resp.Body.Read(buf)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		require.NoError(t, resp.Body.Close())
		require.Len(t, results, 1)
		return results[0], statsByID(tr.Balancer())["e"]
	}
	t.Run("prompt reader", func(t *testing.T) {
		r, st := run(t, 0, ttft)
		assert.Equal(t, ttft, r.Outcome.TTFT)
		assert.Equal(t, ttft, st.TTFT)
		assert.Equal(t, gap, st.TimePerOutputToken)
		assert.Equal(t, gap, r.TimeBetweenTokens)
		assert.Equal(t, tokens, r.Events)
	})
	t.Run("reader a second late", func(t *testing.T) {
		r, st := run(t, time.Second, ttft)
		t.Logf("TTFT %v (Result %v), time per output token %v, between tokens %v", st.TTFT, r.Outcome.TTFT, st.TimePerOutputToken, r.TimeBetweenTokens)
		assert.Zero(t, r.Outcome.TTFT, "the first token's time is unknown")
		assert.Zero(t, st.TTFT, "no time to first token is learned")
		assert.Zero(t, st.TimePerOutputToken, "no decode speed is learned")
		assert.Equal(t, tokens, r.Events, "the events still count")
		assert.Equal(t, tokens, r.Outcome.OutputTokens)
		assert.NoError(t, r.Outcome.Err)
		assert.EqualValues(t, 1, st.Successes)
	})
	t.Run("reader a little late", func(t *testing.T) {
		// 5ms after the headers, within 1/8 of the 50ms to the first token.
		r, st := run(t, 5*time.Millisecond, ttft)
		assert.Equal(t, ttft, r.Outcome.TTFT)
		assert.Equal(t, ttft, st.TTFT)
		assert.Equal(t, gap, st.TimePerOutputToken)
	})
	t.Run("reader late, but before the first token", func(t *testing.T) {
		// A second late for a first token 3s after the headers: the Read
		// waits 2s for it, and it is measured exactly.
		r, st := run(t, time.Second, 3*time.Second)
		assert.Equal(t, 3*time.Second, r.Outcome.TTFT)
		assert.Equal(t, 3*time.Second, st.TTFT)
		assert.Equal(t, gap, st.TimePerOutputToken)
	})
}
