package balancer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// answerFunc says how an endpoint answers the n-th call of a run (from 0):
// after how long, and whether as a client error (Outcome.ClientError).
type answerFunc func(addr string, n int) (time.Duration, bool)

// driveAnswers sends rounds of perRound concurrent calls of svc to b's
// endpoints, ending each as answer says, in order of its latency on the
// fake clock, and returns the calls each endpoint drew.
func driveAnswers(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, svc inferlb.Service, first, rounds, perRound int, answer answerFunc) map[string]int {
	t.Helper()
	drew := map[string]int{}
	driveRounds(t, b, clock, first, rounds, perRound, answer,
		func(int) *inferlb.Request { return &inferlb.Request{Service: svc} },
		func(_ int, addr string) { drew[addr]++ })
	return drew
}

// driveRounds sends rounds of perRound concurrent calls to b, the n-th
// (counted from first) being req(n) and seen by saw with the endpoint it
// went to, and ends each as answer says, in order of its latency on the
// fake clock.
func driveRounds(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, first, rounds, perRound int, answer answerFunc, req func(n int) *inferlb.Request, saw func(n int, addr string)) {
	t.Helper()
	type out struct {
		p   balancer.Pick
		lat time.Duration
		ce  bool
	}
	n := first
	for range rounds {
		outs := make([]out, 0, perRound)
		for range perRound {
			p, err := b.Pick(req(n))
			require.NoError(t, err)
			addr := p.Endpoint().Addr
			saw(n, addr)
			lat, ce := answer(addr, n)
			n++
			outs = append(outs, out{p, lat, ce})
		}
		slices.SortStableFunc(outs, func(a, b out) int { return int(a.lat - b.lat) })
		var at time.Duration
		for _, o := range outs {
			clock.Advance(o.lat - at)
			at = o.lat
			o.p.Done(inferlb.Outcome{Latency: o.lat, ClientError: o.ce})
		}
	}
}

func threeEndpoints(t *testing.T, seed uint64) (*balancer.Balancer, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(seed)})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "bad"}}))
	return b, clock
}

// A replica with a wrong API key (or without the route) answers every
// call 401 (or 404) in a millisecond, and keeps nothing in flight. Counted
// as successes, those answers made it the fastest and least loaded
// endpoint there is: it drew 1,998 of 2,000 embedding calls. Reported as
// client errors, they neither feed its latency nor count for it: its
// share of client-error answers, far above its peers', passes it over.
// It is still tried now and then, as its share decays with time (so a
// replica whose key is fixed returns), and once it answers well again it
// is back to its share of the calls.
func TestFastClientErrorsDrawNoTraffic(t *testing.T) {
	for _, svc := range []inferlb.Service{inferlb.ServiceEmbedding, inferlb.ServiceUnknown, inferlb.ServiceLLM} {
		t.Run(svc.String(), func(t *testing.T) {
			b, clock := threeEndpoints(t, 7)
			broken := true
			answer := func(addr string, _ int) (time.Duration, bool) {
				if addr == "bad" && broken {
					return time.Millisecond, true
				}
				return 20 * time.Millisecond, false
			}
			const rounds, perRound = 500, 4 // 2,000 calls over 10 s
			drew := driveAnswers(t, b, clock, svc, 0, rounds, perRound, answer)
			t.Logf("%s, one replica answering 401 in 1 ms: %v", svc, drew)
			assert.Less(t, drew["bad"], rounds*perRound/20, "calls the replica answering 401 drew of %d", rounds*perRound)
			assert.Positive(t, drew["bad"], "the shunned replica must still be tried now and then")

			broken = false // its key is fixed
			drew = driveAnswers(t, b, clock, svc, rounds*perRound, rounds, perRound, answer)
			late := driveAnswers(t, b, clock, svc, 2*rounds*perRound, rounds, perRound, answer)
			t.Logf("%s, the replica fixed: %v, then %v", svc, drew, late)
			assert.Greater(t, late["bad"], rounds*perRound/4, "calls the fixed replica drew of %d", rounds*perRound)
		})
	}
}

