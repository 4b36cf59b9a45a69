package httpbalancer_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// TestFast401sDrawNoTraffic: of three embedding servers on loopback, one
// has the wrong API key and answers every call 401 at once. Its answers
// were successes, the fastest there were (and left nothing in flight):
// it drew 298 of 300 calls, every one of them refused. Its 401s are
// client errors now, and it draws a handful of calls, all before and
// while its share of client errors rises past its peers'.
func TestFast401sDrawNoTraffic(t *testing.T) {
	clock := testutil.NewClock()
	tr := badKeyFleet(t, clock, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"e5"}`,
		balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	c := &http.Client{Transport: tr}
	const n = 300
	drew := map[string]int{}
	for range n {
		req, err := http.NewRequest(http.MethodPost, "http://embed.internal/v1/embeddings", strings.NewReader(`{"model":"e5","input":"a sentence"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		drew[resp.Header.Get("X-Backend")]++
	}
	t.Logf("calls drawn of %d: %v", n, drew)
	assert.Less(t, drew["bad-key"], n/20, "calls the replica with the wrong key drew")
	st := statsByID(tr.Balancer())
	assert.Equal(t, uint64(drew["bad-key"]), st["bad-key"].ClientErrors)
	assert.Zero(t, st["bad-key"].Successes)
	assert.Zero(t, st["bad-key"].Failures, "401s trip no breaker")
	assert.Greater(t, st["bad-key"].ClientErrorShare, 0.5)
	assert.Zero(t, st["a"].ClientErrorShare)
}

// TestFast401sKeepNoChats: the same over chats, whose prompt prefix keys
// steer them to their keys' owners. Of three chat servers, one has the
// wrong API key; 30 conversations, each repeating its system prompt and
// first message, make 300 calls. The affinity walk took each key's owner
// whatever its share of client errors, and the conversations the refusing
// replica owns failed on every call (60 of 300); it is passed over now (9),
// as an owner whose breaker is open is, and their calls go to the next
// endpoints in their keys' order.
func TestFast401sKeepNoChats(t *testing.T) {
	clock := testutil.NewClock()
	tr := badKeyFleet(t, clock, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41}}`,
		balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: 5})
	c := &http.Client{Transport: tr}
	const convs, n = 30, 300
	drew := map[string]int{}
	for i := range n {
		conv := i % convs
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":"You are the assistant of app %d. Answer briefly."},{"role":"user","content":"Conversation %d: what is on my calendar today?"}],"max_tokens":16}`, conv%3, conv)
		resp, _ := post(t, c, body)
		drew[resp.Header.Get("X-Backend")]++
	}
	t.Logf("chat calls drawn of %d: %v", n, drew)
	assert.Less(t, drew["bad-key"], n/20, "calls the replica with the wrong key drew")
	st := statsByID(tr.Balancer())
	assert.Equal(t, uint64(drew["bad-key"]), st["bad-key"].ClientErrors)
	assert.Zero(t, st["bad-key"].Failures, "401s trip no breaker")
}

// TestStreamErrorEvent4xxIsAClientError: an error event with a 4xx code
// in a stream that began with 200 (vLLM's 400 for a bad tool call) says
// the call was bad: a client error, as the same status on the status line
// is; one with a 5xx code stays a failure, and one with none an answer.
func TestStreamErrorEvent4xxIsAClientError(t *testing.T) {
	for _, tc := range []struct {
		code      string
		clientErr bool
	}{{"400", true}, {"422", true}, {"404", true}, {"408", false}, {"500", false}, {"null", false}} {
		rig := newSSERig(t, "data: {\"a\":1}\n\ndata: {\"error\": {\"message\": \"x\", \"code\": "+tc.code+"}}\n\ndata: [DONE]\n\n")
		r := rig.call(t, 16)
		assert.Equal(t, tc.clientErr, r.Outcome.ClientError, "code %s", tc.code)
		assert.Equal(t, tc.code == "500", r.Outcome.Err != nil, "code %s", tc.code)
	}
}

// badKeyFleet is a Transport over three loopback servers: a and b answer
// every call with answer after 20 ms on clock, bad-key answers it 401 at
// once (a replica started with the wrong API key). Each answer names its
// server in X-Backend.
func badKeyFleet(t *testing.T, clock *testutil.Clock, answer string, opts balancer.Options) *httpbalancer.Transport {
	t.Helper()
	good := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			clock.Advance(20 * time.Millisecond) // the work takes 20 ms
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Backend", name)
			_, _ = io.WriteString(w, answer)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := good("a"), good("b")
	badKey := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Backend", "bad-key")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)
	}))
	t.Cleanup(badKey.Close)
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	return newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{
			{ID: "a", Addr: addr(a)}, {ID: "b", Addr: addr(b)}, {ID: "bad-key", Addr: addr(badKey)},
		},
		BalancerOptions: opts,
	})
}
