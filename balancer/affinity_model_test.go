package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A session key (Keyer.Session) names no model, and one session may call
// several: an agent that asks a small router model and a large model under
// the same session header. Each model's calls have their own KV cache, so
// the sticky table and the spill memory keep one entry per session and
// model.

// sessionCall picks a call of session key for model.
func sessionCall(t *testing.T, b *balancer.Balancer, key uint64, model string) balancer.Pick {
	t.Helper()
	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Session: true, AffinityKey: key, Model: model})
	require.NoError(t, err)
	return p
}

// sessionGoes picks and ends one call of key for model at no load and
// returns where it went.
func sessionGoes(t *testing.T, b *balancer.Balancer, key uint64, model string) string {
	t.Helper()
	p := sessionCall(t, b, key, model)
	p.Done(inferlb.Outcome{})
	return p.ID()
}

// sessionSpills holds a call of key for model on its endpoint (in a pool of
// 4 idle endpoints that puts it at its bound) and returns where the next
// call spills; both calls are then ended.
func sessionSpills(t *testing.T, b *balancer.Balancer, key uint64, model string) string {
	t.Helper()
	held := sessionCall(t, b, key, model)
	p := sessionCall(t, b, key, model)
	require.NotEqual(t, held.ID(), p.ID(), "the first call's endpoint is at its bound: the key spills")
	p.Done(inferlb.Outcome{})
	held.Done(inferlb.Outcome{})
	return p.ID()
}

// modelPools are the fleets of the tests below: one pool of 4 endpoints
// serving every model, and a pool of 4 per model (the "model" label).
func modelPools(t *testing.T, opts balancer.Options) map[string]*balancer.Balancer {
	t.Helper()
	opts.AffinitySeed = seed
	opts.MinKeyReuse = -1
	shared := balancer.New(opts)
	require.NoError(t, shared.Update(endpoints(4)))
	split := balancer.New(opts)
	eps := endpoints(8)
	for i := range eps {
		eps[i].Labels = map[string]string{"model": []string{"small", "large"}[i/4]}
	}
	require.NoError(t, split.Update(eps))
	return map[string]*balancer.Balancer{"one pool": shared, "a pool per model": split}
}

func TestStickyIsPerSessionAndModel(t *testing.T) {
	const key = 99
	clock := testutil.NewClock()
	for name, b := range modelPools(t, balancer.Options{Clock: clock, Rand: testutil.NewRand(12), StickyTTL: time.Minute}) {
		t.Run(name, func(t *testing.T) {
			home := map[string]string{}
			for _, m := range []string{"small", "large"} {
				home[m] = sessionGoes(t, b, key, m)
			}
			// The session's small-model calls spill and stick there.
			spill := map[string]string{"small": sessionSpills(t, b, key, "small")}
			require.Equal(t, spill["small"], sessionGoes(t, b, key, "small"))
			// Its large-model calls never went there: they stay home.
			assert.Equal(t, home["large"], sessionGoes(t, b, key, "large"), "the large model follows the small model's spill")
			spill["large"] = sessionSpills(t, b, key, "large")
			// Each model's calls follow their own spill, however the two
			// alternate.
			for range 3 {
				for _, m := range []string{"small", "large"} {
					assert.Equal(t, spill[m], sessionGoes(t, b, key, m), "model %s", m)
				}
			}
		})
	}
}

func TestStickyWithoutAModelIsTheSessionAlone(t *testing.T) {
	// A call that names no model is remembered under the session key
	// itself: its stickiness is what it was before models were told apart,
	// and calls that name a model keep theirs apart from it.
	const key = 99
	b := affine(t, 4, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(12), StickyTTL: time.Minute})
	home := sessionGoes(t, b, key, "")
	spill := sessionSpills(t, b, key, "")
	require.NotEqual(t, home, spill)
	for range 3 {
		assert.Equal(t, spill, sessionGoes(t, b, key, ""))
		assert.Equal(t, home, sessionGoes(t, b, key, "small"))
	}
}

func TestSpillMemoryIsPerSessionAndModel(t *testing.T) {
	const key = 4242
	clock := testutil.NewClock()
	for name, b := range modelPools(t, balancer.Options{Clock: clock, Rand: testutil.NewRand(3)}) {
		t.Run(name, func(t *testing.T) {
			// The session's small-model calls spill once, which warms that
			// endpoint for them.
			warm := sessionSpills(t, b, key, "small")
			// The same session's large-model calls spill from their owner
			// too; the small model's warm endpoint (in the one pool it is
			// one of the large model's candidates as well) now looks busier
			// than the other candidate, so only a memory that confused the
			// models would send them there.
			for _, s := range b.Stats() {
				smp := telemetry.Sample{Time: clock.Now()}
				if s.ID == warm {
					smp.Set(telemetry.Waiting, 4)
				} else {
					smp.Set(telemetry.Waiting, 0)
				}
				b.Publish(s.ID, smp)
			}
			got := map[string]int{}
			for range 10 {
				got[sessionSpills(t, b, key, "large")]++
			}
			assert.NotContains(t, got, warm, "the large model's spills: %v", got)
			// Each model's spills stay on their own warm endpoint: the
			// first cold spill of each, the rest warm.
			var cold, warmSpills uint64
			for _, s := range b.Stats() {
				cold += s.ColdSpills
				warmSpills += s.WarmSpills
			}
			assert.Equal(t, uint64(2), cold, fmt.Sprintf("cold spills (%d warm)", warmSpills))
		})
	}
}

func TestSessionModelPickDoesNotAllocate(t *testing.T) {
	// Scoping a key to its model hashes the name on the stack: picks that
	// spill, and so consult the spill memory and the sticky table, allocate
	// nothing.
	b := affine(t, 4, balancer.Options{StickyTTL: time.Minute})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Session: true, Model: "meta-llama/Llama-3.1-8B-Instruct"}
	assertSpillsAllocateNothing(t, b, req, 1000)
}
