package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

func endpoints(n int) []inferlb.Endpoint {
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)}
	}
	return eps
}

func newBalancer(t testing.TB, n int, opts balancer.Options) *balancer.Balancer {
	t.Helper()
	b := balancer.New(opts)
	require.NoError(t, b.Update(endpoints(n)))
	return b
}

// maxLoad routes n requests into n equal endpoints through the real
// Balancer, holding every call (in-flight is the load), and returns the
// largest in-flight count.
//
// Affinity is off: the requests carry no affinity key, so the picks are the
// same with it on (the same pick sequence for seeds 0-4, either scorer), but
// with it on every Update places the 100,000 endpoints on a ring (10 million
// points, sorted): a third of the test's CPU time, and over 40% under the
// race detector.
func maxLoad(t *testing.T, n int, seed uint64, scorer scoring.Scorer) int {
	opts := balancer.Options{Rand: rand.NewPCG(seed, seed+1), Clock: testutil.NewClock(), Affinity: balancer.AffinityOff}
	if scorer != nil {
		opts.Scorers = map[inferlb.Service]scoring.Scorer{inferlb.ServiceUnknown: scorer}
	}
	b := newBalancer(t, n, opts)
	counts := map[string]int{}
	req := &inferlb.Request{}
	most := 0
	for range n {
		p, err := b.Pick(req)
		require.NoError(t, err)
		counts[p.ID()]++
		most = max(most, counts[p.ID()])
	}
	return most
}

// constant makes every endpoint cost the same, so the pick is a fair coin
// between two random candidates: a single random choice.
type constant struct{}

func (constant) Cost(*inferlb.Request, scoring.State) float64 { return 1 }

// TestTwoChoicesMaxLoad checks the theory P2C rests on (Azar et al. 1999):
// n balls into n bins with two choices give a max load of
// ln ln n / ln 2 + O(1) (about 3.3 + O(1) for n = 1e5), against about 7.7
// for one random choice.
func TestTwoChoicesMaxLoad(t *testing.T) {
	t.Parallel()
	const n = 100_000
	seeds := 5
	if testutil.Race {
		// One goroutine picks, so the race detector has nothing to check
		// here; it makes each run ~10x slower, and on a loaded machine this
		// test alone took up to 400 s of the package's 10-minute limit. The
		// seeds are fixed, so one seed's loads are the same on every run,
		// and the pass without -race (README) runs all five.
		seeds = 1
	}
	var p2c, single float64
	for seed := range uint64(seeds) {
		one, many := maxLoad(t, n, seed, nil), maxLoad(t, n, seed, constant{})
		t.Logf("seed %d: max load P2C %d, single choice %d", seed, one, many)
		p2c += float64(one)
		single += float64(many)
	}
	p2c /= float64(seeds)
	single /= float64(seeds)
	t.Logf("n=%d: mean max load P2C %.1f, single choice %.1f", n, p2c, single)
	assert.LessOrEqual(t, p2c, 4.0, "P2C max load")
	assert.GreaterOrEqual(t, single, 6.0, "single random choice should be far worse")
}

func TestSlowEndpointGetsLessEmbeddingTraffic(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	slow := endpoints(4)[3].Addr
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	counts := map[string]int{}
	// A closed loop with 8 calls outstanding: each step finishes the oldest
	// call with its endpoint's latency and starts a new one.
	var window []balancer.Pick
	for i := range 4000 {
		p, err := b.Pick(req)
		require.NoError(t, err)
		if i >= 400 { // after warm-up
			counts[p.ID()]++
		}
		window = append(window, p)
		if len(window) == 8 {
			lat := 10 * time.Millisecond
			if window[0].ID() == slow {
				lat = 30 * time.Millisecond
			}
			clock.Advance(2 * time.Millisecond)
			window[0].Done(inferlb.Outcome{Latency: lat})
			window = window[1:]
		}
	}
	fair := 3600 / 4
	t.Logf("shares: %v", counts)
	assert.Less(t, counts[slow], fair/2, "the 3x slower endpoint should get well under a fair share")
	for _, ep := range endpoints(3) {
		assert.Greater(t, counts[ep.Addr], fair, "fast endpoints absorb the slow one's share")
	}
}

