package httpbalancer_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// vllmInternalError is vLLM's body for a call whose generation failed.
const vllmInternalError = `{"error":{"message":"EngineCore encountered an issue.","type":"InternalServerError","param":null,"code":500}}`

// newMultiModelBackend is a fake server that serves every model and, once
// broken is set, fails the calls for the models in failing: with a 500,
// or, for a streamed call, with an error event on a 200 stream (vLLM's way
// when generation fails after the stream began).
func newMultiModelBackend(t *testing.T, name string, broken *atomic.Bool, failing ...string) *backend {
	t.Helper()
	b := &backend{name: name}
	fails := map[string]bool{}
	for _, m := range failing {
		fails[m] = true
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req struct {
			Model  string
			Stream bool
		}
		_ = json.Unmarshal(body, &req)
		if fails[req.Model] && broken.Load() {
			w.Header().Set("X-Backend", name)
			if req.Stream {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", vllmInternalError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, vllmInternalError)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.fakeChat(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// TestFailingModelKeepsTheEndpointForOthers: three servers serve models x
// and y; after every server has served y, x fails on the first (a model
// whose backend crashed there), with a 500 or an error event in its
// stream. (A model failing from a server's start, before it served any
// other, counts against the server: nothing yet shows the server well.) Its failures are held against x
// on that server, not against the server: y's calls keep going there
// (its share is 50 of 150), and after five failures x's calls pass it
// over. With the breaker off, which turns that off, x's failures count
// against the server, whose error rate alone keeps few of x's calls away
// when no server is loaded.
func TestFailingModelKeepsTheEndpointForOthers(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			run := func(breakerFailures int) (yOnA, xFailed int, st map[string]balancer.EndpointStats) {
				var broken atomic.Bool
				a := newMultiModelBackend(t, "a", &broken, "x")
				b := newMultiModelBackend(t, "b", &broken)
				c := newMultiModelBackend(t, "c", &broken)
				clock := testutil.NewClock()
				tr := newTransport(t, httpbalancer.Options{
					Endpoints:       endpointsOf(a, b, c),
					BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(5), BreakerFailures: breakerFailures},
				})
				client := &http.Client{Transport: tr}
				call := func(model string, i int) (*http.Response, []byte) {
					body := fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"question %d"}],"max_tokens":16}`, model, stream, i)
					resp, out := post(t, client, body)
					clock.Advance(10 * time.Millisecond)
					return resp, out
				}
				// The fleet serves both models for a while before x
				// breaks: every server has served y.
				for i := 0; a.hits.Load() == 0 || b.hits.Load() == 0 || c.hits.Load() == 0; i++ {
					require.Less(t, i, 200, "y's calls reach every server")
					call("y", 1000+i)
				}
				broken.Store(true)
				for i := range 300 {
					model := "y"
					if i%2 == 1 {
						model = "x"
					}
					resp, out := call(model, i)
					failed := resp.StatusCode == http.StatusInternalServerError || strings.Contains(string(out), `"code":500`)
					if model == "x" && failed {
						xFailed++
					}
					if model == "y" && resp.Header.Get("X-Backend") == "a" {
						yOnA++
					}
					require.False(t, model == "y" && failed, "y never fails")
				}
				assert.Zero(t, totalInFlight(tr.Balancer()))
				return yOnA, xFailed, statsByID(tr.Balancer())
			}
			yOnA, xFailed, st := run(0)
			oldYOnA, oldXFailed, oldSt := run(-1)
			t.Logf("y calls on the server failing x: %d of 150 (breaker off, failures the server's: %d); x calls failed: %d (%d)", yOnA, oldYOnA, xFailed, oldXFailed)
			assert.GreaterOrEqual(t, yOnA, 15, "y keeps the server failing x (its share is 50; 29-69 in 100 runs, as affinity keys land by a per-process seed; 0-1 when the server trips)")
			assert.Greater(t, oldXFailed, 4*xFailed, "nothing else keeps x's calls off the server: its error rate alone does not")
			assert.LessOrEqual(t, xFailed, 6, "x's calls stop going where x fails")
			assert.Positive(t, st["a"].ModelFailures)
			assert.Zero(t, st["a"].Trips)
			assert.Zero(t, st["a"].Ejections)
			assert.Positive(t, st["a"].Failures, "the first two of a run count against the server")
			assert.Zero(t, oldSt["a"].ModelFailures)
		})
	}
}
