package balancer_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// dpFleet is 2 engines of 2 data-parallel ranks each: a0 a1 | b0 b1.
func dpFleet(label string) []inferlb.Endpoint {
	var eps []inferlb.Endpoint
	for _, eng := range []string{"a", "b"} {
		for r := range 2 {
			ep := inferlb.Endpoint{Addr: fmt.Sprintf("%s%d:8000", eng, r)}
			if label != "" {
				ep.Labels = map[string]string{label: eng}
			}
			eps = append(eps, ep)
		}
	}
	return eps
}

func engineOf(id string) byte { return id[0] }

// mateShare sends a long prompt, keeps it in flight, and counts how often
// the next long prompt, 100 ms later, goes to the same engine's other rank
// (where it fills the step the first one holds) rather than to the other
// engine (where it makes a new step that engine's other rank waits for).
func mateShare(t *testing.T, eps []inferlb.Endpoint, opts balancer.Options) float64 {
	t.Helper()
	heavy := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 8000, MaxOutputTokens: 500}
	mates := 0
	const trials = 300
	for i := range trials {
		clock := testutil.NewClock()
		opts.Clock, opts.Rand = clock, testutil.NewRand(uint64(i))
		b := balancer.New(opts)
		require.NoError(t, b.Update(eps))
		first, err := b.Pick(heavy)
		require.NoError(t, err)
		clock.Advance(100 * time.Millisecond)
		second, err := b.Pick(heavy)
		require.NoError(t, err)
		if engineOf(second.ID()) == engineOf(first.ID()) {
			mates++
		}
		first.Done(inferlb.Outcome{})
		second.Done(inferlb.Outcome{})
	}
	return float64(mates) / trials
}

func TestLongPromptsShareAnEnginesStep(t *testing.T) {
	// Without engines the second prompt goes to any of the three idle
	// ranks: the first one's engine-mate a third of the time.
	plain := mateShare(t, dpFleet(""), balancer.Options{})
	// With them, whenever P2C draws the mate (3 of the 6 pairs of ranks)
	// it wins: the other engine's ranks would start a new 8k-token step of
	// their own, and the first rank is busy. The other pairs have no mate.
	engines := mateShare(t, dpFleet(balancer.DefaultDPGroupLabel), balancer.Options{})
	custom := mateShare(t, dpFleet("engine"), balancer.Options{DPGroupLabel: "engine"})
	t.Logf("engine-mate share: no engines %.2f, engines %.2f, custom label %.2f", plain, engines, custom)
	assert.InDelta(t, 1.0/3, plain, 0.08)
	assert.InDelta(t, 0.5, engines, 0.08)
	assert.Equal(t, engines, custom)
}

// The estimate decays: a prompt sent long ago holds no step, so the next
// one is priced as on an idle engine.
func TestEnginePrefillIsForgotten(t *testing.T) {
	heavy := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 8000, MaxOutputTokens: 500}
	mates := 0
	const trials = 300
	for i := range trials {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(uint64(i))})
		require.NoError(t, b.Update(dpFleet(balancer.DefaultDPGroupLabel)))
		first, err := b.Pick(heavy)
		require.NoError(t, err)
		first.Done(inferlb.Outcome{})
		clock.Advance(20 * time.Second)
		second, err := b.Pick(heavy)
		require.NoError(t, err)
		second.Done(inferlb.Outcome{})
		if second.ID() != first.ID() && engineOf(second.ID()) == engineOf(first.ID()) {
			mates++
		}
	}
	assert.InDelta(t, 0.25, float64(mates)/trials, 0.08, "any of 4 idle ranks")
}

func TestPickOnEnginesDoesNotAllocate(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update(dpFleet(balancer.DefaultDPGroupLabel)))
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 3000, MaxOutputTokens: 200}))
}

