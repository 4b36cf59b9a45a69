package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// sdkRetryCalls makes calls as the official OpenAI SDKs do with their
// default two retries: an overload answer's Retry-After (retryAfter) is
// waited out on the fake clock, exactly, and the call tried again, up to
// three attempts in all. Every call to refusing is answered "overloaded";
// the others serve it. It returns how many calls failed all three attempts
// and how many attempts went to refusing.
func sdkRetryCalls(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, refusing string, req *inferlb.Request, calls int, retryAfter, gap time.Duration) (failed, refused int) {
	t.Helper()
	for range calls {
		served := false
		for attempt := range 3 {
			p, err := b.Pick(req)
			require.NoError(t, err)
			if p.ID() == refusing {
				clock.Advance(5 * time.Millisecond)
				p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: retryAfter})
				refused++
				if attempt < 2 {
					clock.Advance(retryAfter) // the SDK's wait
				}
				continue
			}
			clock.Advance(50 * time.Millisecond)
			p.Done(inferlb.Outcome{})
			served = true
			break
		}
		if !served {
			failed++
		}
		clock.Advance(gap)
	}
	return failed, refused
}

// A replica that answers every call "overloaded, Retry-After: 1", next to
// a healthy one, under a caller whose SDK retries at exactly Retry-After
// (openai-go's default two retries): the cooldown lasted Retry-After, so
// each retry found the refusing replica back in full standing. With
// affinity the key's owner took the retry back every time, and all three
// attempts of a call went to it: 10 of 30 calls failed (seed 5); without
// affinity the two tied, and 2 of 30 failed. After a cooldown an endpoint
// that refused again a call sent at its Retry-After is second choice for
// a while (its probation), so the retries go to the healthy replica, and
// no call fails.
func TestRetryAfterRetriesAvoidRefusingReplica(t *testing.T) {
	for _, mode := range []balancer.AffinityMode{balancer.AffinityPrefer, balancer.AffinityOff} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := testutil.NewClock()
			b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), Affinity: mode})
			req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", AffinityKey: 0x5eed}
			p, err := b.Pick(req)
			require.NoError(t, err)
			refusing := p.ID() // the key's owner, with affinity
			p.Done(inferlb.Outcome{})

			failed, refused := sdkRetryCalls(t, b, clock, refusing, req, 30, time.Second, 300*time.Millisecond)
			t.Logf("%v: %d of 30 calls failed, %d attempts refused", mode, failed, refused)
			assert.Zero(t, failed, "calls that failed all three attempts")
			// Its probation doubles while it refuses every call it gets
			// back: a handful of the 30 calls' first attempts, not a
			// share of every retry.
			assert.LessOrEqual(t, refused, 6)
		})
	}
}

// The same for embedding calls, whose scorer compares every candidate
// (scoring.FullScanner) instead of two: the refusing replica's cost,
// nothing in flight, tied the healthy one's.
func TestRetryAfterRetriesAvoidRefusingReplicaScan(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	refusing := endpoints(3)[0].Addr
	failed, refused := sdkRetryCalls(t, b, clock, refusing, req, 30, time.Second, 300*time.Millisecond)
	t.Logf("%d of 30 calls failed, %d attempts refused", failed, refused)
	assert.Zero(t, failed)
	assert.LessOrEqual(t, refused, 6)
}

// pickSerial picks id by its serial (PickAt), which takes it whatever
// its probation.
func pickSerial(t *testing.T, b *balancer.Balancer, id string) *balancer.Pick {
	t.Helper()
	serial, ok := b.Serial(id)
	require.True(t, ok)
	p, err := b.PickAt(&inferlb.Request{}, serial)
	require.NoError(t, err)
	require.Equal(t, id, p.ID())
	return &p
}

