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

// A version rollout as the README describes it, moved by relabelling
// across Updates: the canary serves llama and llama@v2, is promoted
// (joins a group by its label alone) and rolled back. An endpoint that
// joins a group because its label changed is the same warm server: it
// does not ramp, keeps its calls in flight and its breaker, and takes
// only the keys the group's ring gives it (the others stay put).
func TestCanaryRolloutByLabel(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(3), AffinitySeed: seed, MinKeyReuse: -1})
	defer b.Close()
	eps := endpoints(5)
	label := func(models ...string) {
		t.Helper()
		for i := range eps {
			eps[i].Labels = map[string]string{"model": models[i]}
		}
		require.NoError(t, b.Update(eps))
	}
	owners := func(model string) map[uint64]string {
		t.Helper()
		out := map[uint64]string{}
		for k := range uint64(400) {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: k + 1})
			require.NoError(t, err)
			out[k+1] = p.Endpoint().Addr
			p.Done(inferlb.Outcome{Latency: time.Millisecond})
		}
		return out
	}
	canary := eps[4].Addr
	label("llama", "llama", "llama", "llama", " llama@v2 ")
	for _, a := range owners("llama@v2") {
		require.Equal(t, canary, a, "pinned calls go to the canary alone")
	}
	for _, a := range owners("llama") {
		require.NotEqual(t, canary, a, "the canary does not serve plain llama yet")
	}
	before := owners("llama")

	clock.Advance(time.Hour) // past any slow start
	label("llama", "llama", "llama", "llama", "llama,,llama@v2,llama")
	// Measured idle: a call in flight on the canary puts it over its
	// load bound, and its keys spill to the better of the next two on
	// the ring, which is not always their old owner.
	moved := 0
	for k, a := range owners("llama") {
		if a != before[k] {
			moved++
			assert.Equal(t, canary, a, "key %d moved between old members", k)
		}
	}
	assert.Positive(t, moved, "the canary took its share of plain llama's keys")
	held, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama@v2"})
	require.NoError(t, err)
	require.Equal(t, canary, held.Endpoint().Addr)
	for _, s := range b.Stats() {
		assert.Equal(t, 1.0, s.RampFactor, "%s ramps after a label change", s.ID)
		if s.ID == canary {
			assert.EqualValues(t, 1, s.InFlight, "the call in flight on the canary")
		}
	}

	label("llama", "llama", "llama", "llama", "llama") // roll back
	_, err = b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama@v2"})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "nobody serves llama@v2 any more")
	for _, s := range b.Stats() {
		if s.ID == canary {
			assert.EqualValues(t, 1, s.InFlight, "the call in flight across the rollback")
		}
	}
	held.Done(inferlb.Outcome{Latency: time.Millisecond})
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight, s.ID)
	}
	_, err = b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "Llama"})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "names match case included")
}
