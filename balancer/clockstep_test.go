package balancer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// The wall clock can step back (an NTP step, a VM restored from a
// snapshot), and the default Clock follows it within a second. Deadlines
// the balancer set before the step must not hold for the length of the
// step on top of their own.

// TestOutlierDetectionSurvivesAClockStepBack: the next evaluation was due
// an interval after the last; after a step back of an hour, detection
// stopped for that hour while a failing endpoint kept its traffic.
func TestOutlierDetectionSurvivesAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(12), OnEvent: rec.record, BreakerFailures: -1, Scorers: constantScorers(),
	})
	bad := endpoints(4)[3].Addr
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{}) // the first evaluation; the next is an interval on
	clock.Advance(-time.Hour)

	// Two intervals of traffic; the bad endpoint fails every other call.
	failEveryOther(t, b, clock, bad, 8000, balancer.DefaultOutlierInterval/4000)
	assert.True(t, slices.Contains(rec.kinds(), balancer.EventEjected), "events: %v", rec.kinds())
}

// TestRetryFloorSurvivesAClockStepBack: the floor's spending mark was
// ahead of a clock stepped back, so a quiet client got no retries at all
// until the clock caught up.
func TestRetryFloorSurvivesAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, RetryRatio: -1, RetryFloor: 1})
	require.True(t, b.AllowRetry())
	clock.Advance(-time.Hour)
	assert.True(t, b.AllowRetry(), "the floor is not held up for the hour")
	assert.False(t, b.AllowRetry(), "one retry a second")
	clock.Advance(time.Second)
	assert.True(t, b.AllowRetry())
	assert.False(t, b.AllowRetry())
}

// TestExclusionsSurviveAClockStepBack: a cooldown, a breaker's exclusion
// and a slow-start ramp are deadlines on the clock; stepped back an hour,
// a one-second cooldown kept its endpoint out for an hour, and a ramp that
// had ended held its endpoint at the minimum weight for that hour.
func TestExclusionsSurviveAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := resilient(t, clock, rec, 4)
	eps := endpoints(5)
	require.NoError(t, b.Update(eps)) // eps[4] joins and ramps
	clock.Advance(balancer.DefaultSlowStartWindow)
	require.Equal(t, 1.0, stat(t, b, eps[4].Addr).RampFactor)

	cooled, tripped := eps[0].Addr, eps[1].Addr
	p := pickOn(t, b, cooled)
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, tripped)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventCooldown, balancer.EventTripped}, rec.kinds())

	clock.Advance(-time.Hour)
	spread(t, b, &inferlb.Request{}, 10)
	clock.Advance(balancer.DefaultEjectionTime)
	got := spread(t, b, &inferlb.Request{}, 2000)
	assert.Positive(t, got[cooled], "the cooldown is over")
	assert.Positive(t, got[tripped], "the breaker probes")
	clock.Advance(balancer.DefaultSlowStartWindow)
	assert.Equal(t, 1.0, stat(t, b, eps[4].Addr).RampFactor, "a ramp ends")
}

// TestLongestExclusionIsNoStepBack: a pick reads the clock a moment before
// the Done of another goroutine that sets the longest exclusion there is.
// Seen from the pick, the exclusion is longer than any the balancer sets;
// that is a race between clock readings, not a step back, and must not end
// the exclusion.
func TestLongestExclusionIsNoStepBack(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(11), OnEvent: rec.record, Scorers: constantScorers(), OutlierInterval: -1,
		EjectionTime: 10 * time.Second, MaxEjectionTime: 10 * time.Second, MaxCooldown: 10 * time.Second,
	})
	bad := endpoints(4)[0].Addr
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	clock.Advance(-time.Millisecond)
	assert.Zero(t, spread(t, b, &inferlb.Request{}, 400)[bad])
}

// TestDowntimeIsNeverNegative: detection and downtime are differences of
// clock readings; across a step back they came out negative, in events and
// in the Stats that metrics export.
func TestDowntimeIsNeverNegative(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := resilient(t, clock, rec, 4)
	bad := endpoints(4)[0].Addr
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
		clock.Advance(-time.Minute) // each failure "before" the last
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	assert.GreaterOrEqual(t, rec.last().Detection, time.Duration(0))
	clock.Advance(-time.Hour)
	spread(t, b, &inferlb.Request{}, 10) // the step is noticed: the breaker probes
	for range balancer.DefaultBreakerProbes {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{})
	}
	require.Equal(t, balancer.EventRecovered, rec.last().Kind)
	assert.GreaterOrEqual(t, rec.last().Downtime, time.Duration(0))
	st := stat(t, b, bad)
	assert.GreaterOrEqual(t, st.LastDetection, time.Duration(0))
	assert.GreaterOrEqual(t, st.LastDowntime, time.Duration(0))
}