// The first overload answer is taken at its word: the endpoint is back in
// full at its Retry-After. A second in a row (the call was sent after that
// cooldown ended) puts it on probation once its cooldown ends, for twice
// the cooldown, doubled for each refusal in a row after, up to
// MaxCooldown; a call it serves ends the row and the probation. The
// refusals of calls already in flight when it began to shed are the same
// burst: a replica that sheds one burst is back in full at its Retry-After.
func TestOverloadProbation(t *testing.T) {
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: time.Second}
	t.Run("burst", func(t *testing.T) {
		clock := testutil.NewClock()
		b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
		hot := endpoints(2)[0].Addr
		var burst []*balancer.Pick
		for range 5 {
			burst = append(burst, pickSerial(t, b, hot))
		}
		clock.Advance(10 * time.Millisecond)
		for _, p := range burst {
			p.Done(overloaded)
		}
		s := stat(t, b, hot)
		assert.Equal(t, 1, s.OverloadStreak, "one burst")
		assert.WithinDuration(t, clock.Now().Add(time.Second), s.ExcludedUntil, 0)
		assert.True(t, s.ProbationUntil.IsZero(), "no probation")

		clock.Advance(time.Second)
		assert.Greater(t, spread(t, b, &inferlb.Request{}, 200)[hot], 60, "back in full at Retry-After")
		assert.Zero(t, stat(t, b, hot).OverloadStreak, "served")
	})
	t.Run("row", func(t *testing.T) {
		clock := testutil.NewClock()
		b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), MaxCooldown: 5 * time.Second})
		hot := endpoints(2)[0].Addr
		for k, probation := range []time.Duration{0, 2, 4, 5, 5} {
			straggler := pickSerial(t, b, hot) // picked before the refusal
			pickSerial(t, b, hot).Done(overloaded)
			s := stat(t, b, hot)
			assert.Equal(t, k+1, s.OverloadStreak)
			if probation == 0 {
				assert.True(t, s.ProbationUntil.IsZero())
			} else {
				assert.WithinDuration(t, clock.Now().Add(time.Second+probation*time.Second), s.ProbationUntil, 0, "refusal %d", k+1)
			}
			straggler.Done(overloaded)
			assert.Equal(t, k+1, stat(t, b, hot).OverloadStreak, "the same burst")
			clock.Advance(time.Second) // the cooldown's end: a retry there
			if probation != 0 {
				assert.Zero(t, spread(t, b, &inferlb.Request{}, 100)[hot], "on probation")
			}
		}
		// A success of a call picked before the cooldown ended is no
		// verdict; one after is.
		early := pickSerial(t, b, hot)
		pickSerial(t, b, hot).Done(overloaded)
		early.Done(inferlb.Outcome{})
		assert.Equal(t, 6, stat(t, b, hot).OverloadStreak)
		clock.Advance(time.Second)
		pickSerial(t, b, hot).Done(inferlb.Outcome{})
		s := stat(t, b, hot)
		assert.Zero(t, s.OverloadStreak)
		assert.True(t, s.ProbationUntil.IsZero(), "served: probation over")
		assert.Positive(t, spread(t, b, &inferlb.Request{}, 200)[hot])

		// A refusal long after it was last back in full starts a new row.
		pickSerial(t, b, hot).Done(overloaded)
		clock.Advance(time.Second)
		pickSerial(t, b, hot).Done(overloaded)
		assert.Equal(t, 2, stat(t, b, hot).OverloadStreak)
		clock.Advance(time.Minute)
		pickSerial(t, b, hot).Done(overloaded)
		assert.Equal(t, 1, stat(t, b, hot).OverloadStreak)
	})
}

// With nowhere else to go the probation changes nothing: a single
// replica that refuses call after call takes each retry at exactly its
// Retry-After, with panic routing (which takes calls to it while it cools
// down) and without it (which fails them until then, as before). Its
// cooldown is the server's Retry-After, never lengthened.
func TestOverloadProbationSingleReplica(t *testing.T) {
	for _, panicThreshold := range []float64{0, -1} {
		clock := testutil.NewClock()
		b := newBalancer(t, 1, balancer.Options{Clock: clock, PanicThreshold: panicThreshold})
		for range 6 {
			p, err := b.Pick(&inferlb.Request{})
			require.NoError(t, err, "panic threshold %v", panicThreshold)
			p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
			assert.WithinDuration(t, clock.Now().Add(time.Second), stat(t, b, p.ID()).ExcludedUntil, 0)
			_, err = b.Pick(&inferlb.Request{})
			if panicThreshold < 0 {
				assert.ErrorIs(t, err, balancer.ErrNoEndpoints, "cooling down, no panic routing")
			} else {
				assert.NoError(t, err, "panic routing")
			}
			clock.Advance(time.Second)
		}
	}
}

