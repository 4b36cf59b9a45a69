package balancer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

const seed = 0x5eed

// affine is newBalancer with the tests' shared AffinitySeed.
//
// Placement tests probe it with keys that mostly never recur, which
// MinKeyReuse rightly reads as a workload that affinity cannot help; they
// test placement, so the check is off unless the test sets it.
func affine(t testing.TB, n int, opts balancer.Options) *balancer.Balancer {
	t.Helper()
	opts.AffinitySeed = seed
	if opts.MinKeyReuse == 0 {
		opts.MinKeyReuse = -1
	}
	return newBalancer(t, n, opts)
}

// owner picks with key at no load and returns the endpoint.
func owner(t testing.TB, b *balancer.Balancer, key uint64) string {
	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	return p.ID()
}

// ownerTakes holds n calls of key at once and returns how many of them
// its owner home took; the calls are then released.
func ownerTakes(t *testing.T, b *balancer.Balancer, key uint64, home string, n int) int64 {
	t.Helper()
	held := make([]balancer.Pick, 0, n)
	for range n {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
		require.NoError(t, err)
		held = append(held, p)
	}
	got := stat(t, b, home).InFlight
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	return got
}

func TestIndependentBalancersAgree(t *testing.T) {
	t.Parallel()
	// Two processes: same endpoints (in a different order) and seed, their
	// own random sources and no shared state.
	// 100,000 keys seen once each: without MinKeyReuse -1 both would
	// (rightly) stop routing them by affinity after the first few hundred.
	a := balancer.New(balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(1), MinKeyReuse: -1})
	b := balancer.New(balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(2), MinKeyReuse: -1})
	eps := endpoints(16)
	require.NoError(t, a.Update(eps))
	rev := append([]inferlb.Endpoint(nil), eps...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	require.NoError(t, b.Update(rev))
	rng := rand.New(rand.NewPCG(3, 4))
	same := 0
	const keys = 100_000
	perEndpoint := map[string]int{}
	for range keys {
		k := rng.Uint64() | 1
		oa, ob := owner(t, a, k), owner(t, b, k)
		if oa == ob {
			same++
		}
		perEndpoint[oa]++
	}
	t.Logf("agreement %.4f", float64(same)/keys)
	assert.GreaterOrEqual(t, float64(same)/keys, 0.99)
	for id, c := range perEndpoint {
		assert.InDelta(t, keys/16, c, keys/16*0.35, "keys owned by %s", id)
	}

	// A different seed places keys differently.
	c := balancer.New(balancer.Options{AffinitySeed: seed + 1})
	require.NoError(t, c.Update(eps))
	differ := 0
	for k := uint64(1); k < 1000; k++ {
		if owner(t, a, k*0x9e3779b97f4a7c15) != owner(t, c, k*0x9e3779b97f4a7c15) {
			differ++
		}
	}
	assert.Greater(t, differ, 800)
}

func TestMembershipChangeMovesFewKeys(t *testing.T) {
	b := affine(t, 16, balancer.Options{SlowStartWindow: -1})
	keys := make([]uint64, 20_000)
	before := make([]string, len(keys))
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		before[i] = owner(t, b, keys[i])
	}
	moved := func() float64 {
		m := 0
		for i, k := range keys {
			if owner(t, b, k) != before[i] {
				m++
			}
		}
		return float64(m) / float64(len(keys))
	}
	require.NoError(t, b.Update(endpoints(16)[1:]))
	assert.LessOrEqual(t, moved(), 1.3/16, "removing 1 of 16")
	require.NoError(t, b.Update(endpoints(17)))
	assert.LessOrEqual(t, moved(), 1.3/17, "adding a 17th")
}

func TestHotKeyNeverPassesTheBound(t *testing.T) {
	for _, mode := range []balancer.AffinityMode{balancer.AffinityPrefer, balancer.AffinityStrict} {
		t.Run(mode.String(), func(t *testing.T) {
			const n, calls = 16, 10_000
			b := affine(t, n, balancer.Options{Affinity: mode, Rand: testutil.NewRand(7)})
			req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 42}
			held := make([]balancer.Pick, 0, calls)
			for range calls {
				p, err := b.Pick(req)
				require.NoError(t, err)
				held = append(held, p)
			}
			mean := float64(calls) / n
			bound := balancer.DefaultLoadBound*mean + 1
			var most int64
			used := 0
			for _, s := range b.Stats() {
				most = max(most, s.InFlight)
				if s.InFlight > 0 {
					used++
				}
			}
			t.Logf("max in-flight %d, bound %.0f, endpoints used %d", most, bound, used)
			assert.LessOrEqual(t, float64(most), bound)
			// The key's owner fills to the bound, then its spill order does:
			// as few endpoints as the bound allows share the key's cache.
			assert.GreaterOrEqual(t, used, int(float64(calls)/bound)+1, "load still spreads")
			for i := range held {
				held[i].Done(inferlb.Outcome{})
			}
		})
	}
}

func TestAffinityOffIgnoresKeys(t *testing.T) {
	b := affine(t, 8, balancer.Options{Affinity: balancer.AffinityOff, Rand: testutil.NewRand(8)})
	seen := map[string]bool{}
	for range 200 {
		seen[owner(t, b, 42)] = true
	}
	assert.Greater(t, len(seen), 4, "without affinity one key spreads like any traffic")
}