// The caller's own bad calls (its token expired, a malformed body) are
// refused by every replica alike: every endpoint's share of client errors
// is high, none is far above another's, and the calls spread as they do
// when every answer is a success.
func TestCallersOwnClientErrorsChangeNoChoice(t *testing.T) {
	for _, svc := range []inferlb.Service{inferlb.ServiceEmbedding, inferlb.ServiceUnknown} {
		for _, badShare := range []int{0, 3, 7, 10} { // tenths of the calls the caller sends bad
			b, clock := threeEndpoints(t, 11)
			answer := func(_ string, n int) (time.Duration, bool) {
				if n%10 < badShare {
					return time.Millisecond, true
				}
				return 20 * time.Millisecond, false
			}
			const rounds, perRound = 500, 4
			drew := driveAnswers(t, b, clock, svc, 0, rounds, perRound, answer)
			t.Logf("%s, %d/10 of the calls bad: %v", svc, badShare, drew)
			for _, addr := range []string{"a", "b", "bad"} {
				assert.InDelta(t, rounds*perRound/3, drew[addr], rounds*perRound/10,
					"%s with %d/10 of the calls refused everywhere: calls to %s", svc, badShare, addr)
			}
			for _, s := range b.Stats() {
				if badShare == 10 {
					assert.Zero(t, s.Successes, s.ID)
					assert.Zero(t, s.Failures, s.ID)
					assert.False(t, s.BreakerOpen, s.ID)
					assert.Greater(t, s.ClientErrorShare, 0.9, s.ID)
				}
				assert.Equal(t, s.Picks, s.Successes+s.ClientErrors, s.ID)
			}
		}
	}
}

// A client error is neither success nor failure: an endpoint answering
// only 401s keeps a clean error rate and a closed breaker, whatever
// BreakerFailures says, and no latency from those answers.
func TestClientErrorIsNeitherSuccessNorFailure(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(3), BreakerFailures: 2})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "only"}}))
	for range 50 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		p.Done(inferlb.Outcome{ClientError: true, Err: assert.AnError})
	}
	s := b.Stats()[0]
	assert.Equal(t, uint64(50), s.ClientErrors)
	assert.Zero(t, s.Successes)
	assert.Zero(t, s.Failures, "ClientError takes precedence over Err")
	assert.Zero(t, s.ErrorRate)
	assert.False(t, s.BreakerOpen)
	assert.Zero(t, s.ServiceLatency[inferlb.ServiceEmbedding])
	assert.Greater(t, s.ClientErrorShare, 0.99)

	// Its share fades with time (ErrorDecay), as the error rate does.
	clock.Advance(balancer.DefaultErrorDecay)
	s = b.Stats()[0]
	assert.InDelta(t, 0.37, s.ClientErrorShare, 0.03)

	// The precedence of the other kinds of answer over it.
	for _, o := range []inferlb.Outcome{
		{ClientError: true, NotServedModel: "m"},
		{ClientError: true, ContextWindow: 10},
		{ClientError: true, Overloaded: true},
	} {
		p, err := b.Pick(&inferlb.Request{Model: "x"})
		require.NoError(t, err)
		p.Done(o)
		clock.Advance(time.Hour) // past any cooldown
	}
	s = b.Stats()[0]
	assert.Equal(t, uint64(50), s.ClientErrors)
	assert.Equal(t, uint64(1), s.NotServed)
	assert.Equal(t, uint64(1), s.TooLong)
	assert.Equal(t, uint64(1), s.Overloads)
}

// Client errors keep Pick and Done free of allocations: a pick that
// compares client-error shares, and a Done that folds one in.
func TestClientErrorsDoNotAllocate(t *testing.T) {
	for _, svc := range []inferlb.Service{inferlb.ServiceLLM, inferlb.ServiceEmbedding} {
		b, clock := threeEndpoints(t, 9)
		req := &inferlb.Request{Service: svc}
		n := 0
		allocs := testing.AllocsPerRun(200, func() {
			p, err := b.Pick(req)
			if err != nil {
				panic(err)
			}
			clock.Advance(time.Millisecond)
			n++
			p.Done(inferlb.Outcome{ClientError: n%3 == 0})
		})
		assert.Zero(t, allocs, "%v", svc)
	}
}

// A replica that refuses every call is still tried as its share of client
// errors fades (ErrorDecay): a trickle bounded by time, not by traffic.
// At the defaults (ErrorAlpha 0.1, ErrorDecay 30 s) it comes to one call
// every 2 to 3 s, whether the fleet takes 200 calls a second or 2,000.
func TestShunnedReplicaIsTriedNowAndThen(t *testing.T) {
	t.Parallel()
	for _, perRound := range []int{4, 40} {
		b, clock := threeEndpoints(t, 13)
		answer := func(addr string, _ int) (time.Duration, bool) {
			if addr == "bad" {
				return time.Millisecond, true
			}
			return 20 * time.Millisecond, false
		}
		driveAnswers(t, b, clock, inferlb.ServiceEmbedding, 0, 1500, perRound, answer) // 30 s
		late := driveAnswers(t, b, clock, inferlb.ServiceEmbedding, 0, 3000, perRound, answer)
		t.Logf("%d calls a second: the refusing replica drew %d of %d calls in 60 s", perRound*50, late["bad"], 3000*perRound)
		// 21 at 200 calls a second, 30 at 2,000 (a few calls go out
		// before the first refusal comes back).
		assert.GreaterOrEqual(t, late["bad"], 5, "%d calls a second", perRound*50)
		assert.LessOrEqual(t, late["bad"], 60, "%d calls a second", perRound*50)
	}
}