// Panic routing spreads calls over the ready members whatever their
// standing, and the probation does not undo it: a member on probation is
// no second choice there, or the few members in good standing would take
// the whole load.
func TestOverloadProbationInPanic(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 6, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	eps := endpoints(6)
	shed := eps[0].Addr
	for range 2 {
		pickSerial(t, b, shed).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
		clock.Advance(time.Second)
	} // on probation
	for _, ep := range eps[2:5] {
		pickSerial(t, b, ep.Addr).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
	}
	// Three of six in good standing: not below half, no panic; the one on
	// probation is second choice to the other two.
	got := spread(t, b, &inferlb.Request{}, 600)
	assert.Zero(t, got[shed])
	pickSerial(t, b, eps[5].Addr).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
	got = spread(t, b, &inferlb.Request{}, 600) // two of six: panic
	for _, ep := range eps {
		assert.Greater(t, got[ep.Addr], 50, ep.Addr)
	}
}

// A pick while a member is on probation (steered away from, by affinity
// and by P2C) allocates nothing, as every pick.
func TestProbationPickDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	shed := endpoints(4)[0].Addr
	for range 2 {
		pickSerial(t, b, shed).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
		clock.Advance(time.Second)
	}
	require.False(t, stat(t, b, shed).ProbationUntil.IsZero())
	keyed := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", AffinityKey: 7}
	plain := &inferlb.Request{Service: inferlb.ServiceLLM}
	embed := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	allocs := testing.AllocsPerRun(200, func() {
		for _, req := range []*inferlb.Request{keyed, plain, embed} {
			p, err := b.Pick(req)
			if err != nil || p.ID() == shed {
				panic("picked the endpoint on probation")
			}
			p.Done(inferlb.Outcome{})
		}
	})
	assert.Zero(t, allocs)
}

// A probation at its longest ends twice MaxCooldown after the refusal (a
// cooldown of MaxCooldown, then a probation of MaxCooldown). With
// MaxEjectionTime no longer than MaxCooldown that was the whole clock-step
// horizon (twice the longest cooldown or ejection), with no margin: a
// reading a millisecond earlier than the refusal's (the clock stepped
// back by that much, or another goroutine's pick read it just before)
// took the probation for one set before a step back and ended it, and the
// replica that refused its Retry-After call took its keys and retries
// back at the next Retry-After.
func TestProbationSurvivesSmallStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5),
		MaxCooldown: 2 * time.Minute, MaxEjectionTime: 2 * time.Minute})
	hot := endpoints(2)[0].Addr
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: 2 * time.Minute}
	pickSerial(t, b, hot).Done(overloaded)
	clock.Advance(2 * time.Minute)
	pickSerial(t, b, hot).Done(overloaded)
	until := stat(t, b, hot).ProbationUntil
	require.WithinDuration(t, clock.Now().Add(4*time.Minute), until, 0)

	clock.Set(clock.Now().Add(-time.Millisecond)) // a small step back
	spread(t, b, &inferlb.Request{}, 10)          // picks at the earlier reading
	assert.Equal(t, until, stat(t, b, hot).ProbationUntil, "probation kept")
	clock.Advance(2*time.Minute + time.Millisecond) // its cooldown's end
	assert.Zero(t, spread(t, b, &inferlb.Request{}, 100)[hot], "on probation")
}