func TestChatTurnsStayAndConversationsSpread(t *testing.T) {
	b := affine(t, 16, balancer.Options{})
	k := b.Keyer()
	system := cache.Message{Role: "system", Content: "You are a helpful assistant for ACME Corp. Answer briefly."}
	// One conversation, turn by turn: every turn lands where the first did.
	msgs := []cache.Message{system, {Role: "user", Content: "How do I reset my router?"}}
	first := owner(t, b, k.Chat("llama", msgs))
	for turn := range 6 {
		msgs = append(msgs,
			cache.Message{Role: "assistant", Content: fmt.Sprintf("Answer %d: unplug it for ten seconds.", turn)},
			cache.Message{Role: "user", Content: fmt.Sprintf("Follow-up question %d?", turn)})
		assert.Equal(t, first, owner(t, b, k.Chat("llama", msgs)), "turn %d", turn+2)
	}
	// 10,000 conversations that share only the system prompt spread out.
	counts := map[string]int{}
	for c := range 10_000 {
		key := k.Chat("llama", []cache.Message{system, {Role: "user", Content: fmt.Sprintf("question number %d", c)}})
		counts[owner(t, b, key)]++
	}
	assert.Len(t, counts, 16)
	for id, c := range counts {
		assert.Less(t, c, 2*10_000/16, "%s owns at most twice its share", id)
	}
}

func TestAffinityRespectsSlowStartAndStanding(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(9)})
	// Find keys owned by endpoint 0, then take it out of rotation.
	var keys []uint64
	for k := uint64(1); len(keys) < 200; k++ {
		if owner(t, b, k*0x9e3779b97f4a7c15) == endpoints(4)[0].Addr {
			keys = append(keys, k*0x9e3779b97f4a7c15)
		}
	}
	require.True(t, b.SetReady(endpoints(4)[0].Addr, false))
	for _, k := range keys {
		assert.NotEqual(t, endpoints(4)[0].Addr, owner(t, b, k), "not-ready owner is skipped")
	}
	// Rejoining after removal: slow start limits how much of its keys'
	// traffic it takes at first.
	require.NoError(t, b.Update(endpoints(4)[1:]))
	require.NoError(t, b.Update(endpoints(4)))
	back := 0
	for _, k := range keys {
		if owner(t, b, k) == endpoints(4)[0].Addr {
			back++
		}
	}
	assert.Less(t, back, len(keys)/4, "a ramping owner takes its keys only in proportion to its ramp")
	clock.Advance(balancer.DefaultSlowStartWindow)
	back = 0
	for _, k := range keys {
		if owner(t, b, k) == endpoints(4)[0].Addr {
			back++
		}
	}
	assert.Equal(t, len(keys), back, "after the ramp every key is home again")
}

func TestAffinePickDoesNotAllocate(t *testing.T) {
	b := affine(t, 64, balancer.Options{})
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 12345}))
}

// With every server reporting its queue, the bound sums the reports; the
// sum is cached a tenth of a second and recomputed after, with no
// allocation either way.
func TestAffinePickWithReportedLoadDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 64, balancer.Options{Clock: clock, TelemetryMaxAge: time.Hour})
	for _, e := range endpoints(64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 3)
		s.Set(telemetry.Waiting, 0)
		b.Publish(e.Key(), s)
	}
	req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 12345}
	assert.Zero(t, pickDoneAllocs(b, req), "cached")
	assert.Zero(t, testing.AllocsPerRun(200, func() {
		clock.Advance(200 * time.Millisecond) // past the cache's life: recomputed
		p, err := b.Pick(req)
		if err != nil {
			panic(err)
		}
		p.Done(inferlb.Outcome{Latency: time.Millisecond})
	}), "recomputed")
}

func TestParseAffinityMode(t *testing.T) {
	for _, m := range []balancer.AffinityMode{balancer.AffinityPrefer, balancer.AffinityOff, balancer.AffinityStrict} {
		got, err := balancer.ParseAffinityMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := balancer.ParseAffinityMode("sticky")
	assert.ErrorContains(t, err, `affinity mode "sticky"`)
	assert.ErrorContains(t, (&balancer.Options{LoadBound: 0.9}).Validate(), "LoadBound")
}

func TestUnqueuedOwnerKeepsItsKeysUpToTheHardCap(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(10)})
	const key = 77
	home := owner(t, b, key)
	report := func(waiting float64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Waiting, waiting)
		s.Set(telemetry.KVCacheUsage, 0.5)
		b.Publish(home, s)
	}
	// 40 calls of one key in flight across 4 endpoints: the plain bound is
	// ceil(1.25 x 40/4) = 13 at the end. A server reporting an empty queue
	// is not saturated, so it keeps the key up to 1.2 times that share.
	hold := func(n int) (inFlight int64, held []balancer.Pick) {
		for range n {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
			require.NoError(t, err)
			held = append(held, p)
		}
		return stat(t, b, home).InFlight, held
	}
	report(0)
	got, held := hold(40)
	assert.Greater(t, got, int64(13), "an unqueued owner takes more than the plain bound")
	assert.LessOrEqual(t, got, int64(16), "but never past the hard cap, ceil(1.5 x 40/4)")
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	// Once it reports a queue, the plain bound applies again.
	report(3)
	got, held = hold(40)
	assert.LessOrEqual(t, got, int64(13))
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
}