// TestErrorRateDecaysAfterAClockStepBack: an endpoint's error rate decays
// from the time of its last outcome; stepped back an hour, that time was
// in the future and the rate stayed where it was, and an endpoint that
// failed a burst just before the step, avoided for its rate (so no new
// outcome reset it), stayed avoided for the hour.
func TestErrorRateDecaysAfterAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), BreakerFailures: -1, OutlierInterval: -1})
	bad := endpoints(2)[1].Key()
	for range 200 { // every call on bad fails, until P2C avoids it
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		if p.ID() == bad {
			p.Done(inferlb.Outcome{Err: assert.AnError})
		} else {
			p.Done(inferlb.Outcome{})
		}
	}
	rate := func() float64 {
		for _, s := range b.Stats() {
			if s.ID == bad {
				return s.ErrorRate
			}
		}
		t.Fatal("no stats for", bad)
		return 0
	}
	require.GreaterOrEqual(t, rate(), 0.05)
	clock.Advance(-time.Hour)
	p, err := b.Pick(&inferlb.Request{}) // a pick compares bad's rate: healthy wins
	require.NoError(t, err)
	assert.NotEqual(t, bad, p.ID())
	p.Done(inferlb.Outcome{})
	clock.Advance(10 * balancer.DefaultErrorDecay)
	assert.Less(t, rate(), 0.01, "ten decay times after the step")
}

// TestLatencyDecaysAfterAClockStepBack: a peak-EWMA latency decays from
// the time of its last sample, so a slow endpoint, avoided, is tried again
// once its EWMA has decayed below its peers'. Stepped back an hour, the
// sample's time was in the future and the EWMA did not decay: the slow
// endpoint stayed avoided for the hour (0 of 1,000 calls over the next
// 100 s, where without the step it takes calls again after 49 s, 86 of them).
func TestLatencyDecaysAfterAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), OutlierInterval: -1})
	eps := endpoints(2)
	slow, fast := eps[0].Addr, eps[1].Addr
	embed := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	pickOnFor := func(id string) balancer.Pick {
		for range 1000 {
			p, err := b.Pick(embed)
			require.NoError(t, err)
			if p.ID() == id {
				return p
			}
			p.Done(inferlb.Outcome{Err: context.Canceled}) // feeds nothing
		}
		t.Fatalf("never picked %s", id)
		return balancer.Pick{}
	}
	p := pickOnFor(fast)
	p.Done(inferlb.Outcome{Latency: 10 * time.Millisecond})
	p = pickOnFor(slow)
	p.Done(inferlb.Outcome{Latency: 2 * time.Second})

	clock.Advance(-time.Hour)
	picks := 0
	for range 1000 { // 100 s: ten decay times
		p, err := b.Pick(embed)
		require.NoError(t, err)
		if p.ID() == slow {
			picks++
		}
		p.Done(inferlb.Outcome{Latency: 10 * time.Millisecond})
		clock.Advance(100 * time.Millisecond)
	}
	assert.Positive(t, picks, "the slow endpoint's latency decays from the step on")
}

// TestRecentPrefillDecaysAfterAClockStepBack: the prompt tokens recently
// sent to an endpoint (the prefill a new generation call would wait behind)
// decay from the time of the last call. Stepped back an hour, that time was
// in the future: a 32k-token prompt sent just before the step doubled its
// endpoint's cost for the hour, and it lost every comparison at equal load.
func TestRecentPrefillDecaysAfterAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: -1,
		Scorers: map[inferlb.Service]scoringScorer{inferlb.ServiceLLM: constant{}}, // the held call's load does not count
	})
	long := endpoints(2)[0].Addr
	prompt := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 32768}
	var held balancer.Pick
	for {
		p, err := b.Pick(prompt)
		require.NoError(t, err)
		if p.ID() == long {
			held = p // still prefilling
			break
		}
		p.Done(inferlb.Outcome{}) // ended: its prefill is taken out
	}
	defer held.Done(inferlb.Outcome{})

	clock.Advance(-time.Hour)
	spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM}, 10)
	clock.Advance(5 * time.Second) // ten of the estimate's time constants
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM}, 1000)
	assert.InDelta(t, 500, got[long], 100, "equal costs once the prefill has decayed: %v", got)
}

// TestGoodStandingCountsAfterAClockStepBack: a breaker that trips again
// soon after it recovered is held out twice as long, and one doubling is
// forgiven per EjectionTime in good standing since the recovery. Stepped
// back an hour, the recovery was in the future: ten good minutes after the
// step forgave nothing, and the next trip held the endpoint out 20 s
// instead of 10 (and twice as long again for each flap before it).
func TestGoodStandingCountsAfterAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), PanicThreshold: -1,
		BreakerFailures: 1, BreakerProbes: 1})
	bad := endpoints(2)[0].Addr
	call, held := pinnedCalls(t, b, clock, bad)

	call(errDown)
	clock.Advance(held())
	call(nil) // recovered
	clock.Advance(-time.Hour)
	spread(t, b, &inferlb.Request{}, 10) // the step is noticed
	clock.Advance(10 * time.Minute)      // in good standing for a while
	call(errDown)
	assert.Equal(t, balancer.DefaultEjectionTime, held(), "after ten good minutes it starts over")
}
