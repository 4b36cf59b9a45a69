package balancer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Calls picked before Close end normally: their Done releases what the
// pick counted (the endpoint's in-flight calls and tokens, its groups'
// counters) and feeds its EWMAs, as for an endpoint that left the set.
func TestCallsInFlightEndNormallyAfterClose(t *testing.T) {
	b := New(Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1", Labels: map[string]string{"model": "llama"}}, {Addr: "b:1"}}))
	var held []Pick
	for range 6 {
		p, err := b.Pick(&inferlb.Request{Model: "llama", PromptTokens: 100, MaxOutputTokens: 50})
		require.NoError(t, err)
		held = append(held, p)
	}
	eps := b.Stats()
	require.Len(t, eps, 2)
	var all []*endpoint
	b.mu.Lock()
	for _, e := range b.eps {
		all = append(all, e)
	}
	loads := b.def.loads
	b.mu.Unlock()

	b.Close()
	for i, p := range held {
		require.NotEmpty(t, p.ID())
		if i%2 == 0 {
			p.Done(inferlb.Outcome{})
		} else {
			p.Done(inferlb.Outcome{Err: errors.New("reset")})
		}
	}
	var succ, fail uint64
	for _, e := range all {
		assert.Zero(t, e.inFlight.Load(), e.id)
		assert.Zero(t, e.inFlightTokens.Load(), e.id)
		succ += e.successes.Load()
		fail += e.failures.Load()
	}
	assert.EqualValues(t, 3, succ)
	assert.EqualValues(t, 3, fail)
	for k, c := range loads {
		assert.Zero(t, c.Load(), "group %q", k)
	}
}