// oneKeysOwner sets up 8 endpoints and the owner of one key: report
// publishes the owner's queue and KV-cache usage, and hold sends 40 calls
// of the key and returns how many the owner took (a fair share of 5 at the
// end, the plain bound ceil(1.25 x 5) = 7, the hard cap ceil(1.5 x 5) = 8).
func oneKeysOwner(t *testing.T) (clock *testutil.Clock, report func(waiting, kv float64), hold func() int64) {
	t.Helper()
	clock = testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(11)})
	const key = 78
	home := owner(t, b, key)
	report = func(waiting, kv float64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Waiting, waiting)
		s.Set(telemetry.KVCacheUsage, kv)
		b.Publish(home, s)
	}
	hold = func() int64 { return ownerTakes(t, b, key, home, 40) }
	return clock, report, hold
}

func TestRoomyOwnerKeepsItsKeysAFewCallsPastTheHardCap(t *testing.T) {
	clock, report, hold := oneKeysOwner(t)
	// No queue and a KV cache under 30%: far from saturation, the owner
	// keeps the key up to 4 calls past the hard cap, and no further.
	report(0, 0.1)
	got := hold()
	assert.Greater(t, got, int64(8), "a roomy owner keeps its key past the hard cap")
	assert.LessOrEqual(t, got, int64(12), "but at most 4 calls past it")
	// A fuller cache: only the unqueued band.
	report(0, 0.5)
	assert.LessOrEqual(t, hold(), int64(8))
	// A queue: the plain bound.
	report(2, 0.1)
	assert.LessOrEqual(t, hold(), int64(7))
	// A roomy reading past TelemetryMaxAge says nothing: the plain bound.
	report(0, 0.1)
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	assert.LessOrEqual(t, hold(), int64(7))
}

// One waiting call is an arrival between two of the server's steps, not a
// queue, while the owner's KV cache has room: it keeps its key as with no
// queue. Two waiting, or one with the cache half full, are a queue.
func TestOwnerWithOneArrivalWaitingKeepsItsKeys(t *testing.T) {
	_, report, hold := oneKeysOwner(t)
	// KV cache under 30%: the roomy band, up to 4 calls past the hard cap.
	report(1, 0.1)
	got := hold()
	assert.Greater(t, got, int64(8), "one waiting call with a roomy cache is no queue")
	assert.LessOrEqual(t, got, int64(12))
	// Under 50%: up to the hard cap.
	report(1, 0.4)
	assert.Equal(t, int64(8), hold(), "one waiting call with the cache under half full is no queue")
	// Half full: a queue, the plain bound.
	report(1, 0.5)
	assert.LessOrEqual(t, hold(), int64(7))
	// Two waiting: a queue at any KV usage.
	report(2, 0.1)
	assert.LessOrEqual(t, hold(), int64(7))
}

func TestStickyFollowsTheKeyAfterASpill(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(12), StickyTTL: time.Minute})
	const key = 99
	home := owner(t, b, key)
	// With one call of the key in flight on an otherwise idle fleet the
	// owner is at its bound (ceil(1.25 x 2/4) = 1), so the next one spills.
	held, err := b.Pick(&inferlb.Request{AffinityKey: key})
	require.NoError(t, err)
	require.Equal(t, home, held.ID())
	p, err := b.Pick(&inferlb.Request{AffinityKey: key})
	require.NoError(t, err)
	spill := p.ID()
	require.NotEqual(t, home, spill)
	p.Done(inferlb.Outcome{})
	held.Done(inferlb.Outcome{})
	// The owner is free again, but the key follows its cache to the spill.
	assert.Equal(t, spill, owner(t, b, key))
	// After the TTL the key goes home.
	clock.Advance(2 * time.Minute)
	assert.Equal(t, home, owner(t, b, key))
	// Without StickyTTL it goes home at once.
	plain := affine(t, 4, balancer.Options{})
	assert.Equal(t, home, owner(t, plain, key))
}

func TestPressuredOwnerPassesKeysOnlyToClearlyEmptierNeighbours(t *testing.T) {
	for _, mode := range []balancer.AffinityMode{balancer.AffinityPrefer, balancer.AffinityStrict} {
		t.Run(mode.String(), func(t *testing.T) { testPressuredOwner(t, mode) })
	}
}