func TestLoadedEndpointGetsLessLLMTraffic(t *testing.T) {
	// Load one endpoint while it is alone, then add its peers: its in-flight
	// count survives the membership update.
	b := newBalancer(t, 1, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(2), SlowStartWindow: -1})
	loaded := endpoints(4)[0].Addr
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 500, MaxOutputTokens: 200}
	var held []balancer.Pick
	for range 6 {
		p, err := b.Pick(req)
		require.NoError(t, err)
		held = append(held, p)
	}
	require.NoError(t, b.Update(endpoints(4)))
	counts := map[string]int{}
	for range 3000 {
		p, err := b.Pick(req)
		require.NoError(t, err)
		counts[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	t.Logf("shares: %v", counts)
	assert.Less(t, counts[loaded], 3000/4/10, "an endpoint with 6 calls in flight should get little new traffic")
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
}

// pickDoneAllocs is the allocations of one Pick of req and its Done.
func pickDoneAllocs(b *balancer.Balancer, req *inferlb.Request) float64 {
	return testing.AllocsPerRun(1000, func() {
		p, err := b.Pick(req)
		if err != nil {
			panic(err)
		}
		p.Done(inferlb.Outcome{Latency: time.Millisecond})
	})
}

func TestPickAndDoneDoNotAllocate(t *testing.T) {
	for _, svc := range []inferlb.Service{inferlb.ServiceUnknown, inferlb.ServiceLLM, inferlb.ServiceEmbedding, inferlb.ServiceRerank} {
		b := newBalancer(t, 64, balancer.Options{})
		assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: svc, PromptTokens: 100}), "service %v", svc)
	}
}

func TestPickSamplesTwoDistinctEndpoints(t *testing.T) {
	// Both draws land on endpoint 2; the second must be redrawn, and the
	// lower-cost one of the distinct pair wins.
	const n = 4
	seq := []uint64{testutil.Index(2, n)}
	for range 8 {
		seq = append(seq, testutil.Index(2, n)) // second candidate keeps hitting 2
	}
	seq = append(seq, 1) // the fallback scan starts at index 1
	cost := costByAddr{endpoints(n)[2].Addr: 5, endpoints(n)[1].Addr: 1}
	b := newBalancer(t, n, balancer.Options{
		Rand:    testutil.NewScript(seq...),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceUnknown: cost},
	})
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	assert.Equal(t, endpoints(n)[1].Addr, p.ID())
}

// costByAddr scores by a fixed table keyed by endpoint address.
type costByAddr map[string]float64

func (c costByAddr) Cost(_ *inferlb.Request, s scoring.State) float64 {
	return c[s.Endpoint.Key()]
}

func TestDoneOnceAndReleasesLoad(t *testing.T) {
	b := newBalancer(t, 1, balancer.Options{})
	req := &inferlb.Request{PromptTokens: 10, MaxOutputTokens: 5}
	p, err := b.Pick(req)
	require.NoError(t, err)
	st := b.Stats()[0]
	assert.EqualValues(t, 1, st.InFlight)
	assert.EqualValues(t, 15, st.InFlightTokens)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { p.Done(inferlb.Outcome{Err: errors.New("boom")}) })
	}
	wg.Wait()
	st = b.Stats()[0]
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.InFlightTokens)
	assert.EqualValues(t, 1, st.Failures, "eight Done calls record one outcome")
}

func TestCanceledCountsAsNeither(t *testing.T) {
	b := newBalancer(t, 1, balancer.Options{})
	p, _ := b.Pick(&inferlb.Request{})
	p.Done(inferlb.Outcome{Err: fmt.Errorf("client gave up: %w", context.Canceled)})
	st := b.Stats()[0]
	assert.Zero(t, st.Failures)
	assert.Zero(t, st.Successes)
	assert.Zero(t, st.ErrorRate)
}

func TestRetryBudget(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, RetryRatio: 0.2, RetryFloor: 1})
	// A quiet client still gets the floor: one retry per second, with ten
	// seconds of it banked.
	banked := 0
	for range 20 {
		if b.AllowRetry() {
			banked++
		}
	}
	assert.Equal(t, 10, banked, "the floor's bank")
	clock.Advance(time.Second)
	assert.True(t, b.AllowRetry())
	assert.False(t, b.AllowRetry())
	// 100 requests earn 20 retries.
	for range 100 {
		p, _ := b.Pick(&inferlb.Request{})
		p.Done(inferlb.Outcome{})
	}
	allowed := 0
	for range 50 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.Equal(t, 20, allowed)
	assert.Equal(t, balancer.RetryStats{Allowed: 31, Denied: 41}, b.RetryStats())
}