// A tenant's shard whose members are all on probation while members
// outside it are not: steering is on for the group, but in the shard there
// is no settled member to steer to. The affinity walk passed over every
// member on probation and found none, and P2C scattered the keys over
// the shard: cold prefills on the member that does not hold the key's
// prefix, for as long as the probation. With no settled member to go to,
// a key goes to its owner, as it would without the probation.
func TestProbationShardKeysStayWithoutSettledMember(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 6, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: seed,
		TenantShardSize: 2, MinKeyReuse: -1})
	key := func(k int) *inferlb.Request {
		return &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", Tenant: "acme", AffinityKey: uint64(k+1) * 0x9e3779b97f4a7c15}
	}
	const keys = 16
	owner := make([]string, keys)
	shard := map[string]bool{}
	for k := range keys {
		p, err := b.Pick(key(k))
		require.NoError(t, err)
		owner[k] = p.ID()
		shard[p.ID()] = true
		p.Done(inferlb.Outcome{})
	}
	require.Len(t, shard, 2, "the tenant's shard")
	for range 2 {
		for id := range shard {
			pickSerial(t, b, id).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
		}
		clock.Advance(time.Second)
	}
	for id := range shard {
		require.False(t, stat(t, b, id).ProbationUntil.IsZero(), id)
	}
	moved := 0
	for k := range keys {
		p, err := b.Pick(key(k))
		require.NoError(t, err)
		require.True(t, shard[p.ID()], "in the shard")
		if p.ID() != owner[k] {
			moved++
		}
		p.Done(inferlb.Outcome{Err: context.Canceled}) // no verdict on the probation
	}
	assert.Zero(t, moved, "keys moved off their owner")

	// With a settled member in the shard, the keys of the one on
	// probation go there.
	settled := owner[0]
	pickSerial(t, b, settled).Done(inferlb.Outcome{}) // served: its probation is over
	for k := range keys {
		p, err := b.Pick(key(k))
		require.NoError(t, err)
		assert.Equal(t, settled, p.ID(), "key %d", k)
		p.Done(inferlb.Outcome{Err: context.Canceled})
	}
}

// Steering follows the probations' ends on time: the group's standing is
// cached until the earliest of them. With every member in good standing on
// probation there is no one to steer to, and the calls are spread as
// without it; once the first probation ends, at that instant, the member
// still on probation is second choice again.
func TestProbationEndsOnTime(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	eps := endpoints(2)
	a, c := eps[0].Addr, eps[1].Addr
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: time.Second}
	// a refuses at 0s and 1s: on probation from 2s to 4s; c at 1s and
	// 2s: from 3s to 5s.
	pickSerial(t, b, a).Done(overloaded)
	clock.Advance(time.Second)
	pickSerial(t, b, a).Done(overloaded)
	pickSerial(t, b, c).Done(overloaded)
	clock.Advance(time.Second)
	pickSerial(t, b, c).Done(overloaded)
	clock.Advance(time.Second)
	require.WithinDuration(t, clock.Now().Add(time.Second), stat(t, b, a).ProbationUntil, 0)
	require.WithinDuration(t, clock.Now().Add(2*time.Second), stat(t, b, c).ProbationUntil, 0)
	// No verdict on either probation (a served call would end it).
	picks := func() map[string]int {
		got := map[string]int{}
		for range 100 {
			p, err := b.Pick(&inferlb.Request{})
			require.NoError(t, err)
			got[p.ID()]++
			p.Done(inferlb.Outcome{Err: context.Canceled})
		}
		return got
	}
	got := picks()
	assert.Greater(t, got[a], 20, "both on probation: no steering")
	assert.Greater(t, got[c], 20, "both on probation: no steering")
	clock.Advance(time.Second - time.Millisecond)
	picks()
	clock.Advance(time.Millisecond) // a's probation ends
	assert.Zero(t, picks()[c], "c still on probation")
}