func testPressuredOwner(t *testing.T, mode balancer.AffinityMode) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(13), Affinity: mode})
	var keys []uint64
	for k := uint64(1); len(keys) < 100; k++ {
		if owner(t, b, k*0x9e3779b97f4a7c15) == endpoints(8)[0].Addr {
			keys = append(keys, k*0x9e3779b97f4a7c15)
		}
	}
	kv := func(id string, u float64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, u)
		b.Publish(id, s)
	}
	home := func() int {
		n := 0
		for _, k := range keys {
			if owner(t, b, k) == endpoints(8)[0].Addr {
				n++
			}
		}
		return n
	}
	// One replica nearly full, the rest comfortable: its keys move.
	for i, ep := range endpoints(8) {
		kv(ep.Addr, map[bool]float64{true: 0.97, false: 0.4}[i == 0])
	}
	assert.Zero(t, home(), "a 97%-full owner hands its keys to emptier neighbours")
	// Emptier but queueing neighbours relieve nothing: the key would trade
	// a full cache for a queue and a cold prefill.
	for i, ep := range endpoints(8) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, map[bool]float64{true: 0.97, false: 0.4}[i == 0])
		s.Set(telemetry.Waiting, map[bool]float64{true: 0, false: 2}[i == 0])
		b.Publish(ep.Addr, s)
	}
	assert.Equal(t, len(keys), home(), "queueing neighbours do not take the keys")
	// The whole fleet nearly full (saturation): a warm prefix beats a spill.
	// No queue anywhere (the Store keeps the Waiting published above until
	// a newer one comes), so only the margin keeps the keys home.
	for i, ep := range endpoints(8) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, map[bool]float64{true: 0.97, false: 0.9}[i == 0])
		s.Set(telemetry.Waiting, 0)
		b.Publish(ep.Addr, s)
	}
	assert.Equal(t, len(keys), home(), "neighbours only a little emptier do not take the keys")
	// Stale telemetry is neutral.
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	assert.Equal(t, len(keys), home())
}

// A server that reports its KV cache holds GPU memory by configuration
// (vLLM started with gpu_memory_utilization 0.95), not by load: an owner
// with a half-empty KV cache keeps its keys however full its GPU memory
// reads, while a server that reports no KV cache is judged on its memory.
func TestOwnerReportingKVCacheIsNotPressuredByItsGPUMemory(t *testing.T) {
	keptHome := func(withKV bool) (home, keys int) {
		clock := testutil.NewClock()
		b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(13)})
		for i, ep := range endpoints(8) {
			s := telemetry.Sample{Time: clock.Now()}
			if withKV {
				s.Set(telemetry.KVCacheUsage, 0.5)
			}
			s.Set(telemetry.GPUMemTotal, 80e9)
			s.Set(telemetry.GPUMemUsed, map[bool]float64{true: 0.965, false: 0.7}[i == 0]*80e9)
			b.Publish(ep.Addr, s)
		}
		// The keys endpoint 0 owns on a fleet with no telemetry.
		plain := affine(t, 8, balancer.Options{})
		for k := uint64(1); keys < 100; k++ {
			if key := k * 0x9e3779b97f4a7c15; owner(t, plain, key) == endpoints(8)[0].Addr {
				keys++
				if owner(t, b, key) == endpoints(8)[0].Addr {
					home++
				}
			}
		}
		return home, keys
	}
	home, keys := keptHome(true)
	assert.Equal(t, keys, home, "an owner at 96.5% GPU memory and 50% KV cache keeps its keys")
	home, _ = keptHome(false)
	assert.Zero(t, home, "without a KV-cache report, 96.5% GPU memory is pressure")
}

func TestPickExcept(t *testing.T) {
	b := affine(t, 3, balancer.Options{Rand: testutil.NewRand(14)})
	for _, req := range []*inferlb.Request{{}, {Service: inferlb.ServiceLLM, AffinityKey: 5}} {
		for range 200 {
			p, err := b.PickExcept(req, endpoints(3)[1].Addr)
			require.NoError(t, err)
			assert.NotEqual(t, endpoints(3)[1].Addr, p.ID())
			p.Done(inferlb.Outcome{})
		}
	}
	one := affine(t, 1, balancer.Options{})
	_, err := one.PickExcept(&inferlb.Request{}, endpoints(1)[0].Addr)
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "nothing else to fail over to")
	req, not := &inferlb.Request{}, endpoints(3)[0].Addr
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		p, _ := b.PickExcept(req, not)
		p.Done(inferlb.Outcome{})
	}))
}

func TestCrowdedOwnerKeepsItsKeysWhenTheSpillWouldQueueToo(t *testing.T) {
	const key = 77
	// The owner reports a queue. 40 calls of its key in flight across 4
	// endpoints: the plain bound is 13, the hard cap ceil(1.5 x 40/4) = 16.
	run := func(t *testing.T, others func(s *telemetry.Sample)) int64 {
		clock := testutil.NewClock()
		b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(10)})
		home := owner(t, b, key)
		for _, s := range b.Stats() {
			smp := telemetry.Sample{Time: clock.Now()}
			if s.ID == home {
				smp.Set(telemetry.Waiting, 3)
				smp.Set(telemetry.KVCacheUsage, 0.8)
			} else if others != nil {
				others(&smp)
			} else {
				continue
			}
			b.Publish(s.ID, smp)
		}
		return ownerTakes(t, b, key, home, 40)
	}
	t.Run("spill target queueing", func(t *testing.T) {
		got := run(t, func(s *telemetry.Sample) { s.Set(telemetry.Waiting, 2); s.Set(telemetry.KVCacheUsage, 0.5) })
		assert.Greater(t, got, int64(13), "the key stays home past the plain bound")
		assert.LessOrEqual(t, got, int64(16), "but never past the hard cap")
	})
	t.Run("spill target KV nearly full", func(t *testing.T) {
		got := run(t, func(s *telemetry.Sample) { s.Set(telemetry.Waiting, 0); s.Set(telemetry.KVCacheUsage, 0.93) })
		assert.Greater(t, got, int64(13))
		assert.LessOrEqual(t, got, int64(16))
	})
	t.Run("spill target has room", func(t *testing.T) {
		got := run(t, func(s *telemetry.Sample) { s.Set(telemetry.Waiting, 0); s.Set(telemetry.KVCacheUsage, 0.5) })
		assert.LessOrEqual(t, got, int64(13), "the key spills at the plain bound")
	})
	t.Run("no telemetry from the spill target", func(t *testing.T) {
		assert.LessOrEqual(t, run(t, nil), int64(13))
	})
}

