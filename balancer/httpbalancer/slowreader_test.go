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

// slowReader returns at most n bytes a Read and moves the clock by d
// before each: a caller reading the body at its own slow pace (a client it
// forwards the answer to, reading slowly).
type slowReader struct {
	r     io.Reader
	n     int
	d     time.Duration
	clock *testutil.Clock
}

func (s *slowReader) Read(p []byte) (int, error) {
	s.clock.Advance(s.d)
	return s.r.Read(p[:min(len(p), s.n)])
}

// TestSlowReaderLatency: the latency an embedding or rerank endpoint is
// scored on (peak-EWMA, which jumps to a slow answer at once) is the time
// to the response headers, which the server sends once it has computed
// the answer. The pace at which the caller reads the body is the caller's:
// measured to the body's end, one slowly read answer made the endpoint
// look 20s slow (and so shunned for a minute or more) though it answered
// in 20ms. The whole call is still in flight until the body ends, and
// Result reports the whole call.
func TestSlowReaderLatency(t *testing.T) {
	for _, path := range []string{"/v1/embeddings", "/v1/rerank"} {
		t.Run(path, func(t *testing.T) {
			clock := testutil.NewClock()
			answer := `{"data":[{"embedding":[` + strings.Repeat("0.125,", 1000) + `0]}]}`
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				_, _ = io.Copy(io.Discard, r.Body)
				_ = r.Body.Close()
				clock.Advance(20 * time.Millisecond) // the server computes the answer
				return &http.Response{
					StatusCode: http.StatusOK,
					Header:     http.Header{"Content-Type": {"application/json"}},
					Body:       io.NopCloser(strings.NewReader(answer)),
					Request:    r,
				}, nil
			})
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{
				Base:            base,
				Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}},
				BalancerOptions: balancer.Options{Clock: clock},
				OnResult:        res.on,
			})
			req, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(`{"model":"e5","input":["a"]}`))
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			// 6 KB read 64 bytes a second: about 100 s.
			_, err = io.ReadAll(&slowReader{r: resp.Body, n: 64, d: time.Second, clock: clock})
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			r := <-res.c
			assert.Greater(t, r.Outcome.Latency, 90*time.Second, "Result: the whole call")
			st := statsByID(tr.Balancer())["e"]
			assert.Equal(t, 20*time.Millisecond, st.Latency, "the endpoint's latency")
			assert.Zero(t, st.InFlight)
		})
	}
}
