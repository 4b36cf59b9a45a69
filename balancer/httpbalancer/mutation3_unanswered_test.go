package httpbalancer_test

import (
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

// legacyHangingStream is a stream whose headers came and whose first
// Read waits wait for a token that never comes, until its caller gives up
// through Request.Cancel (closing cancel): net/http's body then fails with
// its own error, which says nothing of the cancel.
type legacyHangingStream struct {
	clock  *testutil.Clock
	wait   time.Duration
	cancel chan struct{}
}

func (s *legacyHangingStream) Read([]byte) (int, error) {
	s.clock.Advance(s.wait)
	close(s.cancel)
	return 0, errors.New("net/http: request canceled")
}

func (s *legacyHangingStream) Close() error { return nil }

// A stream whose caller gave up through Request.Cancel (deprecated, and
// set by http.Client for a RoundTripper it does not know) while waiting
// in Read for its first token had nothing of its answer, as one whose
// context was cancelled: Unanswered. Kills finish reading only
// context.Canceled there: a hung replica's streams given up on so fed no
// signal.
func TestStreamGivenUpThroughRequestCancelBeforeItsFirstTokenIsUnanswered(t *testing.T) {
	clock := testutil.NewClock()
	cancel := make(chan struct{})
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"Content-Type": {"text/event-stream"}}
			body := &legacyHangingStream{clock: clock, wait: 10 * time.Second, cancel: cancel}
			return &http.Response{StatusCode: http.StatusOK, Header: h, Body: body, ContentLength: -1, Request: r}, nil
		}),
		BalancerOptions: balancer.Options{Clock: clock},
		OnResult:        res.on,
	})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	//lint:ignore SA1019 the deprecated field is the point
	req.Cancel = cancel
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err)
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
	assert.True(t, r.Outcome.Unanswered)
	assert.EqualValues(t, 1, statsByID(tr.Balancer())["10.0.0.1:8000"].Unanswered)
}

// A stream whose headers were slow (a proxy's queue) and whose reader
// then waited for its first token until it gave up had nothing of its
// answer: the reader's time away counts from the headers, not from the
// pick, and is weighed against the call's whole age. Kills awaitedFirst
// measuring the reader's absence from the attempt's start (the 20 s to
// the headers read as the reader's), and weighing it against the last
// Read's wait alone (a second away, of a call 20 s old, read as late).
func TestStreamAfterSlowHeadersGivenUpBeforeItsFirstTokenIsUnanswered(t *testing.T) {
	for _, tc := range []struct {
		name                string
		headers, away, wait time.Duration
	}{
		{"read at once, gave up after 2 s", 20 * time.Second, 0, 2 * time.Second},
		{"read a second late, gave up after 100 ms", 19 * time.Second, time.Second, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.True(t, streamGivenUp(t, tc.headers, nil, tc.away, tc.wait).Unanswered)
		})
	}
}
