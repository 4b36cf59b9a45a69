package balancer_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// spread picks n times (finishing each call at once) and counts picks per ID.
func spread(t *testing.T, b *balancer.Balancer, req *inferlb.Request, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		p, err := b.Pick(req)
		require.NoError(t, err)
		counts[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	return counts
}

func stat(t *testing.T, b *balancer.Balancer, id string) balancer.EndpointStats {
	t.Helper()
	for _, s := range b.Stats() {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no endpoint %q", id)
	return balancer.EndpointStats{}
}

func TestOverloadCoolsDownForRetryAfter(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3)})
	hot := endpoints(4)[0].Addr
	// Find a pick on the hot endpoint and answer 429 with Retry-After: 5s.
	for {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		if p.ID() == hot {
			p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: 5 * time.Second})
			break
		}
		p.Done(inferlb.Outcome{})
	}
	assert.WithinDuration(t, testutil.Epoch.Add(5*time.Second), stat(t, b, hot).ExcludedUntil, 0)
	assert.Zero(t, spread(t, b, &inferlb.Request{}, 400)[hot], "cooling down")
	assert.Zero(t, stat(t, b, hot).Failures, "overload is not a failure")

	clock.Advance(5 * time.Second)
	assert.Positive(t, spread(t, b, &inferlb.Request{}, 400)[hot], "back after Retry-After")
}

func TestCooldownIsCapped(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, MaxCooldown: 10 * time.Second, PanicThreshold: -1})
	p, _ := b.Pick(&inferlb.Request{})
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Hour})
	_, err := b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "the only endpoint is cooling down and panic routing is off")
	clock.Advance(10 * time.Second)
	_, err = b.Pick(&inferlb.Request{})
	assert.NoError(t, err, "a Retry-After of an hour is capped at MaxCooldown")
}

// A DefaultCooldown above the default MaxCooldown (30s), with MaxCooldown
// unset, is served whole, as an EjectionTime above the default
// MaxEjectionTime is: MaxCooldown caps the servers' hints, not the
// caller's own setting.
func TestLongDefaultCooldownIsServedWhole(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, DefaultCooldown: time.Minute, PanicThreshold: -1})
	p, _ := b.Pick(&inferlb.Request{})
	p.Done(inferlb.Outcome{Overloaded: true})
	clock.Advance(balancer.DefaultMaxCooldown)
	_, err := b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "still cooling down after the default MaxCooldown")
	clock.Advance(time.Minute - balancer.DefaultMaxCooldown)
	_, err = b.Pick(&inferlb.Request{})
	assert.NoError(t, err, "back after DefaultCooldown")
}

// exclude cools down the endpoints at the given indexes for a minute.
func exclude(t *testing.T, b *balancer.Balancer, n int, idx ...int) {
	t.Helper()
	want := map[string]bool{}
	for _, i := range idx {
		want[endpoints(n)[i].Addr] = true
	}
	for tries := 0; len(want) > 0; tries++ {
		require.Less(t, tries, 10_000)
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		if want[p.ID()] {
			delete(want, p.ID())
			p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
		} else {
			p.Done(inferlb.Outcome{})
		}
	}
}

func TestPanicRoutingSpreadsWhenTooFewAreGood(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(4)})
	// Two of four out: 50% are good, not below the 0.5 threshold.
	exclude(t, b, 4, 0, 1)
	counts := spread(t, b, &inferlb.Request{}, 1000)
	assert.Zero(t, counts[endpoints(4)[0].Addr]+counts[endpoints(4)[1].Addr])
	// Three of four out: 25% good < 50%, so traffic spreads over all four
	// instead of crushing the survivor.
	exclude(t, b, 4, 2)
	counts = spread(t, b, &inferlb.Request{}, 1000)
	for _, ep := range endpoints(4) {
		assert.Greater(t, counts[ep.Addr], 150, "panic routing uses %s", ep.Addr)
	}
	// Standing expires: panic ends without any new event.
	clock.Advance(time.Minute)
	counts = spread(t, b, &inferlb.Request{}, 1000)
	assert.Len(t, counts, 4)
}

func TestNotReadyIsNeverPicked(t *testing.T) {
	b := newBalancer(t, 3, balancer.Options{Rand: testutil.NewRand(5)})
	require.True(t, b.SetReady(endpoints(3)[0].Addr, false))
	require.True(t, b.SetReady(endpoints(3)[1].Addr, false))
	assert.False(t, b.SetReady("nope", false))
	counts := spread(t, b, &inferlb.Request{}, 200)
	assert.Equal(t, map[string]int{endpoints(3)[2].Addr: 200}, counts, "even in panic, not-ready endpoints are skipped")
	require.True(t, b.SetReady(endpoints(3)[2].Addr, false))
	_, err := b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
}