// spillOnce holds a call on the key's owner (on an idle fleet of 4 that puts
// it at its bound) and returns where the next call of the key spills, with
// the held call still in flight; release ends both.
func spillOnce(t *testing.T, b *balancer.Balancer, key uint64) (spill string, release func()) {
	t.Helper()
	held, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
	require.NoError(t, err)
	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
	require.NoError(t, err)
	require.NotEqual(t, held.ID(), p.ID(), "the owner is at its bound: the key spills")
	return p.ID(), func() { p.Done(inferlb.Outcome{}); held.Done(inferlb.Outcome{}) }
}

func TestSpillsReturnToTheEndpointThatCachedTheKey(t *testing.T) {
	const key = 4242
	for _, tc := range []struct {
		name   string
		memory time.Duration
		warm   bool
	}{
		{"default memory", 0, true},
		{"memory off", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), SpillMemory: tc.memory})
			home := owner(t, b, key)
			first, release := spillOnce(t, b, key)
			release()
			// The first spill target now looks busier than the other
			// candidates (every endpoint reports its queue: one without
			// a reading is compared on this caller's calls alone), so
			// P2C alone would move the key's spills away from it.
			busy := func() {
				for _, e := range endpoints(4) {
					s := telemetry.Sample{Time: clock.Now()}
					s.Set(telemetry.Waiting, 0)
					if e.Key() == first {
						s.Set(telemetry.Waiting, 4)
					}
					b.Publish(e.Key(), s)
				}
			}
			busy()
			count := map[string]int{}
			for range 20 {
				got, release := spillOnce(t, b, key)
				release()
				count[got]++
			}
			assert.NotContains(t, count, home)
			warm, cold := map[string]uint64{}, map[string]uint64{}
			for _, s := range b.Stats() {
				if s.WarmSpills > 0 {
					warm[s.ID] = s.WarmSpills
				}
				if s.ColdSpills > 0 {
					cold[s.ID] = s.ColdSpills
				}
			}
			if tc.warm {
				assert.Equal(t, map[string]int{first: 20}, count, "spills go where the key is cached")
				assert.Equal(t, map[string]uint64{first: 20}, warm, "Stats count the warm spills")
				assert.Equal(t, map[string]uint64{first: 1}, cold, "and the first, cold one")
			} else {
				assert.Zero(t, count[first], "without memory the cheaper endpoint takes every spill")
				assert.Empty(t, warm, "without memory no spill is known warm")
				var n uint64
				for _, v := range cold {
					n += v
				}
				assert.Equal(t, uint64(21), n)
			}
			if !tc.warm {
				return
			}
			// Once the memory has expired the target is cold again and the
			// cheaper endpoint wins.
			clock.Advance(balancer.DefaultSpillMemory + time.Second)
			busy()
			got, release := spillOnce(t, b, key)
			release()
			assert.NotEqual(t, first, got)
		})
	}
}

func TestCrowdedOwnerSpillsToABusyEndpointThatCachedTheKey(t *testing.T) {
	const key = 77
	// The key's first endpoint after its owner, in preference order: strict
	// affinity retries there.
	strict := affine(t, 4, balancer.Options{Affinity: balancer.AffinityStrict})
	home := owner(t, strict, key)
	p, err := strict.PickExcept(&inferlb.Request{AffinityKey: key}, home)
	require.NoError(t, err)
	next := p.ID()
	p.Done(inferlb.Outcome{})

	run := func(t *testing.T, memory time.Duration, calls int) int64 {
		clock := testutil.NewClock()
		b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(10), SpillMemory: memory})
		require.Equal(t, home, owner(t, b, key))
		// Warm next up with one spill: the others look busy for it.
		for _, s := range b.Stats() {
			if s.ID != home && s.ID != next {
				smp := telemetry.Sample{Time: clock.Now()}
				smp.Set(telemetry.Waiting, 5)
				b.Publish(s.ID, smp)
			}
		}
		got, release := spillOnce(t, b, key)
		release()
		require.Equal(t, next, got)
		// Now the owner queues and so does every other endpoint (the
		// setting of TestCrowdedOwnerKeepsItsKeysWhenTheSpillWouldQueueToo).
		clock.Advance(time.Second)
		for _, s := range b.Stats() {
			smp := telemetry.Sample{Time: clock.Now()}
			if s.ID == home {
				smp.Set(telemetry.Waiting, 3)
				smp.Set(telemetry.KVCacheUsage, 0.8)
			} else {
				smp.Set(telemetry.Waiting, 2)
				smp.Set(telemetry.KVCacheUsage, 0.5)
			}
			b.Publish(s.ID, smp)
		}
		return ownerTakes(t, b, key, home, calls)
	}
	// 30 calls of the key in flight: the plain bound is ceil(1.25 x 30/4) = 10.
	assert.Greater(t, run(t, -1, 30), int64(10), "a cold target: the crowded owner keeps the key past its bound")
	assert.LessOrEqual(t, run(t, 0, 30), int64(10), "a warm target relieves the owner at its bound")
}

