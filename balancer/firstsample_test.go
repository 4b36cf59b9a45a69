package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// sequentialEmbeddings sends n embedding calls one after another to
// endpoints a, b and c on a fake clock, gap apart; latency returns how
// long the k-th call (from 0) to id takes. It returns each endpoint's
// calls in windows of 25.
func sequentialEmbeddings(t *testing.T, n int, gap time.Duration, latency func(id string, k int) time.Duration) map[string][]int {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:80"}, {ID: "b", Addr: "b:80"}, {ID: "c", Addr: "c:80"}}))
	calls := map[string]int{}
	windows := map[string][]int{}
	for _, id := range []string{"a", "b", "c"} {
		windows[id] = make([]int, (n+24)/25)
	}
	for i := range n {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
		require.NoError(t, err)
		id := p.ID()
		clock.Advance(latency(id, calls[id]))
		p.Done(inferlb.Outcome{})
		calls[id]++
		windows[id][i/25]++
		clock.Advance(gap)
	}
	return windows
}

// The first call to an endpoint over HTTP pays for its connection: 58 ms
// of TCP and TLS handshake before a 2 ms embedding (1 ms on its peers).
// That answer became the endpoint's peak-EWMA, and with calls sent one at
// a time none is ever in flight elsewhere, so it lost every comparison
// until the EWMA had decayed below its peers' 2 ms: 32 s at the default
// LatencyDecay, whatever the rate, and its share came back over another
// 15 s or so (it drew 1 of the first 200 calls at 10 and 500 calls a
// second, 1 of the first 25 and 54 of 200 at one a second). The first
// answer is held aside, the EWMA starting at the smaller of the first two,
// and the endpoint draws its third of the calls from the start.
func TestSlowFirstSampleDoesNotShunEndpoint(t *testing.T) {
	for _, gap := range []time.Duration{0, 100 * time.Millisecond, time.Second} {
		windows := sequentialEmbeddings(t, 200, gap, func(id string, k int) time.Duration {
			switch {
			case k > 0:
				return 2 * time.Millisecond
			case id == "a":
				return 60 * time.Millisecond
			default:
				return 3 * time.Millisecond
			}
		})
		t.Logf("gap %v: calls in windows of 25: %v", gap, windows)
		for w, n := range windows["a"] {
			assert.GreaterOrEqual(t, n, 7, "gap %v: a's calls of 25 in window %d of %v", gap, w, windows["a"])
		}
	}
}

// An endpoint that is slow on every call, not only its first, pays one
// more slow call for the first being held aside: it draws two calls, and
// then none for the run (20 s), as before.
func TestSlowEndpointDrawsOneMoreCall(t *testing.T) {
	windows := sequentialEmbeddings(t, 200, 100*time.Millisecond, func(id string, k int) time.Duration {
		if id == "a" {
			return 60 * time.Millisecond
		}
		return 2 * time.Millisecond
	})
	sum := 0
	for _, n := range windows["a"] {
		sum += n
	}
	assert.Equal(t, 2, sum, "calls the slow endpoint drew: %v", windows)
}

// A replica whose first embedding answer was slow (a cold start: 300 ms)
// and that then hangs, its callers giving up on each call after 250 ms
// with nothing back. Its only answer is held aside (no EWMA yet), and a
// wait shorter than that answer started nothing: with no latency and
// nothing in flight it was priced as an idle probe, the cheapest there
// is, and drew every call sent one at a time (200 of 200). A wait starts
// the EWMA as a lower bound, as it raises an EWMA below it.
func TestHungAfterOneSlowAnswerStopsDrawingCalls(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:80"}, {ID: "b", Addr: "b:80"}, {ID: "c", Addr: "c:80"}}))
	calls := map[string]int{}
	for range 200 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
		require.NoError(t, err)
		id := p.ID()
		switch {
		case id != "a":
			clock.Advance(2 * time.Millisecond)
			p.Done(inferlb.Outcome{})
		case calls[id] == 0:
			clock.Advance(300 * time.Millisecond)
			p.Done(inferlb.Outcome{})
		default:
			clock.Advance(250 * time.Millisecond)
			p.Done(inferlb.Outcome{Err: context.Canceled, Unanswered: true})
		}
		calls[id]++
		clock.Advance(100 * time.Millisecond)
	}
	t.Logf("calls: %v", calls)
	assert.LessOrEqual(t, calls["a"], 4, "calls the hung replica drew, of %v", calls)
}