func TestSlowStartRampsNewEndpoint(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), SlowStartWindow: 60 * time.Second})
	require.NoError(t, b.Update(endpoints(4))) // endpoint 3 joins a warm balancer
	joiner := endpoints(4)[3].Addr
	assert.InDelta(t, 0.1, stat(t, b, joiner).RampFactor, 1e-9, "starts at SlowStartMinWeight")

	var shares []float64
	for range 7 {
		c := spread(t, b, &inferlb.Request{}, 4000)
		shares = append(shares, float64(c[joiner])/4000)
		clock.Advance(10 * time.Second)
	}
	t.Logf("joiner share every 10s: %.3f", shares)
	// Candidacy scales with the ramp factor (0.1 at first, linear to 1 at
	// 60s), so the share of an idle fleet grows from about 3% to 25%.
	assert.Less(t, shares[0], 0.06, "a fresh joiner gets a small share")
	assert.Greater(t, shares[0], 0.01, "but not none")
	for i := 1; i < len(shares); i++ {
		assert.Greater(t, shares[i], shares[i-1]-0.01, "share grows step by step (%d)", i)
	}
	assert.InDelta(t, 0.14, shares[3], 0.04, "about half way at half the window")
	assert.InDelta(t, 0.25, shares[6], 0.03, "full share after the window")
	assert.Equal(t, 1.0, stat(t, b, joiner).RampFactor)
}

// In a fleet of two, the joiner is the only endpoint a second candidate can
// be. Drawn until admitted, it was the second candidate of every pick, and
// an idle one won half of them from its first second: slow start did
// nothing where a replica's restart matters most. Its share must follow
// its ramp: about 0.1 / 1.1 of the calls at first, half at the end.
func TestSlowStartRampsTheSecondOfTwo(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), SlowStartWindow: 60 * time.Second})
	require.NoError(t, b.Update(endpoints(2)))
	joiner := endpoints(2)[1].Addr
	first := float64(spread(t, b, &inferlb.Request{}, 4000)[joiner]) / 4000
	clock.Advance(60 * time.Second)
	last := float64(spread(t, b, &inferlb.Request{}, 4000)[joiner]) / 4000
	t.Logf("joiner share: %.3f at first, %.3f after the window", first, last)
	assert.InDelta(t, 0.09, first, 0.04, "a fresh joiner of two takes about its ramp's share")
	assert.InDelta(t, 0.5, last, 0.05, "and half once ramped")
}

// Endpoints that ramp together (a warm membership switched to a new set)
// are still compared in pairs: each is admitted as a second candidate
// against the other at their equal factors, and the cheaper one wins.
func TestEndpointsRampingTogetherAreStillCompared(t *testing.T) {
	clock := testutil.NewClock()
	eps := endpoints(4)
	cost := costByAddr{eps[2].Addr: 5, eps[3].Addr: 1}
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(3), SlowStartWindow: 60 * time.Second,
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceUnknown: cost}})
	require.NoError(t, b.Update(eps[:2]))
	require.NoError(t, b.Update(eps[2:])) // both new, both ramping
	require.InDelta(t, 0.1, stat(t, b, eps[2].Addr).RampFactor, 1e-9)
	got := spread(t, b, &inferlb.Request{}, 1000)
	assert.Equal(t, 1000, got[eps[3].Addr], "the cheaper of the pair wins every pick: %v", got)
}

func TestInitialEndpointsDoNotSlowStart(t *testing.T) {
	b := newBalancer(t, 4, balancer.Options{})
	for _, s := range b.Stats() {
		assert.Equal(t, 1.0, s.RampFactor)
	}
}

func TestUpdateKeepsStateOfEndpointsThatStay(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock})
	var held []balancer.Pick
	for range 30 {
		p, _ := b.Pick(&inferlb.Request{PromptTokens: 10})
		held = append(held, p)
	}
	p, _ := b.Pick(&inferlb.Request{})
	p.Done(inferlb.Outcome{Err: errors.New("x")})
	before := map[string]balancer.EndpointStats{}
	for _, s := range b.Stats() {
		before[s.ID] = s
	}
	// Keep 0 and 1, drop 2, add a new one.
	eps := endpoints(4)
	require.NoError(t, b.Update([]inferlb.Endpoint{eps[1], eps[0], eps[3]}))
	for _, s := range b.Stats() {
		if s.ID == eps[3].Addr {
			assert.Zero(t, s.InFlight)
			continue
		}
		assert.Equal(t, before[s.ID].InFlight, s.InFlight, "in-flight of %s survives", s.ID)
		assert.Equal(t, before[s.ID].Failures, s.Failures)
	}
	// Calls on the removed endpoint still finish cleanly.
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight)
		assert.Zero(t, s.InFlightTokens)
	}
}