func TestSpillMemoryDoesNotAllocate(t *testing.T) {
	// Many distinct keys, each spilled once, allocate nothing: the memory
	// is a fixed table of SpillEntries, allocated with the Balancer, and a
	// full set forgets its least recently used pair.
	b := affine(t, 4, balancer.Options{})
	assertSpillsAllocateNothing(t, b, &inferlb.Request{Service: inferlb.ServiceLLM}, 2*balancer.SpillEntries)
}

// assertSpillsAllocateNothing picks each of runs new keys twice, the second
// pick spilling past the owner the first one loaded, and asserts that no
// pick allocated and that the second ones did spill.
func assertSpillsAllocateNothing(t *testing.T, b *balancer.Balancer, req *inferlb.Request, runs int) {
	t.Helper()
	spills := 0
	allocs := testing.AllocsPerRun(runs, func() {
		req.AffinityKey++
		h1, err := b.Pick(req)
		if err != nil {
			panic(err)
		}
		h2, err := b.Pick(req)
		if err != nil {
			panic(err)
		}
		if h2.ID() != h1.ID() {
			spills++
		}
		h2.Done(inferlb.Outcome{})
		h1.Done(inferlb.Outcome{})
	})
	assert.Zero(t, allocs)
	assert.Greater(t, spills, runs, "every second call spilled")
}

func TestSpilledKeyStaysWarmWhileItsOwnerIsAboveItsShare(t *testing.T) {
	const key = 4242
	run := func(t *testing.T, memory time.Duration, ownerCalls int, kv float64) (got, home, warm string) {
		clock := testutil.NewClock()
		b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), SpillMemory: memory})
		home = owner(t, b, key)
		warm, release := spillOnce(t, b, key)
		release()
		// A key owned by each endpoint, to hold calls exactly where wanted.
		keyOf := map[string]uint64{}
		for k := uint64(1); len(keyOf) < 4; k++ {
			if id := owner(t, b, k); keyOf[id] == 0 {
				keyOf[id] = k
			}
		}
		// 16 calls in flight: the owner holds ownerCalls, the warm endpoint
		// 3 and the other two the rest. With the next call the fair share
		// is 17/4 = 4.25 and the bound ceil(1.25 x 4.25) = 6, so an owner
		// at 5 is within bound but above its share (6 > ceil(4.25) = 5),
		// and at 4 it is not; the warm endpoint, at 4, is below its share.
		want := map[string]int{home: ownerCalls, warm: 3}
		rest, half := 16-ownerCalls-3, (16-ownerCalls-3)/2
		for id := range keyOf {
			if id != home && id != warm {
				want[id] = half
				half = rest - half
			}
		}
		var held []balancer.Pick
		for placed := true; placed; {
			placed = false
			for id, n := range want { // one round at a time: never past a bound
				if n == 0 {
					continue
				}
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: keyOf[id]})
				require.NoError(t, err)
				require.Equal(t, id, p.ID(), "a call placed on its key's owner")
				held = append(held, p)
				want[id]--
				placed = true
			}
		}
		require.Len(t, held, 16)
		if kv > 0 { // every endpoint reports this KV-cache usage, no queue
			for id := range keyOf {
				smp := telemetry.Sample{Time: clock.Now()}
				smp.Set(telemetry.KVCacheUsage, kv)
				smp.Set(telemetry.Waiting, 0)
				b.Publish(id, smp)
			}
		}
		require.Equal(t, int64(ownerCalls), stat(t, b, home).InFlight)
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
		require.NoError(t, err)
		got = p.ID()
		p.Done(inferlb.Outcome{})
		for i := range held {
			held[i].Done(inferlb.Outcome{})
		}
		return got, home, warm
	}
	got, _, warm := run(t, 0, 5, 0)
	assert.Equal(t, warm, got, "an owner above its share leaves the key where it is cached")
	got, _, warm = run(t, 0, 5, 0.97)
	assert.Equal(t, warm, got, "also when every cache is nearly full (saturation)")
	got, home, _ := run(t, 0, 4, 0)
	assert.Equal(t, home, got, "an owner at its share takes its key back")
	got, home, _ = run(t, -1, 5, 0)
	assert.Equal(t, home, got, "without spill memory the key goes home while within bound")
}

// decodeAt ends a streamed generation of 100 tokens at the given time per
// output token, so the endpoint learns that decode speed.
func decodeAt(p balancer.Pick, tpot time.Duration) {
	ttft := 50 * time.Millisecond
	p.Done(inferlb.Outcome{TTFT: ttft, OutputTokens: 100, Latency: ttft + 99*tpot})
}