// Picks on engines, with keys that recur and keys that do not, race with
// Updates that regroup the ranks; run with -race. Every call is counted
// out again.
func TestEnginesAndKeyReuseUnderConcurrency(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update(dpFleet(balancer.DefaultDPGroupLabel)))
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				key := uint64(i%50) + 1 // recurring
				if w%2 == 1 {
					key = uint64(w*1_000_000+i)*0x9e3779b97f4a7c15 | 1 // never again
				}
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key, PromptTokens: 1000 * (i % 9)})
				if err != nil {
					t.Error(err)
					return
				}
				p.Done(inferlb.Outcome{})
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			eps := dpFleet(balancer.DefaultDPGroupLabel)
			if i%2 == 1 {
				for j := range eps { // one engine of four ranks
					eps[j].Labels = map[string]string{balancer.DefaultDPGroupLabel: "all"}
				}
			}
			if err := b.Update(eps); err != nil {
				t.Error(err)
				return
			}
			_ = b.KeyReuse()
		}
	})
	wg.Wait()
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight, s.ID)
	}
}

// pickSequence runs 200 generation picks on a new Balancer over eps (fixed
// seed, fake clock advancing 40 ms a pick, the last 6 calls in flight)
// with prompt(i) tokens each, and returns the IDs picked.
func pickSequence(t *testing.T, eps []inferlb.Endpoint, prompt func(i int) int) []string {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(7)})
	require.NoError(t, b.Update(eps))
	var ids []string
	var held []balancer.Pick
	for i := range 200 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: prompt(i), MaxOutputTokens: 200})
		require.NoError(t, err)
		ids = append(ids, p.ID())
		held = append(held, p)
		if len(held) > 6 {
			held[0].Done(inferlb.Outcome{})
			held = held[1:]
		}
		clock.Advance(40 * time.Millisecond)
	}
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	return ids
}

// A long prompt every third call, short ones between.
func heavyLight(i int) int { return 100 + 7000*(i%3/2) }

// An engine of one has no barrier: a rank whose dp_group no other endpoint
// shares is priced as an unlabelled endpoint is, pick for pick (its recent
// prefill prices it as any replica's does), and so is every endpoint of a
// fleet whose labels name no engine of two.
func TestAnEngineOfOneIsPricedAsUnlabelled(t *testing.T) {
	plain := pickSequence(t, []inferlb.Endpoint{{Addr: "a:1"}, {Addr: "b:1"}, {Addr: "c:1"}}, heavyLight)
	solo := pickSequence(t, []inferlb.Endpoint{
		{Addr: "a:1", Labels: map[string]string{balancer.DefaultDPGroupLabel: "x"}},
		{Addr: "b:1", Labels: map[string]string{balancer.DefaultDPGroupLabel: "y"}},
		{Addr: "c:1"},
	}, heavyLight)
	assert.Equal(t, plain, solo)
}

// The barrier prices a call's prompt tokens: calls without an estimate
// (over gRPC, unless the caller sets one in the context or installs
// grpcbalancer.UnaryEstimate) are priced on engines as on replicas, pick
// for pick; with estimates the engines do route differently.
func TestEnginesNeedPromptTokens(t *testing.T) {
	none := func(int) int { return 0 }
	assert.Equal(t, pickSequence(t, dpFleet(""), none), pickSequence(t, dpFleet(balancer.DefaultDPGroupLabel), none))
	assert.NotEqual(t, pickSequence(t, dpFleet(""), heavyLight), pickSequence(t, dpFleet(balancer.DefaultDPGroupLabel), heavyLight))
}

// At light load, one call at a time with seconds between them, no engine
// is prefilling when a call is priced: engines must route it as replicas
// do, pick for pick (ties a coin flip), not keep it on the engine that
// took the last call because the call left a float32 leftover in its
// rank's estimate. Before leftovers counted as no prefill, 291 of these
// 499 calls (58%) went to the previous call's engine, against 264 (53%)
// on replicas.
func TestIdleEnginesRouteAsReplicas(t *testing.T) {
	run := func(label string) []string {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(3)})
		require.NoError(t, b.Update(dpFleet(label)))
		r := rand.New(rand.NewPCG(1, 2))
		var ids []string
		for range 500 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 1000 + r.IntN(3000)})
			require.NoError(t, err)
			ids = append(ids, p.ID())
			clock.Advance(time.Duration(r.Int64N(int64(50 * time.Millisecond)))) // ends at any nanosecond
			p.Done(inferlb.Outcome{})
			clock.Advance(2*time.Second + time.Duration(r.Int64N(int64(time.Second))))
		}
		return ids
	}
	assert.Equal(t, run(""), run(balancer.DefaultDPGroupLabel))
}