func TestUpdateReportsBadEntriesAndAppliesTheRest(t *testing.T) {
	b := balancer.New(balancer.Options{})
	err := b.Update([]inferlb.Endpoint{
		{Addr: "a:1"},
		{},
		{Addr: "a:1"},
		{Addr: "b:1", Weight: math.NaN()},
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "endpoint 1: ID and Addr are both empty")
	assert.Contains(t, err.Error(), `endpoint 2: duplicate ID "a:1" (endpoint 0's); skipped`, "the entry kept is named too")
	assert.Contains(t, err.Error(), `endpoint "b:1": Weight NaN`)
	stats := b.Stats()
	require.Len(t, stats, 2)
	assert.Equal(t, 1.0, stats[1].Weight)
}

func TestEmptyBalancer(t *testing.T) {
	b := balancer.New(balancer.Options{})
	_, err := b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	require.NoError(t, b.Update(nil))
	_, err = b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	var p balancer.Pick
	p.Done(inferlb.Outcome{}) // the zero Pick is inert
	assert.Empty(t, p.ID())
	// Every accessor of the zero Pick reads as no endpoint, without a
	// Balancer to dereference.
	assert.Equal(t, inferlb.Endpoint{}, p.Endpoint())
	own, ok := p.OwnEndpoint()
	assert.False(t, ok)
	assert.Equal(t, inferlb.Endpoint{}, own)
	assert.Zero(t, p.Serial(), "serials start at 1: 0 is no endpoint")
	assert.Zero(t, p.Elapsed())
	assert.Zero(t, p.Stamped())
}

func TestCapacityWeights(t *testing.T) {
	eps := []inferlb.Endpoint{{Addr: "w1"}, {Addr: "w2", Weight: 2}, {Addr: "w4", Weight: 4}}
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(7), Scorers: constantScorers()})
	require.NoError(t, b.Update(eps))
	// With equal costs the pick is a coin flip between two candidates sampled
	// by weight, so the bigger endpoint is chosen more often, in order.
	c := spread(t, b, &inferlb.Request{}, 20000)
	t.Logf("weighted shares: %v", c)
	assert.Less(t, c["w1"], c["w2"])
	assert.Less(t, c["w2"], c["w4"])

	// Under load (least-loaded default), in-flight per unit of capacity evens
	// out: hold calls and compare.
	b = balancer.New(balancer.Options{Rand: testutil.NewRand(8)})
	require.NoError(t, b.Update(eps))
	for range 700 {
		_, _ = b.Pick(&inferlb.Request{})
	}
	for _, s := range b.Stats() {
		assert.InDelta(t, 100, float64(s.InFlight)/s.Weight, 10, "%s holds %d", s.ID, s.InFlight)
	}
}

func constantScorers() map[inferlb.Service]scoringScorer {
	return map[inferlb.Service]scoringScorer{inferlb.ServiceUnknown: constant{}}
}

func TestModelSubsets(t *testing.T) {
	eps := []inferlb.Endpoint{
		{Addr: "llama-1", Labels: map[string]string{"model": "llama"}},
		{Addr: "llama-2", Labels: map[string]string{"model": "llama, llama-lora-sql"}},
		{Addr: "qwen-1", Labels: map[string]string{"model": "qwen"}},
		{Addr: "any-1"},
	}
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(9)})
	require.NoError(t, b.Update(eps))
	c := spread(t, b, &inferlb.Request{Model: "llama"}, 600)
	assert.Zero(t, c["qwen-1"])
	assert.Positive(t, c["llama-1"])
	assert.Positive(t, c["llama-2"])
	assert.Positive(t, c["any-1"], "unlabelled endpoints serve any model")

	c = spread(t, b, &inferlb.Request{Model: "llama-lora-sql"}, 300)
	assert.Equal(t, []string{"any-1", "llama-2"}, keys(c), "a LoRA adapter listed by one endpoint")
	c = spread(t, b, &inferlb.Request{Model: "mistral"}, 100)
	assert.Equal(t, []string{"any-1"}, keys(c), "unknown models go to unlabelled endpoints")
	c = spread(t, b, &inferlb.Request{}, 800)
	assert.Len(t, c, 4, "no model: the whole fleet")

	require.NoError(t, b.Update(eps[:3]))
	_, err := b.Pick(&inferlb.Request{Model: "mistral"})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

func TestReadyAgainRampsUp(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock})
	id := endpoints(4)[0].Addr
	// The transport connects for the first time at startup: no ramp.
	require.True(t, b.SetReady(id, false))
	require.True(t, b.SetReady(id, true))
	assert.Equal(t, 1.0, stat(t, b, id).RampFactor)
	// It drops and comes back: ramp from now.
	require.True(t, b.SetReady(id, false))
	clock.Advance(time.Minute)
	require.True(t, b.SetReady(id, true))
	assert.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, id).RampFactor, 1e-9)
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	assert.InDelta(t, 0.5, stat(t, b, id).RampFactor, 1e-9)
	assert.True(t, b.Now().Equal(clock.Now()))
}

