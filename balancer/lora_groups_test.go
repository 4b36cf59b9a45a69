package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// twoPools returns a Balancer over two pools of four endpoints: 0-3
// serve the base model llama and its adapter sql, 4-7 the base model
// qwen and its adapter chat (subset labels), each with a fresh reading
// of four free LoRA slots.
func twoPools(t *testing.T, clock *testutil.Clock) *balancer.Balancer {
	t.Helper()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(6), AffinitySeed: seed, MinKeyReuse: -1})
	t.Cleanup(b.Close)
	eps := endpoints(8)
	for i := range eps {
		eps[i].Labels = map[string]string{"model": []string{"llama,sql", "qwen,chat"}[i/4]}
	}
	require.NoError(t, b.Update(eps))
	for i, ep := range eps {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 0)
		s.Set(telemetry.Waiting, 0)
		s.SetAdapters(4, &telemetry.Adapters{Base: []string{"llama", "qwen"}[i/4]})
		b.Publish(ep.Addr, s)
	}
	return b
}

// An adapter's popularity is judged among the calls in flight on the
// endpoints that can serve it: with two pools on one Balancer, the other
// pool's traffic does not make a pool's one busy adapter look rare. It
// did: its calls were weighed against every slot-aware call of the
// Balancer, so 40 llama calls on the llama pool sent all of chat's
// calls, the whole of the qwen pool's traffic, to chat's home (spilling
// only past the load bound) instead of spreading them by prompt, and
// its sessions lost their cached prefixes.
func TestAdapterPopularityIsThePoolsOwn(t *testing.T) {
	clock := testutil.NewClock()
	for _, busy := range []bool{false, true} {
		b := twoPools(t, clock)
		var held []balancer.Pick
		hold := func(model string, n int) {
			for i := range n {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: uint64(1000 + i)})
				require.NoError(t, err)
				held = append(held, p)
			}
		}
		if busy {
			hold("llama", 40) // the other pool's traffic
		}
		// chat is all of the qwen pool's 8 calls in flight: 2 an endpoint.
		hold("chat", 8)
		c := homesOf(t, b, "chat", 50, inferlb.Request{})
		assert.Len(t, c, 4, "llama pool busy %v: chat, the qwen pool's popular adapter, spreads by prompt: %v", busy, c)
		for id := range c {
			assert.Contains(t, []string{endpoints(8)[4].Addr, endpoints(8)[5].Addr, endpoints(8)[6].Addr, endpoints(8)[7].Addr}, id)
		}
		// sql, rare in the llama pool, still goes home there.
		s := homesOf(t, b, "sql", 50, inferlb.Request{})
		assert.Len(t, s, 1, "llama pool busy %v: sql is rare: %v", busy, s)
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
		assert.Len(t, homesOf(t, b, "chat", 50, inferlb.Request{}), 1, "nothing in flight: chat is rare again")
		assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "chat", AffinityKey: 5}))
	}
}

// A gRPC channel and an HTTP Transport sharing a Balancer over the same
// endpoints (two memberships) share one measure of popularity: the calls
// through the one count against the calls through the other.
func TestAdapterPopularityAcrossMemberships(t *testing.T) {
	clock := testutil.NewClock()
	b := twoPools(t, clock)
	m, err := b.NewMembership()
	require.NoError(t, err)
	eps := endpoints(8)
	for i := range eps {
		eps[i].Labels = map[string]string{"model": []string{"llama,sql", "qwen,chat"}[i/4]}
	}
	require.NoError(t, m.Update(eps))
	var held []balancer.Pick
	hold := func(model string, n int) {
		for i := range n {
			p, err := m.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: uint64(1000 + i)})
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	// Through the other membership: 12 qwen calls and 2 of chat, 14 on
	// the qwen pool, 3.5 an endpoint.
	hold("qwen", 12)
	hold("chat", 2)
	assert.Len(t, homesOf(t, b, "chat", 50, inferlb.Request{}), 1, "chat has 2 of 14: rare, home")
	hold("chat", 3)
	c := homesOf(t, b, "chat", 50, inferlb.Request{})
	assert.Greater(t, len(c), 2, "chat has 5 of 17: popular, by prompt: %v", c)
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	assert.Len(t, homesOf(t, b, "chat", 50, inferlb.Request{}), 1, "and rare again once they end")
}
