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

// A half-open breaker whose probes are all out is breaker-open, not in
// good standing, for panic routing as for the pick itself. It used to count
// as good once its exclusion ended, so when the exclusions of most of a
// fleet ended, with a probe out on each, panic routing stopped: the
// survivors took all the traffic, and with the whole fleet half-open every
// call but the probes failed with ErrNoEndpoints until the probes
// answered (a long generation's worth of time), though panic routing had
// served them all through the exclusion.
func TestHalfOpenWithoutProbeSlotsIsNotGoodStanding(t *testing.T) {
	// tripThenProbe trips the breakers of eps, lets their exclusions end
	// and takes the one probe each has, leaving it out.
	tripThenProbe := func(t *testing.T, n int, tripped int) (*balancer.Balancer, []balancer.Pick) {
		clock := testutil.NewClock()
		b := newBalancer(t, n, balancer.Options{
			Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: -1,
			BreakerFailures: 1, BreakerProbes: 1, MaxEjectedFraction: 1,
			Scorers: constantScorers(),
		})
		eps := endpoints(n)[:tripped]
		for _, ep := range eps {
			p := pickOn(t, b, ep.Addr)
			p.Done(inferlb.Outcome{Err: errDown})
			require.True(t, stat(t, b, ep.Addr).BreakerOpen)
		}
		clock.Advance(balancer.DefaultEjectionTime)
		// Picks of the wrong endpoint are canceled: a success would be
		// a probe's verdict and close its breaker.
		var probes []balancer.Pick
		for _, ep := range eps {
			for {
				p, err := b.Pick(&inferlb.Request{})
				require.NoError(t, err)
				if p.ID() == ep.Addr {
					probes = append(probes, p)
					break
				}
				p.Done(inferlb.Outcome{Err: context.Canceled})
			}
		}
		for _, ep := range eps {
			require.True(t, stat(t, b, ep.Addr).BreakerOpen)
		}
		return b, probes
	}

	t.Run("most of the fleet", func(t *testing.T) {
		b, _ := tripThenProbe(t, 4, 3)
		// One of four good: panic routing spreads. (A panic-routed call
		// to a half-open endpoint whose probes are out is no probe: its
		// success leaves the breaker open, and the panic lasts until the
		// probes answer; see TestPanicCallsAreNoProbes.)
		assert.Greater(t, len(spread(t, b, &inferlb.Request{}, 400)), 1, "the survivor takes everything")
	})
	t.Run("the whole fleet", func(t *testing.T) {
		b, probes := tripThenProbe(t, 2, 2)
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err, "panic routing, not ErrNoEndpoints")
		p.Done(inferlb.Outcome{})
		for i := range probes {
			probes[i].Done(inferlb.Outcome{})
		}
		for _, ep := range endpoints(2) {
			assert.False(t, stat(t, b, ep.Addr).BreakerOpen, ep.Addr)
		}
	})
}

// halfOpenWithProbesOut trips bad (the first of 4), waits out its
// exclusion and takes every probe slot; the probes are returned open.
func halfOpenWithProbesOut(t *testing.T, clock *testutil.Clock, rec *recorder) (*balancer.Balancer, string, []balancer.Pick) {
	t.Helper()
	b := resilient(t, clock, rec, 4)
	bad := endpoints(4)[0].Addr
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	clock.Advance(balancer.DefaultEjectionTime)
	var probes []balancer.Pick
	for range balancer.DefaultBreakerProbes {
		probes = append(probes, pickOn(t, b, bad))
	}
	return b, bad, probes
}

// holdOn picks n times, finishing every call but those on id, which it
// returns open.
func holdOn(t *testing.T, b *balancer.Balancer, id string, n int) []balancer.Pick {
	t.Helper()
	var held []balancer.Pick
	for range n {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		if p.ID() == id {
			held = append(held, p)
			continue
		}
		p.Done(inferlb.Outcome{})
	}
	return held
}

// TestHungProbeDoesNotHoldTheEndpointOutForGood: a half-open breaker lets
// BreakerProbes calls through and waits for all of them. A probe that
// never ends (the server accepted it and never answered, and the caller
// set no deadline; or one request lost inside a server that serves the
// rest) held its slot for good: two probes succeeded, the third hung, and
// the endpoint got no call for an hour, nor ever after.
func TestHungProbeDoesNotHoldTheEndpointOutForGood(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b, bad, probes := halfOpenWithProbesOut(t, clock, rec)
	probes[0].Done(inferlb.Outcome{})
	probes[1].Done(inferlb.Outcome{}) // probes[2] hangs
	require.True(t, stat(t, b, bad).BreakerOpen)

	clock.Advance(balancer.DefaultEjectionTime - time.Nanosecond)
	assert.Zero(t, spread(t, b, &inferlb.Request{}, 400)[bad], "the probes are out, and not overdue yet")
	clock.Advance(time.Nanosecond)
	assert.Positive(t, spread(t, b, &inferlb.Request{}, 400)[bad],
		"a probe out for as long as the exclusion before it lets another through")
	assert.Equal(t, balancer.EventRecovered, rec.last().Kind, "the new probe's success is the third")
	assert.False(t, stat(t, b, bad).BreakerOpen)

	probes[2].Done(inferlb.Outcome{Err: errDown}) // of the closed breaker's past: ignored
	assert.False(t, stat(t, b, bad).BreakerOpen)
}