// An owner that decodes 4x slower than its neighbours keeps only about
// (1.5/4)^2 of its keys (always the same ones) and hands the rest to the next
// endpoint in their order; owners of normal speed keep theirs, and so does
// a slow owner under AffinityStrict.
func TestSlowOwnerYieldsKeysByDecodeSpeed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     balancer.AffinityMode
		slowTPOT time.Duration
		keep     float64 // expected fraction of the slow owner's keys it keeps
	}{
		{"4x slower", balancer.AffinityPrefer, 40 * time.Millisecond, (1.5 / 4) * (1.5 / 4)},
		{"2x slower", balancer.AffinityPrefer, 20 * time.Millisecond, (1.5 / 2) * (1.5 / 2)},
		{"within tolerance", balancer.AffinityPrefer, 14 * time.Millisecond, 1},
		{"strict", balancer.AffinityStrict, 40 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := affine(t, 6, balancer.Options{Affinity: tc.mode, Rand: testutil.NewRand(4), SlowStartWindow: -1})
			const keys = 3000
			owners := make([]string, keys)
			for k := range owners {
				owners[k] = owner(t, b, uint64(k)*0x9e3779b97f4a7c15|1)
			}
			slow := owners[0]
			// Every endpoint learns its speed from one streamed call.
			for _, ep := range endpoints(6) {
				for {
					p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
					require.NoError(t, err)
					if p.ID() != ep.Addr {
						p.Done(inferlb.Outcome{Err: context.Canceled})
						continue
					}
					if ep.Addr == slow {
						decodeAt(p, tc.slowTPOT)
					} else {
						decodeAt(p, 10*time.Millisecond)
					}
					break
				}
			}
			var slowKeys, kept, fastMoved int
			for k := range owners {
				key := uint64(k)*0x9e3779b97f4a7c15 | 1
				got := owner(t, b, key)
				require.Equal(t, got, owner(t, b, key), "key %x moved between two picks", key)
				if owners[k] == slow {
					slowKeys++
					if got == slow {
						kept++
					}
				} else if got != owners[k] {
					fastMoved++
				}
			}
			require.Greater(t, slowKeys, 200)
			assert.InDelta(t, tc.keep, float64(kept)/float64(slowKeys), 0.05, "kept %d of %d", kept, slowKeys)
			assert.Zero(t, fastMoved, "keys of owners of normal speed moved")
		})
	}
}

// The affinity bound shares the group's load among the members that can
// take calls. With half the fleet not ready and the other half evenly
// loaded, an owner at the mean of the ready fleet is within bound and keeps
// its key; counting the unready members' weight made it "over" and sent
// half its key's calls elsewhere.
func TestBoundIsSharedAmongUsableMembers(t *testing.T) {
	const key = 0x1234567890abcdef
	b := affine(t, 4, balancer.Options{Rand: testutil.NewRand(7), Clock: testutil.NewClock()})
	home := owner(t, b, key)
	ready := []string{home}
	for _, e := range endpoints(4) {
		if id := e.Key(); id != home && len(ready) < 2 {
			ready = append(ready, id)
		} else if id != home {
			require.True(t, b.SetReady(id, false))
		}
	}
	var held []balancer.Pick // 10 calls on each ready endpoint: a balanced load
	for _, id := range ready {
		s, _ := b.Serial(id)
		for range 10 {
			p, err := b.PickAt(&inferlb.Request{}, s)
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}, 200)
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	assert.Equal(t, map[string]int{home: 200}, got, "the owner is at the mean of the ready fleet")
}

// Independent callers each see only their own calls. When every server
// reports its queue, an owner busy with other callers' calls sheds the key
// although this caller has nothing on it, and takes it back once the
// servers report the calls gone.
func TestBoundCountsOtherCallersCalls(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(21)})
	const key = 79
	home := owner(t, b, key)
	report := func(homeRunning float64, skip string) {
		for _, e := range endpoints(4) {
			if e.Key() == skip {
				continue
			}
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, 2)
			s.Set(telemetry.Waiting, 0)
			if e.Key() == home {
				s.Set(telemetry.Running, homeRunning)
				s.Set(telemetry.Waiting, homeRunning/10)
			}
			b.Publish(e.Key(), s)
		}
	}
	// 33 calls of others on the owner, 2 on each peer: a fair share of
	// about 10, far past any bound.
	report(30, "")
	got := spreadKey(t, b, key, 50)
	assert.Zero(t, got[home], "the owner is busy with other callers' calls: %v", got)

	// One server stops reporting: the other three still report most of
	// the fleet's load, the silent one is taken at their mean, and the
	// owner still sheds the key.
	var others []string
	for _, e := range endpoints(4) {
		if e.Key() != home {
			others = append(others, e.Key())
		}
	}
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	report(30, others[0])
	assert.Zero(t, spreadKey(t, b, key, 50)[home], "three of four readings show the owner busy")

	// Two of the four silent: half the fleet's readings say too little of
	// the rest, so the bound counts this caller's calls alone, and the
	// idle-looking owner takes its key.
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	for _, e := range endpoints(4) {
		if e.Key() == home || e.Key() == others[2] {
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, 2)
			s.Set(telemetry.Waiting, 0)
			if e.Key() == home {
				s.Set(telemetry.Running, 30)
				s.Set(telemetry.Waiting, 3)
			}
			b.Publish(e.Key(), s)
		}
	}
	assert.Equal(t, map[string]int{home: 50}, spreadKey(t, b, key, 50))

	// Every server reports again, the owner's other calls gone.
	report(0, "")
	clock.Advance(time.Second)
	assert.Equal(t, map[string]int{home: 50}, spreadKey(t, b, key, 50))
	report(30, "")
	clock.Advance(time.Second)
	assert.Zero(t, spreadKey(t, b, key, 50)[home], "a new report shows within a second")
}