// A MaxCooldown or MaxEjectionTime meant as "for ever" (the largest
// Duration) must hold the endpoint out, not wrap now + d to a time in the
// past: the hint of a server that says "come back never", or the third
// trip of a breaker whose exclusion doubles, kept it in rotation.
func TestForeverCooldownAndEjectionHold(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(4), PanicThreshold: -1,
		MaxCooldown: math.MaxInt64})
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	hot := p.ID()
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: math.MaxInt64})
	clock.Advance(24 * time.Hour)
	assert.Zero(t, spread(t, b, &inferlb.Request{}, 50)[hot], "cooled down for ever")

	// The exclusion doubles with each trip, from 2^59 ns (18 years): the
	// fourth (2^62) took now + d past 2^63, and the fifth's d itself.
	b = newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), PanicThreshold: -1,
		BreakerFailures: 1, EjectionTime: 1 << 59, MaxEjectionTime: math.MaxInt64})
	bad := endpoints(2)[0].Addr
	serial, ok := b.Serial(bad)
	require.True(t, ok)
	for trip := range 5 {
		p, err := b.PickAt(&inferlb.Request{}, serial) // a probe, once the last exclusion ended
		require.NoError(t, err)
		require.Equal(t, bad, p.ID(), "trip %d", trip+1)
		p.Done(inferlb.Outcome{Err: errDown})
		until := stat(t, b, bad).ExcludedUntil
		require.True(t, until.After(clock.Now().Add(time.Hour)), "trip %d: held out, until %v", trip+1, until)
		clock.Advance(until.Sub(clock.Now())) // the exclusion ends
	}
}

// A breaker that passes its probes and trips again at once (a flapping
// endpoint) is held out twice as long each time, as consecutive failed
// probes are; one that stayed in good standing for a while starts over.
func TestFlappingEndpointIsHeldOutLonger(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), PanicThreshold: -1,
		BreakerFailures: 1, BreakerProbes: 1, EjectionTime: 10 * time.Second, MaxEjectionTime: time.Hour})
	bad := endpoints(2)[0].Addr
	call, held := pinnedCalls(t, b, clock, bad)

	call(errDown)
	assert.Equal(t, 10*time.Second, held(), "first trip")
	for _, want := range []time.Duration{20 * time.Second, 40 * time.Second} {
		clock.Advance(held())
		call(nil) // the probe passes: recovered
		require.True(t, stat(t, b, bad).ExcludedUntil.IsZero())
		call(errDown) // and fails again at once
		assert.Equal(t, want, held(), "a trip right after a recovery")
	}
	clock.Advance(held())
	call(nil)
	clock.Advance(10 * time.Minute) // in good standing for a while
	call(errDown)
	assert.Equal(t, 10*time.Second, held(), "after ten good minutes it starts over")
}

// Panic routing sends calls to endpoints whose breakers are open, as a
// last resort; those calls are no half-open probes. Counted as probes,
// each failure re-opened the breaker, doubled the exclusion and raised an
// event, pick after pick, so the endpoints stayed out long after the panic.
func TestPanicCallsAreNoProbes(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(7), OnEvent: rec.record,
		BreakerFailures: 1, MaxEjectedFraction: 1, Scorers: constantScorers()})
	eps := endpoints(4)
	for _, e := range eps[:3] {
		p := pickOn(t, b, e.Addr)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventTripped, balancer.EventTripped}, rec.kinds())
	until := stat(t, b, eps[0].Addr).ExcludedUntil
	counts := map[string]int{}
	for range 200 { // one of four good: panic routing over all four
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		counts[p.ID()]++
		if p.ID() == eps[3].Addr {
			p.Done(inferlb.Outcome{})
		} else {
			p.Done(inferlb.Outcome{Err: errDown})
		}
	}
	require.Len(t, counts, 4, "panic routing")
	assert.Len(t, rec.kinds(), 3, "no event after the trips: %v", rec.kinds())
	assert.Equal(t, until, stat(t, b, eps[0].Addr).ExcludedUntil, "the exclusion stands as it was")
}

// pinnedCalls returns call, which sends one call to endpoint id (PickAt,
// whatever its standing) and ends it with err, and held, the time left on
// id's exclusion.
func pinnedCalls(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, id string) (call func(error), held func() time.Duration) {
	t.Helper()
	serial, ok := b.Serial(id)
	require.True(t, ok)
	call = func(err error) {
		t.Helper()
		p, perr := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, perr)
		require.Equal(t, id, p.ID())
		p.Done(inferlb.Outcome{Err: err})
	}
	held = func() time.Duration { return stat(t, b, id).ExcludedUntil.Sub(clock.Now()) }
	return call, held
}