// TestPickRetrySpendsOnlyWhenItHasSomewhereToGo: a failover pick that
// finds no other endpoint leaves the budget alone; one that finds one
// spends a retry, and is refused once the budget is spent.
func TestPickRetrySpendsOnlyWhenItHasSomewhereToGo(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, RetryRatio: -1, RetryFloor: 1})
	only := b.Stats()[0].ID
	for range 3 {
		_, err := b.PickRetry(&inferlb.Request{}, only)
		require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	}
	assert.Equal(t, balancer.RetryStats{}, b.RetryStats())

	require.NoError(t, b.Update(endpoints(2)))
	for range 10 { // the floor's bank: ten seconds at one a second
		p, err := b.PickRetry(&inferlb.Request{}, only)
		require.NoError(t, err)
		assert.NotEqual(t, only, p.ID())
		p.Done(inferlb.Outcome{})
	}
	_, err := b.PickRetry(&inferlb.Request{}, only)
	require.ErrorIs(t, err, balancer.ErrNoRetryBudget, "the floor's bank is spent")
	assert.Equal(t, balancer.RetryStats{Allowed: 10, Denied: 1}, b.RetryStats())
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight, s.ID)
	}
}

func TestOptionsValidate(t *testing.T) {
	type testCase struct {
		opts balancer.Options
		want string
	}
	cases := []testCase{
		{balancer.Options{}, ""},
		{balancer.Options{ErrorAlpha: 1.5}, "ErrorAlpha = 1.5: must be in [0, 1]"},
		{balancer.Options{PanicThreshold: 2}, "PanicThreshold = 2: must be at most 1"},
		{balancer.Options{PanicThreshold: -1}, ""},
		{balancer.Options{SlowStartMinWeight: -0.1}, "SlowStartMinWeight"},
		{balancer.Options{SlowStartAggression: -1}, "SlowStartAggression"},
		{balancer.Options{LatencyDecay: -time.Second}, "LatencyDecay"},
		{balancer.Options{RetryRatio: 3}, "RetryRatio"},
		{balancer.Options{StickyEntries: balancer.MaxStickyEntries}, ""},
		{balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: &scoring.LLM{KVKnee: 85}}}, "balancer.Options.Scorers[llm]: scoring.LLM.KVKnee = 85: must be in [0, 1]"},
		{balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: nil}}, "Scorers[llm]"},
		// A nil *scoring.LLM is a Scorer that is not nil: an error, not a
		// nil dereference inside Validate.
		{balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: (*scoring.LLM)(nil)}}, "Scorers[llm]: scoring.LLM is nil"},
		{balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{9: &scoring.LLM{}}}, "unknown service"},
		// A cap below the value it caps, both set: one of them is a typo.
		{balancer.Options{DefaultCooldown: time.Minute, MaxCooldown: 10 * time.Second}, "MaxCooldown = 10s: must be at least DefaultCooldown (1m0s)"},
		{balancer.Options{DefaultCooldown: time.Minute, MaxCooldown: time.Minute}, ""},
		{balancer.Options{EjectionTime: time.Minute, MaxEjectionTime: 10 * time.Second}, "MaxEjectionTime = 10s: must be at least EjectionTime (1m0s)"},
		{balancer.Options{EjectionTime: time.Minute}, ""},
	}
	// Counts past 2^31-1, where an int holds them (64-bit platforms).
	if n, ok := wideInt(1 << 40); ok {
		cases = append(cases, testCase{balancer.Options{StickyEntries: n}, "StickyEntries = 1099511627776: must be in [0, 16777216]"})
	}
	// gobreaker counts in uint32 and the probe budget is an int32: larger
	// values would wrap (a breaker tripping at once, or never probing
	// again).
	if n, ok := wideInt(1 << 32); ok {
		cases = append(cases, testCase{balancer.Options{BreakerFailures: n}, "BreakerFailures"})
	}
	if n, ok := wideInt(1 << 31); ok {
		cases = append(cases, testCase{balancer.Options{BreakerProbes: n}, "BreakerProbes"})
	}
	for _, tc := range cases {
		err := tc.opts.Validate()
		if tc.want == "" {
			assert.NoError(t, err)
			continue
		}
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "inferlb: balancer.Options.")
		}
	}
	assert.Panics(t, func() { balancer.New(balancer.Options{ErrorAlpha: -1}) })

	// A Scorer's own Validate error stays reachable through the one that
	// names the service: scoring's sentinel, and a custom Scorer's error.
	err := (&balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceEmbedding: &scoring.LLM{KVKnee: 85}}}).Validate()
	require.ErrorIs(t, err, scoring.ErrInvalid)
	assert.Contains(t, err.Error(), "balancer.Options.Scorers[embedding]: scoring.LLM.KVKnee")
	err = (&balancer.Options{Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceRerank: invalidScorer{}}}).Validate()
	require.ErrorIs(t, err, errInvalidScorer)
	assert.Equal(t, "inferlb: balancer.Options.Scorers[rerank]: my scorer: Weight must be positive", err.Error())
}

