package httpbalancer_test

import (
	"errors"
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

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// How many requests one caller's calls can make the backends take: the
// hops past 404s and context-window refusals, the failover and the resend
// after an idle close, alone and together.

// loraFleet starts n fake vLLM replicas that serve only the base model,
// and a Transport over them on a fake clock.
func loraFleet(t *testing.T, n int) ([]*loraBackend, *httpbalancer.Transport, *testutil.Clock) {
	t.Helper()
	bs := make([]*loraBackend, n)
	plain := make([]*backend, n)
	for i := range bs {
		bs[i] = newLoRABackend(t, fmt.Sprintf("r%d", i))
		plain[i] = bs[i].backend
	}
	clock := testutil.NewClock()
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(plain...),
		BalancerOptions: balancer.Options{Clock: clock, Rand: testutil.NewRand(1)},
	})
	return bs, tr, clock
}

func notFounds(bs []*loraBackend) (n int64) {
	for _, b := range bs {
		n += b.notFound.Load()
	}
	return n
}

// TestTypoModelAmplification: a caller sends a model no replica of 16
// serves. Its first call meets every replica once (15 hops, on the retry
// budget) and gets the last 404 byte for byte; the next 100, 20 ms apart,
// meet one replica each and spend no budget: 116 requests for 101 calls.
func TestTypoModelAmplification(t *testing.T) {
	bs, tr, clock := loraFleet(t, 16)
	client := &http.Client{Transport: tr}
	resp, out := post(t, client, loraBody("lama", 0))
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, vllmNotFound("lama"), string(out))
	for _, b := range bs {
		assert.Equal(t, int64(1), b.notFound.Load(), "%s", b.name)
	}
	assert.Equal(t, uint64(15), tr.Balancer().RetryStats().Allowed)
	for i := 1; i <= 100; i++ {
		clock.Advance(20 * time.Millisecond)
		resp, out = post(t, client, loraBody("lama", i))
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		require.Equal(t, vllmNotFound("lama"), string(out))
	}
	assert.Equal(t, int64(16+100), notFounds(bs))
	assert.Equal(t, uint64(15), tr.Balancer().RetryStats().Allowed, "later calls spend no budget")
}

// TestMadeUpModelsFlood: 1,000 calls, each for a model of its own that
// none of 16 replicas serves, one a millisecond. Each hop is drawn from
// the retry budget, so the replicas take the 1,000 calls plus the retries
// it allows, not up to 16 requests a call: 1,249 measured. Hops draw the
// budget only down to a reserve kept for failover (half the floor's bank
// of 100, half the 20 the traffic banks): the flood used to spend all of
// it (1,309 requests), and a replica dying right after failed its calls
// with no failover for some 10 s; 40 failovers are left now.
func TestMadeUpModelsFlood(t *testing.T) {
	bs, tr, clock := loraFleet(t, 16)
	client := &http.Client{Transport: tr}
	for i := range 1000 {
		clock.Advance(time.Millisecond)
		resp, _ := post(t, client, loraBody(fmt.Sprintf("made-up-%d", i), i))
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	}
	retries := tr.Balancer().RetryStats().Allowed
	t.Logf("%d requests for 1000 calls", 1000+retries)
	assert.Equal(t, int64(1000+retries), notFounds(bs), "one request per call and one per retry allowed")
	assert.LessOrEqual(t, retries, uint64(50+200+11), "half the bank, 20%% of 1,000 calls, and 10 a second")
	assert.Equal(t, retries, tr.Stats().Failovers)
	left := 0
	for range 40 {
		if tr.Balancer().AllowRetry() {
			left++
		}
	}
	assert.Equal(t, 40, left, "failovers the budget allows right after the flood")
}

// TestWorstCallAmplification: one call meets every path that sends it
// again. Over 16 endpoints (half answer 404 for its model, half refuse it
// as longer than their window) its first attempt meets a connection the
// server closed while idle (resent, no budget), the resend a reset after
// the server read it (failover, on the budget), and then the hops past
// 404s and refusals, which share one limit (15 here: the endpoints less
// one): 18 attempts, 17 of which reach a server, 16 retries drawn from
// the budget. The caller gets the last 404 or refusal byte for byte.
func TestWorstCallAmplification(t *testing.T) {
	var received atomic.Int64
	const refusal = `{"object":"error","message":"This model's maximum context length is 1000 tokens. However, you requested 3199 tokens (2999 in the messages, 200 in the completion).","type":"BadRequestError","param":null,"code":400}`
	var eps []inferlb.Endpoint
	for i := range 16 {
		notFound := i%2 == 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			received.Add(1)
			w.Header().Set("Content-Type", "application/json")
			if notFound {
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, vllmNotFound("m"))
				return
			}
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, refusal)
		}))
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("e%d", i), Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	var sent atomic.Int64
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: eps,
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			switch sent.Add(1) {
			case 1:
				_ = r.Body.Close()
				return nil, errors.New("http: server closed idle connection")
			case 2:
				resp, err := base.RoundTrip(r)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				return nil, errors.New("read tcp: connection reset by peer")
			}
			return base.RoundTrip(r)
		}),
		BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)},
	})
	resp, out := post(t, &http.Client{Transport: tr}, chatOf(0, 3000, 200))
	if resp.StatusCode == http.StatusNotFound {
		assert.Equal(t, vllmNotFound("m"), string(out))
	} else {
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, refusal, string(out))
	}
	assert.Equal(t, int64(18), sent.Load(), "attempts")
	assert.Equal(t, int64(17), received.Load(), "requests the servers read")
	assert.Equal(t, httpbalancer.TransportStats{Resends: 1, Failovers: 16}, tr.Stats())
	assert.Equal(t, uint64(16), tr.Balancer().RetryStats().Allowed)
}