// A half-open breaker's probe wins over a peer in good standing (prefer,
// scan), on probation too: a member that may have recovered is not kept
// out of rotation for the probation's length. So with an affinity key:
// the key's owner, half-open and on probation, took none of its keys'
// calls, which went to its peer until the probation ended, and was
// probed only by calls without a key.
func TestProbationKeyedProbeWins(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: seed, MinKeyReuse: -1,
		BreakerFailures: 1, BreakerProbes: 1, OutlierInterval: -1, MaxEjectedFraction: 1})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", AffinityKey: 0x5eed}
	p, err := b.Pick(req)
	require.NoError(t, err)
	hot := p.ID() // the key's owner
	p.Done(inferlb.Outcome{})
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: 10 * time.Second}
	pickSerial(t, b, hot).Done(overloaded)
	clock.Advance(10 * time.Second)
	pickSerial(t, b, hot).Done(overloaded) // on probation 20s after its cooldown
	clock.Advance(10 * time.Second)
	pickSerial(t, b, hot).Done(inferlb.Outcome{Err: errDown}) // tripped: out for 10s
	clock.Advance(balancer.DefaultEjectionTime)
	s := stat(t, b, hot)
	require.True(t, s.BreakerOpen)
	require.True(t, s.ProbationUntil.After(clock.Now()))

	p, err = b.Pick(req)
	require.NoError(t, err)
	assert.Equal(t, hot, p.ID(), "the probe")
	p.Done(inferlb.Outcome{})
	s = stat(t, b, hot)
	assert.False(t, s.BreakerOpen, "the probe closed it")
	assert.True(t, s.ProbationUntil.IsZero(), "served: probation over")
}

// A tenant's shard that is calm while its group is in panic routing takes
// its calls as the group would out of panic (pickWith): its member on
// probation is second choice to its settled one there too. Steering was
// decided with the group's panic, and was off: the member on probation
// took half the tenant's calls.
func TestProbationInCalmShardOfPanickingGroup(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 6, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AffinitySeed: seed, TenantShardSize: 2})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}
	shard := spread(t, b, req, 100)
	require.Len(t, shard, 2)
	var shed, settled string
	for id := range shard {
		shed, settled = id, shed
	}
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: time.Second}
	for range 2 {
		pickSerial(t, b, shed).Done(overloaded)
		clock.Advance(time.Second)
	}
	require.False(t, stat(t, b, shed).ProbationUntil.IsZero())
	for _, ep := range endpoints(6) {
		if shard[ep.Addr] == 0 {
			pickSerial(t, b, ep.Addr).Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Minute})
		}
	} // two of six in good standing: the group panics, the shard does not
	got := map[string]int{}
	for range 100 {
		p, err := b.Pick(req)
		require.NoError(t, err)
		got[p.ID()]++
		p.Done(inferlb.Outcome{Err: context.Canceled})
	}
	assert.Zero(t, got[shed], "on probation")
	assert.Equal(t, 100, got[settled], "the shard's settled member")
}

// A call the endpoint dropped unprocessed as its connection closed
// (Outcome.Drained: gRPC's stream dropped by a GOAWAY) cools it down as an
// overload answer without a hint does, but is no refusal. Drained calls
// in a row, each sent after the last one's cooldown (a replica restarting
// behind a draining listener gives them so), put it on probation from the
// second, as refusals do; now they neither start a row nor end one.
func TestDrainedCallIsNoRefusal(t *testing.T) {
	drained := inferlb.Outcome{Overloaded: true, Drained: true}
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: time.Second}
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	id := endpoints(2)[0].Addr
	for range 3 {
		pickSerial(t, b, id).Done(drained)
		s := stat(t, b, id)
		assert.WithinDuration(t, clock.Now().Add(balancer.DefaultCooldown), s.ExcludedUntil, 0, "cooled down")
		assert.Zero(t, s.OverloadStreak)
		assert.True(t, s.ProbationUntil.IsZero(), "on probation until %v", s.ProbationUntil)
		clock.Advance(balancer.DefaultCooldown)
	}
	assert.EqualValues(t, 3, stat(t, b, id).Overloads)
	assert.Greater(t, spread(t, b, &inferlb.Request{}, 100)[id], 30, "back in full")

	// Between two refusals, a drained call leaves the row as it was: the
	// second refusal puts it on probation.
	pickSerial(t, b, id).Done(overloaded)
	clock.Advance(time.Second)
	pickSerial(t, b, id).Done(drained)
	assert.Equal(t, 1, stat(t, b, id).OverloadStreak, "not ended")
	clock.Advance(time.Second)
	pickSerial(t, b, id).Done(overloaded)
	s := stat(t, b, id)
	assert.Equal(t, 2, s.OverloadStreak)
	assert.WithinDuration(t, clock.Now().Add(3*time.Second), s.ProbationUntil, 0)
}