var errInvalidScorer = errors.New("inferlb: my scorer: Weight must be positive")

// invalidScorer is a custom Scorer whose Validate always fails.
type invalidScorer struct{}

func (invalidScorer) Cost(*inferlb.Request, scoring.State) float64 { return 0 }
func (invalidScorer) Validate() error                              { return errInvalidScorer }

// A floor so small its period does not fit in int64 allows (almost) no
// retries; converted unbounded it wrapped into allowing every one.
func TestTinyRetryFloorAllowsAlmostNone(t *testing.T) {
	b := balancer.New(balancer.Options{RetryRatio: -1, RetryFloor: 1e-10, Clock: testutil.NewClock()})
	allowed := 0
	for range 1000 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.LessOrEqual(t, allowed, 1)
}

// Weights are relative and bounded: two endpoints of Weight 1e308 would sum
// to +Inf, every share would be 0 and an idle fleet's keys would scatter.
func TestHugeWeightsAreBounded(t *testing.T) {
	b := balancer.New(balancer.Options{AffinitySeed: seed, MinKeyReuse: -1, Rand: testutil.NewRand(3)})
	err := b.Update([]inferlb.Endpoint{{Addr: "a:1", Weight: 1e308}, {Addr: "b:1", Weight: 1e308}})
	require.ErrorContains(t, err, "above MaxWeight")
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 0x1234567890abcdef}, 200)
	assert.Len(t, got, 1, "an idle fleet sends a key to its owner every time: %v", got)
}

func TestRetryBudgetDoesNotAllocate(t *testing.T) {
	b := newBalancer(t, 2, balancer.Options{})
	assert.Zero(t, testing.AllocsPerRun(100, func() { b.AllowRetry() }))
}

func TestStatsCountPicksByHowTheyEnded(t *testing.T) {
	b := newBalancer(t, 1, balancer.Options{})
	pick := func() balancer.Pick {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		return p
	}
	for _, o := range []inferlb.Outcome{{}, {}, {Err: errors.New("boom")}, {Overloaded: true}, {Err: context.Canceled}} {
		p := pick()
		p.Done(o)
		p.Done(o) // a second Done counts nothing
	}
	held := pick()
	s := b.Stats()[0]
	assert.EqualValues(t, 6, s.Picks, "five ended and one in flight")
	assert.EqualValues(t, 2, s.Successes)
	assert.EqualValues(t, 1, s.Failures)
	assert.EqualValues(t, 1, s.Overloads)
	assert.EqualValues(t, 1, s.InFlight)
	held.Done(inferlb.Outcome{})
	assert.EqualValues(t, 6, b.Stats()[0].Picks)
}

func TestDoneMeasuresLatencyFromPickedAt(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock})
	at := clock.Now()
	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
	require.NoError(t, err)
	assert.True(t, p.PickedAt().Equal(at), "the balancer's clock at the pick")
	clock.Advance(40 * time.Millisecond)
	p.Done(inferlb.Outcome{})
	assert.Equal(t, 40*time.Millisecond, b.Stats()[0].Latency, "no Outcome.Latency: measured from PickedAt")
}

