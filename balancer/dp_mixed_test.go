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

// mixedShare is how often, over trials each on a new Balancer, one
// prompt of the given length goes to the replica "p:1", which is in no
// engine, beside the two idle ranks of engine "a". The replica first
// takes busy short calls (100-token prompts), kept in flight.
func mixedShare(t *testing.T, prompt, busy int) float64 {
	t.Helper()
	replica := inferlb.Endpoint{Addr: "p:1"}
	eps := []inferlb.Endpoint{
		{Addr: "a0:1", Labels: map[string]string{balancer.DefaultDPGroupLabel: "a"}},
		{Addr: "a1:1", Labels: map[string]string{balancer.DefaultDPGroupLabel: "a"}},
		replica,
	}
	short := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100, MaxOutputTokens: 100}
	plain := 0
	const trials = 600
	for i := range trials {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(uint64(i))})
		require.NoError(t, b.Update([]inferlb.Endpoint{replica}))
		var held []balancer.Pick
		for range busy {
			p, err := b.Pick(short)
			require.NoError(t, err)
			held = append(held, p)
		}
		require.NoError(t, b.Update(eps)) // the replica's calls stay counted
		clock.Advance(time.Minute)        // past the ranks' slow start
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: prompt, MaxOutputTokens: 200})
		require.NoError(t, err)
		if p.ID() == replica.Addr {
			plain++
		}
		p.Done(inferlb.Outcome{})
		for _, h := range held {
			h.Done(inferlb.Outcome{})
		}
	}
	return float64(plain) / trials
}

// A replica in no engine, beside an engine's ranks in one group (a plain
// server next to vLLM's per-rank servers of the same model), is an engine
// of one: a prompt raises its step by all of it, as it raises an idle
// engine's. Priced at 1 while the ranks paid 1 + prompt/8192, it took
// every call it was drawn for while all were idle (2 in 3, not 1 in 3),
// and a 32k-token prompt went to it over an idle rank with three calls
// in flight there.
func TestIdleRankAndReplicaShareAlike(t *testing.T) {
	t.Parallel()
	for _, prompt := range []int{2000, 8000, 32000} {
		assert.InDelta(t, 1.0/3, mixedShare(t, prompt, 0), 0.07, "all idle, prompt %d", prompt)
	}
	assert.Zero(t, mixedShare(t, 32000, 3), "an idle rank beats a replica with 3 calls in flight")
}