// One member whose telemetry never arrives (its /metrics scrape fails)
// must not throw away the others' readings: taken at the reporters' mean,
// it leaves an owner that reports no more than its fair share its key,
// although this caller's own calls all happen to be on the owner. Counted
// by this caller's calls alone, as the bound did for the whole group while
// any member lacked a reading, the owner was far past its bound, and each
// of several independent callers spilled its keys at its own moments (in
// the fleet simulator's partial-telemetry scenario, p99 TTFT 0.321s against
// 0.154s with every replica scraped). A member listed less than a
// telemetry max-age ago may just not have been scraped yet: until then the
// bound counts this caller's calls, as before.
func TestBoundEstimatesAMemberWithoutAReading(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(24)})
	const key, calls = 82, 12
	home := owner(t, b, key)
	serial, ok := b.Serial(home)
	require.True(t, ok)
	var held []balancer.Pick
	for range calls {
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
		require.NoError(t, err)
		held = append(held, p)
	}
	defer func() {
		for i := range held {
			held[i].Done(inferlb.Outcome{})
		}
	}()
	var silent string
	for _, e := range endpoints(4) {
		if e.Key() != home {
			silent = e.Key()
			break
		}
	}
	report := func() {
		for _, e := range endpoints(4) {
			if e.Key() == silent {
				continue
			}
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, calls) // the owner's are this caller's; the others', other callers'
			s.Set(telemetry.Waiting, 0)
			b.Publish(e.Key(), s)
		}
	}
	report()
	got := spreadKey(t, b, key, 10)
	assert.Zero(t, got[home], "the silent member may not have been scraped yet: this caller's calls count: %v", got)

	clock.Advance(balancer.DefaultTelemetryMaxAge)
	report()
	assert.Equal(t, map[string]int{home: 10}, spreadKey(t, b, key, 10), "the owner reports the reporters' mean load")
}

// Servers report what they saw at the last scrape; this caller's calls
// since then count even before a report shows them, so a burst of one key
// between two scrapes still meets the bound.
func TestBoundCountsOwnCallsTheServersHaveNotReported(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(22)})
	const key = 80
	home := owner(t, b, key)
	for _, e := range endpoints(4) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 0)
		s.Set(telemetry.Waiting, 0)
		b.Publish(e.Key(), s)
	}
	// As in TestUnqueuedOwnerKeepsItsKeysUpToTheHardCap: 40 held calls,
	// an unqueued owner keeps the key up to ceil(1.5 x 40/4) = 16.
	got := ownerTakes(t, b, key, home, 40)
	assert.Greater(t, got, int64(10))
	assert.LessOrEqual(t, got, int64(16))
}

// A report lags by up to a scrape: calls of this caller's that ended since
// it are not load any more, so a lone caller whose own burst the servers
// reported does not keep spilling keys until the next scrape.
func TestBoundDiscountsOwnCallsEndedSinceTheReport(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(23)})
	const key = 81
	home := owner(t, b, key)
	serial, ok := b.Serial(home)
	require.True(t, ok)
	var held []balancer.Pick
	for range 30 {
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
		require.NoError(t, err)
		held = append(held, p)
	}
	for _, e := range endpoints(4) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 0)
		s.Set(telemetry.Waiting, 0)
		if e.Key() == home {
			s.Set(telemetry.Running, 30) // the 30 calls held above
		}
		b.Publish(e.Key(), s)
	}
	got := spreadKey(t, b, key, 10)
	assert.Zero(t, got[home], "30 calls on the owner, none elsewhere: past the bound")
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	clock.Advance(time.Second)
	assert.Equal(t, map[string]int{home: 10}, spreadKey(t, b, key, 10), "the reported calls have ended")
}

// A server reporting an absurd load (a broken exporter, a counter read as a
// gauge, a hostile server) must not switch the bound off for the whole
// fleet: its count is not a load, and the bound counts as if no report
// were complete.
func TestBoundIgnoresAnImplausibleReportedLoad(t *testing.T) {
	const key, calls = 0x1234567890abcdef, 12
	for _, absurd := range []float64{1e12, 1e300} {
		clock := testutil.NewClock()
		b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(33)})
		home := owner(t, b, key)
		for i, e := range endpoints(4) {
			s := telemetry.Sample{Time: clock.Now()}
			s.Set(telemetry.Running, 0)
			s.Set(telemetry.Waiting, 0)
			if e.Key() != home && i < 2 {
				s.Set(telemetry.Running, absurd)
			}
			b.Publish(e.Key(), s)
		}
		got := ownerTakes(t, b, key, home, calls)
		assert.Less(t, got, int64(calls), "running %g: the hot key spreads past its bound", absurd)
	}
}
