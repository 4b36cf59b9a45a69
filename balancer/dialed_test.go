package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An embedding answer that may include a new connection's setup
// (Outcome.Dialed) is held aside, and the smaller of it and the next
// answer counts: one over a new connection after the EWMA had settled
// leaves it as it was, and the answer after it, on that connection, is
// what counts. Two held in a row count as the smaller. A generation
// call's latency is no price, and its Dialed changes nothing.
func TestDialedSampleIsHeldAside(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:80"}}))
	call := func(svc inferlb.Service, latency time.Duration, dialed bool) time.Duration {
		t.Helper()
		p, err := b.Pick(&inferlb.Request{Service: svc})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Latency: latency, Dialed: dialed})
		clock.Advance(time.Second)
		return b.Stats()[0].ServiceLatency[svc]
	}
	const emb = inferlb.ServiceEmbedding
	call(emb, 20*time.Millisecond, true) // the first, held aside (see endpoint.observe)
	require.Equal(t, 20*time.Millisecond, call(emb, 20*time.Millisecond, false))
	assert.Equal(t, 20*time.Millisecond, call(emb, 50*time.Millisecond, true), "the EWMA after an answer over a new connection")
	assert.Equal(t, 25*time.Millisecond, call(emb, 25*time.Millisecond, false), "the smaller of it and the next (a peak)")
	assert.Equal(t, 25*time.Millisecond, call(emb, 60*time.Millisecond, true), "held")
	assert.Equal(t, 60*time.Millisecond, call(emb, 70*time.Millisecond, true), "the smaller of two held in a row")

	call(inferlb.ServiceLLM, time.Second, false)
	assert.Equal(t, 3*time.Second, call(inferlb.ServiceLLM, 3*time.Second, true), "a generation call's peak")
}

// A server that closes every connection after one call makes each of its
// callers' calls pay for a new one: that is its latency as they see it,
// and it keeps its price. Embeddings over a new connection take 50 ms on
// "a" (a 30 ms handshake), 20 ms on its peers over connections they
// keep, one call every 120 ms for 36 s: a draws 5 calls of 300 when its
// calls are not marked Dialed (its first two, and a probe each time its
// EWMA has decayed below its peers'), 8 when they are: each probe is held
// aside and the next call, a probe too, counts, with its handshake.
func TestEndpointThatDialsEveryCallKeepsItsPrice(t *testing.T) {
	drew := map[bool]int{}
	for _, mark := range []bool{false, true} {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
		require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:80"}, {ID: "b", Addr: "b:80"}, {ID: "c", Addr: "c:80"}}))
		calls := map[string]int{}
		for range 300 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
			require.NoError(t, err)
			took, dialed := 20*time.Millisecond, false
			switch {
			case p.ID() == "a":
				took, dialed = 50*time.Millisecond, mark
			case calls[p.ID()] == 0:
				dialed = mark // b's and c's first connections
			}
			clock.Advance(took)
			p.Done(inferlb.Outcome{Dialed: dialed})
			calls[p.ID()]++
			clock.Advance(100 * time.Millisecond)
		}
		b.Close()
		t.Logf("Dialed %v: calls %v", mark, calls)
		drew[mark] = calls["a"]
	}
	assert.LessOrEqual(t, drew[true], 2*drew[false], "calls a drew with its calls marked Dialed, and without: %v", drew)
	assert.LessOrEqual(t, drew[true], 10, "calls a drew of 300 with its calls marked Dialed")
}
