package httpbalancer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A Transport on a shared Balancer keeps its own address per endpoint ID
// (own), and the addresses of the endpoints that just left, for calls
// picked before the update. Pods replaced thousands of times must leave
// it holding the current set and the last one only; and closing the
// Transport takes its endpoints out of the Balancer.
func TestOwnAddressesHoldTheCurrentAndLastSetOnly(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	tr, err := NewTransport(Options{Balancer: b, Base: http.DefaultTransport,
		Endpoints: []inferlb.Endpoint{{ID: "stays", Addr: "10.255.0.1:8000"}}})
	require.NoError(t, err)
	const rounds, size = 10_000, 3
	for r := range rounds {
		eps := []inferlb.Endpoint{{ID: "stays", Addr: "10.255.0.1:8000"}}
		for i := 1; i < size; i++ {
			eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("pod-%d-%d", r, i), Addr: fmt.Sprintf("10.%d.%d.%d:8000", r>>8&255, r&255, i)})
		}
		require.NoError(t, tr.Update(eps))
		if n := len(*tr.own.Load()); n > 2*size-1 {
			t.Fatalf("round %d: %d own addresses for %d endpoints", r, n, size)
		}
	}
	require.Len(t, b.Stats(), size)
	require.NoError(t, tr.Close())
	require.Empty(t, b.Stats(), "the closed Transport's endpoints left the Balancer")
}

// churnBase answers every call with a short chat completion, and the
// calls of the fourth endpoint of a set with 404 model not found, so that
// the not-served memory is filled too.
var churnBase = roundTripFunc(func(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	code, body := http.StatusOK, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`
	if strings.HasSuffix(r.URL.Host, ".3:8000") {
		code, body = http.StatusNotFound, `{"error":{"message":"The model 'm' does not exist.","code":404}}`
	}
	return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: -1, Request: r}, nil
})

// churnCalls sends n chat calls through tr.
func churnCalls(t *testing.T, tr *Transport, n int) {
	t.Helper()
	c := &http.Client{Transport: tr}
	for k := range n {
		resp, err := c.Post("http://llm.internal/v1/chat/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi %d"}]}`, k)))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
}

// A Transport with a Balancer of its own, given a new set of pod
// addresses by Update 2,000 times with calls in between: it and its
// Balancer hold the current set only (its own addresses are needed on a
// shared Balancer only), and the telemetry Store one slot per endpoint.
func TestUpdateChurnKeepsTheTransportToTheCurrentSet(t *testing.T) {
	tr, err := NewTransport(Options{Base: churnBase, BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	const rounds, size = 2_000, 4
	for r := range rounds {
		eps := make([]inferlb.Endpoint, size)
		for i := range eps {
			eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.%d.%d.%d:8000", r>>8&255, r&255, i)}
		}
		require.NoError(t, tr.Update(eps))
		churnCalls(t, tr, 3)
	}
	assert.Len(t, tr.Balancer().Stats(), size)
	assert.Equal(t, size, tr.Balancer().Telemetry().Len())
	assert.Len(t, tr.Endpoints(), size)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Len(t, tr.static, size)
	assert.Nil(t, tr.own.Load(), "addresses by ID kept without a shared Balancer")
	assert.Nil(t, tr.lastOwn)
}

// A DNS name whose every answer names new addresses (pods replaced on
// every resolution, or a resolver gone wrong) grows the discovered set to
// no more than twice an answer (Discovery.Grace keeps the addresses left
// out for a while, at most as many as answered): the addresses
// remembered (missed), the Transport's set and its Balancer's.
func TestDiscoveryChurnKeepsTheSetToTwiceAnAnswer(t *testing.T) {
	tr, err := NewTransport(Options{Base: churnBase, BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(4)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	const rounds, answer = 2_000, 3
	r := 0
	ds := &discoverer{t: tr, host: "llm.internal", port: "8000", keep: graceIntervals, d: Discovery{
		Interval: time.Second,
		LookupHost: func(context.Context, string) ([]string, error) {
			addrs := make([]string, answer)
			for i := range addrs {
				addrs[i] = fmt.Sprintf("10.%d.%d.%d", r>>8&255, r&255, i)
			}
			return addrs, nil
		},
	}}
	for ; r < rounds; r++ {
		ds.resolve(context.Background())
		require.LessOrEqual(t, len(ds.missed), 2*answer, "round %d", r)
		churnCalls(t, tr, 3)
	}
	assert.Len(t, ds.missed, 2*answer, "the answer and as many left out")
	assert.Len(t, tr.Balancer().Stats(), 2*answer)
	assert.Equal(t, 2*answer, tr.Balancer().Telemetry().Len())
	tr.mu.Lock()
	defer tr.mu.Unlock()
	assert.Len(t, tr.discovered, 2*answer)
}

// The default Base bounds the idle connections of endpoints that left the
// set, as Options.Base says: closed after 4 s idle, 1,024 at most across
// endpoints (with net/http's own DefaultTransport, whose 100 it raises).
func TestDefaultBaseBoundsTheIdleConnectionsOfEndpointsGone(t *testing.T) {
	base, own := defaultBase(newDialMarks())
	require.True(t, own)
	tr := base.(*http.Transport)
	assert.Equal(t, defaultIdleConnTimeout, tr.IdleConnTimeout)
	assert.Equal(t, 4*time.Second, tr.IdleConnTimeout)
	assert.Equal(t, 1024, tr.MaxIdleConns)
	assert.Equal(t, 64, tr.MaxIdleConnsPerHost)
}