// Stats().Picks is exported as a Prometheus counter: it must never go down
// while calls start and end concurrently, and it must be exact once they stop.
func TestStatsPicksNeverDecrease(t *testing.T) {
	b := newBalancer(t, 1, balancer.Options{})
	const workers, calls = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				p, err := b.Pick(&inferlb.Request{})
				if err != nil {
					t.Error(err)
					return
				}
				if (i+w)%3 == 0 {
					p.Done(inferlb.Outcome{Err: errors.New("boom")})
				} else {
					p.Done(inferlb.Outcome{})
				}
			}
		})
	}
	stop := make(chan struct{})
	var reader sync.WaitGroup
	reader.Go(func() {
		last := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := b.Stats()[0].Picks
			if n < last {
				t.Errorf("Picks went down: %d after %d", n, last)
				return
			}
			last = n
		}
	})
	wg.Wait()
	close(stop)
	reader.Wait()
	assert.EqualValues(t, workers*calls, b.Stats()[0].Picks)
}

// TestEmbeddingNewEndpointIsProbed: an embedding endpoint with no latency
// history must get a call even when its peer answers faster than the
// latency prior. Otherwise a replica added to a fleet of fast embedders (or
// the second of two, behind a caller that sends one call at a time) would
// never be tried: its prior (50 ms) beats nothing, and it never gets the
// measurement that would replace the prior.
func TestEmbeddingNewEndpointIsProbed(t *testing.T) {
	clk := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clk, Rand: testutil.NewRand(1), SlowStartWindow: -1})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "old", Addr: "10.0.0.1:8000"}}))
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	for range 20 { // the old replica has a history of 5 ms calls
		p, err := b.Pick(req)
		require.NoError(t, err)
		clk.Advance(5 * time.Millisecond)
		p.Done(inferlb.Outcome{})
	}
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "old", Addr: "10.0.0.1:8000"}, {ID: "new", Addr: "10.0.0.2:8000"}}))
	counts := map[string]int{}
	for range 40 { // one call at a time
		p, err := b.Pick(req)
		require.NoError(t, err)
		counts[p.ID()]++
		clk.Advance(5 * time.Millisecond)
		p.Done(inferlb.Outcome{})
	}
	assert.Greater(t, counts["new"], 5, "the new replica is probed, then shares by its measured latency: %v", counts)
}

// nanScorer prices one endpoint at NaN (a custom scorer's 0/0) and every
// other at 1; empty, it prices every endpoint at NaN.
type nanScorer string

func (n nanScorer) Cost(_ *inferlb.Request, s scoring.State) float64 {
	if n == "" || s.Endpoint.Addr == string(n) {
		return math.NaN()
	}
	return 1
}

// A NaN cost compares false both ways; read as it came, the endpoint with
// it won every comparison it was the first candidate of (half of them).
// It loses to a priced endpoint, and two NaNs tie.
func TestNaNCostLoses(t *testing.T) {
	eps := endpoints(2)
	b := newBalancer(t, 2, balancer.Options{Rand: testutil.NewRand(3), Clock: testutil.NewClock(),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceUnknown: nanScorer(eps[0].Addr)}})
	counts := map[string]int{}
	for range 400 {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		counts[p.Endpoint().Addr]++
		p.Done(inferlb.Outcome{})
	}
	assert.Zero(t, counts[eps[0].Addr], "picks of the endpoint priced NaN")

	both := newBalancer(t, 2, balancer.Options{Rand: testutil.NewRand(3), Clock: testutil.NewClock(),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceUnknown: nanScorer("")}})
	clear(counts)
	for range 400 {
		p, err := both.Pick(&inferlb.Request{})
		require.NoError(t, err)
		counts[p.Endpoint().Addr]++
		p.Done(inferlb.Outcome{})
	}
	assert.InDelta(t, 200, counts[eps[0].Addr], 50, "two NaNs tie: %v", counts)
}

// Closed says whether Close has run, for adapters that must fail calls
// which would otherwise wait for endpoints a closed Balancer never gives.
func TestClosed(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	assert.False(t, b.Closed())
	b.Close()
	assert.True(t, b.Closed())
	b.Close()
	assert.True(t, b.Closed(), "Close is idempotent")
}