// TestWedgedServerGetsFewerProbesOverTime: an endpoint whose every call
// hangs gets one new probe each time the probes out are overdue, and the
// wait doubles, up to MaxEjectionTime, as the exclusion of an endpoint
// whose probes fail does: a wedged server costs its callers one call per
// wait, not a steady share.
func TestWedgedServerGetsFewerProbesOverTime(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b, bad, probes := halfOpenWithProbesOut(t, clock, rec)
	wait := balancer.DefaultEjectionTime
	for range 6 {
		clock.Advance(wait - time.Nanosecond)
		require.Empty(t, holdOn(t, b, bad, 400), "before the wait of %v", wait)
		clock.Advance(time.Nanosecond)
		held := holdOn(t, b, bad, 400)
		require.Len(t, held, 1, "one new probe after the wait of %v", wait)
		probes = append(probes, held...)
		wait = min(2*wait, balancer.DefaultMaxEjectionTime)
	}
	assert.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	assert.True(t, stat(t, b, bad).BreakerOpen)

	// A probe that ends at last still counts: a failure opens the breaker.
	probes[len(probes)-1].Done(inferlb.Outcome{Err: errDown})
	assert.Equal(t, balancer.EventProbeFailed, rec.last().Kind)
	for _, p := range probes {
		p.Done(inferlb.Outcome{})
	}
	assert.True(t, stat(t, b, bad).BreakerOpen)
}

// TestOverdueProbeSlotsStayWithinBreakerProbes: the probe let through
// because the others were overdue takes no slot of its own, but gives one
// back when it ends without a verdict, as they do; the slots never come to
// more than BreakerProbes, so a half-open breaker does not hand out more
// probes at once than it was configured for.
func TestOverdueProbeSlotsStayWithinBreakerProbes(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b, bad, probes := halfOpenWithProbesOut(t, clock, rec)
	clock.Advance(balancer.DefaultEjectionTime)
	held := holdOn(t, b, bad, 400)
	require.Len(t, held, 1)
	for _, p := range append(probes, held...) {
		p.Done(inferlb.Outcome{Err: context.Canceled})
	}
	assert.Len(t, holdOn(t, b, bad, 2000), balancer.DefaultBreakerProbes)
}

// TestOverdueProbesSurviveAClockStepBack: the probes' deadline is on the
// clock too; stepped back an hour, it would have held the endpoint out
// for that hour on top of the wait.
func TestOverdueProbesSurviveAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b, bad, _ := halfOpenWithProbesOut(t, clock, rec)
	clock.Advance(-time.Hour)
	assert.Len(t, holdOn(t, b, bad, 400), 1, "the probes out are overdue at once")
	clock.Advance(2*balancer.DefaultEjectionTime - time.Nanosecond)
	assert.Empty(t, holdOn(t, b, bad, 400))
	clock.Advance(time.Nanosecond)
	assert.Len(t, holdOn(t, b, bad, 400), 1)
}

// A half-open endpoint gets its probes as soon as P2C draws it: a probe
// wins the comparison. Its cost still carries the error rate of the
// outage that tripped its breaker, so it used to lose to every healthy
// candidate until that decayed; at light load the breaker stayed half-open
// for tens of seconds after the exclusion, an endpoint that had recovered
// out of rotation all that time.
func TestHalfOpenEndpointIsProbedPromptly(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(8), OutlierInterval: -1,
		BreakerFailures: 1, BreakerProbes: 3, SlowStartWindow: -1,
	})
	down := endpoints(4)[0].Addr
	for range 20 { // a history of successes everywhere
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Latency: 10 * time.Millisecond})
	}
	p := pickOn(t, b, down)
	p.Done(inferlb.Outcome{Err: errDown})
	require.True(t, stat(t, b, down).BreakerOpen)
	clock.Advance(balancer.DefaultEjectionTime)

	picks := 0
	for ; stat(t, b, down).BreakerOpen; picks++ {
		require.Less(t, picks, 40, "the half-open endpoint got %d calls", stat(t, b, down).Successes)
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Latency: 10 * time.Millisecond})
	}
	t.Logf("breaker closed after %d picks", picks)
}
