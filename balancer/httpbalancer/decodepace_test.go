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

// scriptedStream is an SSE body whose Read hands out one chunk per call,
// first moving the fake clock by the chunk's wait: the time a reader that
// is waiting on the endpoint spends blocked in Read. A wait of 0 is data
// that was already buffered when the reader came back for it.
type scriptedStream struct {
	clock  *testutil.Clock
	chunks []string
	waits  []time.Duration
}

func (s *scriptedStream) Read(p []byte) (int, error) {
	if len(s.chunks) == 0 {
		return 0, io.EOF
	}
	s.clock.Advance(s.waits[0])
	n := copy(p, s.chunks[0])
	if n < len(s.chunks[0]) {
		s.chunks[0] = s.chunks[0][n:]
		s.waits[0] = 0
		return n, nil
	}
	s.chunks, s.waits = s.chunks[1:], s.waits[1:]
	return n, nil
}

func (s *scriptedStream) Close() error { return nil }

// streamOf returns a transport over one endpoint whose base answers every
// call with a stream of tokens events, the first after ttft and each next
// one wait after the one before (as a reader blocked in Read sees them),
// then [DONE].
func streamOf(t *testing.T, clock *testutil.Clock, tokens int, ttft, wait time.Duration) *httpbalancer.Transport {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		s := &scriptedStream{clock: clock}
		for i := range tokens {
			s.chunks = append(s.chunks, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			if i == 0 {
				s.waits = append(s.waits, ttft)
			} else {
				s.waits = append(s.waits, wait)
			}
		}
		s.chunks = append(s.chunks, "data: [DONE]\n\n")
		s.waits = append(s.waits, wait)
		h := http.Header{"Content-Type": {"text/event-stream"}}
		return &http.Response{StatusCode: http.StatusOK, Header: h, Body: s, ContentLength: -1, Request: r}, nil
	})
	return newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:8000"}},
		Base:            base,
		BalancerOptions: balancer.Options{Clock: clock},
	})
}

// TestSlowReaderDecodeSpeed: an endpoint's decode speed (time per output
// token) is its own, not its callers' reading pace. A caller that spends
// 50ms on each token it reads (an agent acting on each chunk, a relay to a
// slow client) while the endpoint sent one every 10ms finds each next
// token already buffered: the stream is paced by the reader, and its
// timing says nothing of the endpoint. Counted, it made a 10ms endpoint
// look 50ms per token, and P2C priced it 4.5x against its peers. A caller
// that reads every token as it comes and then holds the body open (post-
// processing before Close) must not slow the endpoint either.
func TestSlowReaderDecodeSpeed(t *testing.T) {
	const tokens = 20
	// read reads up to reads chunks (all, when 0), spending perToken on
	// each, then waits beforeClose and closes the body.
	read := func(t *testing.T, tr *httpbalancer.Transport, clock *testutil.Clock, reads int, perToken, beforeClose time.Duration) {
		req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		buf := make([]byte, 4096)
		for i := 0; reads == 0 || i < reads; i++ {
			_, err := resp.Body.Read(buf)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			clock.Advance(perToken) // the caller's own work on what it read
		}
		clock.Advance(beforeClose)
		require.NoError(t, resp.Body.Close())
	}
	t.Run("fast reader", func(t *testing.T) {
		clock := testutil.NewClock()
		tr := streamOf(t, clock, tokens, 200*time.Millisecond, 10*time.Millisecond)
		read(t, tr, clock, 0, 0, 0)
		assert.Equal(t, 10*time.Millisecond, statsByID(tr.Balancer())["e"].TimePerOutputToken)
	})
	t.Run("fast reader, late close", func(t *testing.T) {
		clock := testutil.NewClock()
		tr := streamOf(t, clock, tokens, 200*time.Millisecond, 10*time.Millisecond)
		// It stops at the last token (as a client that stops at
		// finish_reason does) and closes five seconds later.
		read(t, tr, clock, tokens, 0, 5*time.Second)
		assert.Equal(t, 10*time.Millisecond, statsByID(tr.Balancer())["e"].TimePerOutputToken)
	})
	t.Run("reader slower than the endpoint", func(t *testing.T) {
		clock := testutil.NewClock()
		// Every token after the first is waiting when the reader comes back.
		tr := streamOf(t, clock, tokens, 200*time.Millisecond, 0)
		read(t, tr, clock, 0, 50*time.Millisecond, 0)
		st := statsByID(tr.Balancer())["e"]
		assert.Zero(t, st.TimePerOutputToken, "a reader-paced stream measures the reader")
		assert.Equal(t, 200*time.Millisecond, st.TTFT)
	})
	t.Run("reader a little faster than the endpoint", func(t *testing.T) {
		clock := testutil.NewClock()
		// 8ms of work per token, tokens 10ms apart: the reader waits 2ms
		// for each, and the endpoint's pace shows.
		tr := streamOf(t, clock, tokens, 200*time.Millisecond, 2*time.Millisecond)
		read(t, tr, clock, 0, 8*time.Millisecond, 0)
		assert.Equal(t, 10*time.Millisecond, statsByID(tr.Balancer())["e"].TimePerOutputToken)
	})
}
