package httpbalancer_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// An answer that is no stream, whose headers came with no length and then
// nothing (a gateway or server that flushes the headers at once, before
// the answer exists), given up on before its first byte had nothing of
// the answer, as a stream given up on before its first token: a cancel is
// Unanswered, a deadline the endpoint's failure. Once a byte came, or when
// the headers announced the body's length (the answer existed), the
// answer had begun: a cancel is no Unanswered, a deadline
// ErrDeadlineMidStream. A caller that closes the body without a Read after
// giving up tells nothing of the body, and stays answered. Before, every
// one of them read as begun, and a replica that hung after its headers fed
// no signal at all.
func TestAnswerGivenUpBeforeItsFirstByte(t *testing.T) {
	for _, tc := range []struct {
		name       string
		first      string // the body's bytes before it hangs
		length     int64  // the headers' Content-Length (-1: none)
		deadline   bool   // the caller's deadline, not its cancel, ends the call
		closeOnly  bool   // the caller closes the body without a Read
		unanswered bool
		failure    bool // the endpoint's failure (the deadline, before the answer)
		responses  bool // a Responses API call, whose answer's ID the Transport reads
	}{
		{name: "cancel, no byte", length: -1, unanswered: true},
		{name: "cancel, a byte", first: `{"id":`, length: -1},
		{name: "cancel, no byte, length announced", length: 100},
		{name: "cancel, no byte, closed without a Read", length: -1, closeOnly: true},
		{name: "deadline, no byte", length: -1, deadline: true, failure: true},
		{name: "deadline, a byte", first: `{"id":`, length: -1, deadline: true},
		{name: "deadline, no byte, length announced", length: 100, deadline: true},
		// Its body is followed for the ID, and the deadline after its
		// first byte counted as the endpoint's failure.
		{name: "Responses API, cancel, no byte", length: -1, responses: true, unanswered: true},
		{name: "Responses API, deadline, no byte", length: -1, responses: true, deadline: true, failure: true},
		{name: "Responses API, deadline, a byte", first: `{"id":`, length: -1, responses: true, deadline: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, res := unansweredTransport(t, 0, func(r *http.Request) (*http.Response, error) {
				h := http.Header{"Content-Type": {"application/json"}}
				body := &silentBody{ctx: r.Context(), first: tc.first}
				return &http.Response{StatusCode: http.StatusOK, Header: h, Body: body, ContentLength: tc.length, Request: r}, nil
			})
			var ctx context.Context
			var end func()
			if tc.deadline {
				e := newExpiring()
				ctx, end = e, e.expire
			} else {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				end = cancel
			}
			url, body := chatURL, chatBody(1, false)
			if tc.responses {
				url, body = responsesURL, `{"model":"m","input":"conversation 1 opens"}`
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			if tc.first != "" {
				_, err = resp.Body.Read(make([]byte, 64))
				require.NoError(t, err)
			}
			end()
			if !tc.closeOnly {
				_, err = io.ReadAll(resp.Body)
				require.Error(t, err)
			}
			require.NoError(t, resp.Body.Close())
			r := <-res.c
			o := r.Outcome
			assert.Equal(t, tc.unanswered, o.Unanswered, "Unanswered")
			st := statsByID(tr.Balancer())[r.Endpoint]
			switch {
			case tc.failure:
				assert.ErrorIs(t, o.Err, context.DeadlineExceeded)
				assert.NotErrorIs(t, o.Err, httpbalancer.ErrDeadlineMidStream)
				assert.False(t, o.Canceled())
				assert.EqualValues(t, 1, st.Failures)
			case tc.deadline:
				assert.ErrorIs(t, o.Err, httpbalancer.ErrDeadlineMidStream)
				assert.True(t, o.Canceled())
				assert.Zero(t, st.Failures)
			default:
				assert.ErrorIs(t, o.Err, context.Canceled)
				assert.True(t, o.Canceled())
			}
		})
	}
}

// hungAfterHeaders is three loopback servers answering JSON calls, the
// second of which, once hang is set, sends its headers (200, no length) at
// once and then nothing until the call ends: an engine hung behind an API
// server or a gateway that flushes the headers first. It marks those
// headers with X-Hung.
func hungAfterHeaders(t *testing.T, answer string, hang *atomic.Bool, clock *testutil.Clock) []inferlb.Endpoint {
	t.Helper()
	var eps []inferlb.Endpoint
	for i := range 3 {
		hangs := i == 1
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			if hangs && hang.Load() {
				w.Header().Set("X-Hung", "1")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
				return
			}
			clock.Advance(5 * time.Millisecond) // the answer's time, to its headers
			_, _ = io.WriteString(w, answer)
		}))
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("r%d", i), Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	return eps
}

// A replica that hangs after sending its headers stops drawing the calls
// whose callers give up on it: of 60 calls in a row over 3 replicas (after
// 15 that all answered), each given up on (a deadline, or a cancel) when it
// lands on the hung one, the hung replica drew 18 chat calls and 58
// embedding calls before (each given-up call read as answered and fed
// nothing; an embedding's latency, measured to its headers, sent at once,
// made it the fastest), and 5 and 1 now. A deadline is the hung replica's
// failure (its breaker opens after 5 in a row), a cancel of an embedding
// call Unanswered (the wait, 1 s on the test's clock against 5 ms answers,
// prices it).
func TestHungAfterHeadersReplicaStopsDrawingCalls(t *testing.T) {
	const warm, calls = 15, 60
	for _, tc := range []struct {
		name, url, body, answer string
		deadline                bool
		most                    int
	}{
		{"chat, deadline", chatURL, "", `{"choices":[{"message":{"content":"hi"}}]}`, true, 6},
		{"embedding, cancel", "http://emb/v1/embeddings", `{"model":"e5","input":["a"]}`, `{"data":[{"embedding":[0.1]}]}`, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			var hang atomic.Bool
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       hungAfterHeaders(t, tc.answer, &hang, clock),
				BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
			})
			hung := 0
			for i := range warm + calls {
				hang.Store(i >= warm)
				var ctx context.Context
				var end func()
				if tc.deadline {
					e := newExpiring()
					ctx, end = e, sync.OnceFunc(e.expire)
				} else {
					c, cancel := context.WithCancel(context.Background())
					ctx, end = c, cancel
				}
				body := tc.body
				if tc.deadline {
					body = chatBody(i, false) // a prompt of its own: no affinity to one replica
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, tc.url, strings.NewReader(body))
				require.NoError(t, err)
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				if resp.Header.Get("X-Hung") != "" {
					hung++
					clock.Advance(time.Second) // the caller's time budget
					end()
					_, err = io.Copy(io.Discard, resp.Body)
					require.Error(t, err)
				} else {
					_, err = io.Copy(io.Discard, resp.Body)
					require.NoError(t, err)
				}
				require.NoError(t, resp.Body.Close())
				end()
			}
			t.Logf("%d of %d calls landed on the hung replica", hung, calls)
			assert.LessOrEqual(t, hung, tc.most, "calls landed on the hung replica")
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}
