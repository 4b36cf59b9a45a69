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

// A fake clock that starts at its zero value (time.Time{}, a hand-rolled
// test clock's natural start) reads as Unix nanoseconds far below zero.
// The saturating add behind every exclusion overflowed for a time before
// 1970 and saturated to the end of time: one overload answer, or one trip,
// held the endpoint out for good.
func TestExclusionsEndOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), PanicThreshold: -1})
	require.NoError(t, b.Update(endpoints(2)))
	id := endpoints(2)[0].Key()
	s, _ := b.Serial(id)

	p, err := b.PickAt(&inferlb.Request{}, s)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Overloaded: true, RetryAfter: time.Second})
	assert.Equal(t, clock.Now().Add(time.Second).UnixNano(), stat(t, b, id).ExcludedUntil.UnixNano(), "cooling down for its Retry-After")

	clock.Advance(2 * time.Second)
	assert.True(t, stat(t, b, id).ExcludedUntil.IsZero(), "back after its Retry-After")
	p, err = b.PickAt(&inferlb.Request{}, s)
	require.NoError(t, err)
	assert.Equal(t, id, p.ID())
	p.Done(inferlb.Outcome{})

	for range balancer.DefaultBreakerFailures {
		p, err = b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	assert.Equal(t, clock.Now().Add(balancer.DefaultEjectionTime).UnixNano(), stat(t, b, id).ExcludedUntil.UnixNano(), "tripped for EjectionTime")
}

// Slow start on a clock from the zero Time. Its readings are far below
// zero, so a ramp's start of 0 ("not ramping") read as a time set ahead
// of the clock before a step back, which the first pick mended to now:
// every endpoint, the initial set too, started a ramp at its first pick,
// and keys scattered off their owners for the window (affinity admits a
// ramping owner at its factor). A joiner's start, max(now, 1), read so
// too, and its ramp began at the next pick rather than when it joined.
func TestOnlyJoinersSlowStartOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), Scorers: constantScorers()})
	require.NoError(t, b.Update(endpoints(3)))
	spread(t, b, &inferlb.Request{}, 30)
	for _, s := range b.Stats() {
		assert.Equal(t, 1.0, s.RampFactor, "%s of the initial set does not ramp", s.ID)
	}

	require.NoError(t, b.Update(endpoints(4))) // the fourth joins a serving Balancer
	joined := endpoints(4)[3].Key()
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	spread(t, b, &inferlb.Request{}, 30)
	assert.InDelta(t, 0.5, stat(t, b, joined).RampFactor, 1e-9, "halfway through its ramp from when it joined")
	for _, ep := range endpoints(3) {
		assert.Equal(t, 1.0, stat(t, b, ep.Key()).RampFactor, ep.Key())
	}
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	assert.Equal(t, 1.0, stat(t, b, joined).RampFactor, "at full weight after the window")

	back := endpoints(4)[0].Key()
	require.True(t, b.SetReady(back, false))
	require.True(t, b.SetReady(back, true)) // back from an outage
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	spread(t, b, &inferlb.Request{}, 30)
	assert.InDelta(t, 0.5, stat(t, b, back).RampFactor, 1e-9, "halfway through its ramp from when it came back")
}

// The retry floor's bank on a clock from the zero Time: the mark of
// floor retries spent starts at 0, which is ahead of such a clock, and
// read as a clock stepped back it restarted the floor with one retry's
// allowance instead of the bank's 100.
func TestRetryFloorBanksOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	b := balancer.New(balancer.Options{Clock: clock, RetryRatio: -1, RetryFloor: 10})
	allowed := 0
	for range 200 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.Equal(t, 100, allowed, "the floor's ten seconds banked")
	clock.Advance(time.Second)
	allowed = 0
	for range 50 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.Equal(t, 10, allowed, "then the floor's 10 a second")
}

// Detection time on a clock from the zero Time: the start of a failure
// streak, a reading below zero there, was taken for none (it was tested
// for > 0), so no trip reported how long it took to see.
func TestDetectionOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	rec := &recorder{}
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), OnEvent: rec.record, OutlierInterval: -1})
	require.NoError(t, b.Update(endpoints(4)))
	id := endpoints(4)[0].Key()
	s, _ := b.Serial(id)
	for range balancer.DefaultBreakerFailures {
		p, err := b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		clock.Advance(time.Second)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	want := time.Duration(balancer.DefaultBreakerFailures-1) * time.Second
	require.Equal(t, balancer.EventTripped, rec.last().Kind)
	assert.Equal(t, want, rec.last().Detection, "first failure to exclusion")
	assert.Equal(t, want, stat(t, b, id).LastDetection)
}

// An endpoint never ejected is not held out, on a clock from the zero
// Time too. Its ejection deadline of 0 ("none") is ahead of such a clock,
// and only a pick's standing count, which skips endpoints that are not
// ready, mended it to now: until then the endpoint counted as ejected
// against MaxEjectedFraction, and a fleet with two of four endpoints still
// connecting refused the breaker of a third its trip.
func TestNeverEjectedIsNotHeldOutOnAClockFromTheZeroTime(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Time{})
	rec := &recorder{}
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), OnEvent: rec.record, OutlierInterval: -1})
	require.NoError(t, b.Update(endpoints(4)))
	for _, ep := range endpoints(4)[2:] {
		require.True(t, b.SetReady(ep.Key(), false)) // still connecting
	}
	id := endpoints(4)[0].Key()
	s, _ := b.Serial(id)
	for range balancer.DefaultBreakerFailures {
		p, err := b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	assert.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds(), "one of four held out is within the cap")
	assert.True(t, stat(t, b, id).BreakerOpen)
	for _, ep := range endpoints(4)[1:] {
		assert.True(t, stat(t, b, ep.Key()).ExcludedUntil.IsZero(), "%s is not excluded", ep.Key())
	}
}

// A clock that reads exactly the Unix epoch (a fake clock set to
// time.Unix(0, 0)): a ramp's start is stored where 0 means "not ramping"
// (nonZero), so an endpoint that joins a serving Balancer at that instant
// still ramps up from then, as it does at any other reading.
func TestJoinerSlowStartsOnAClockAtTheEpoch(t *testing.T) {
	clock := testutil.NewClock()
	clock.Set(time.Unix(0, 0))
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), Scorers: constantScorers()})
	require.NoError(t, b.Update(endpoints(3)))
	spread(t, b, &inferlb.Request{}, 30)
	require.NoError(t, b.Update(endpoints(4))) // joins at exactly 0 ns
	joined := endpoints(4)[3].Key()
	assert.Less(t, stat(t, b, joined).RampFactor, 0.5, "a joiner starts its ramp")
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	assert.InDelta(t, 0.5, stat(t, b, joined).RampFactor, 1e-6, "halfway through its ramp from the epoch")
	for _, ep := range endpoints(3) {
		assert.Equal(t, 1.0, stat(t, b, ep.Key()).RampFactor, ep.Key())
	}
	// The start is stored as 1 ns, so the window ends a nanosecond later.
	clock.Advance(balancer.DefaultSlowStartWindow/2 + time.Nanosecond)
	assert.Equal(t, 1.0, stat(t, b, joined).RampFactor, "at full weight after the window")
}
