package balancer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A failure and a success on one endpoint end together: the failure has
// noted its streak and is about to report to the breaker when the success
// overtakes it. The success ended the streak (the endpoint's note of it)
// and reported first, then the failure reached gobreaker: gobreaker held a
// failure that no streak noted, and every later success, finding no
// streak, skipped its report and left it there. The next trip came after
// BreakerFailures-1 failures, whatever successes came between.
func TestOvertakenFailureLeavesTheBreakerNoStaleCount(t *testing.T) {
	clock := testutil.NewClock()
	var events []EventKind
	b := New(Options{
		Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1, PanicThreshold: -1,
		OnEvent: func(ev Event) { events = append(events, ev.Kind) },
	})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}))
	serial, ok := b.Serial("a")
	require.True(t, ok)
	pick := func() *Pick {
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		require.Equal(t, "a", p.ID())
		return &p
	}
	failed, succeeded := pick(), pick()
	overtaken := false
	b.beforeBrMu = func() {
		if !overtaken {
			overtaken = true
			succeeded.Done(inferlb.Outcome{}) // overtakes the failure
		}
	}
	failed.Done(inferlb.Outcome{Err: errFailed})
	b.beforeBrMu = nil
	require.True(t, overtaken)

	for range 100 { // the endpoint is healthy again
		pick().Done(inferlb.Outcome{})
	}
	for range DefaultBreakerFailures - 1 {
		pick().Done(inferlb.Outcome{Err: errFailed})
	}
	assert.Empty(t, events, "%d failures after 100 successes trip no breaker", DefaultBreakerFailures-1)
	pick().Done(inferlb.Outcome{Err: errFailed})
	assert.Equal(t, []EventKind{EventTripped}, events, "the next one does")
}

// Calls that end neither in success nor failure (a cancellation, an
// overload, a client error, a model not served, a context window) on an
// endpoint whose breaker is closed reported to gobreaker under the
// endpoint's breaker mutex, and gobreaker's own, which counted each as a
// request and an exclusion: nothing a closed breaker trips on. Streams a
// user stops and refused calls are common; they now take no lock. On an
// open breaker they still report (a probe's slot is the breaker's).
func TestExcludedOutcomesOnAClosedBreakerTakeNoLock(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1, PanicThreshold: -1})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}))
	serial, ok := b.Serial("a")
	require.True(t, ok)
	locked := 0
	b.beforeBrMu = func() { locked++ }
	for _, o := range []inferlb.Outcome{
		{Err: context.Canceled},
		{Overloaded: true},
		{ClientError: true},
		{NotServedModel: "m"},
		{ContextWindow: 4096},
		{}, // a success with no failure streak
	} {
		p, err := b.PickAt(&inferlb.Request{Model: "m"}, serial)
		require.NoError(t, err)
		p.Done(o)
	}
	assert.Zero(t, locked, "reports that took the breaker's mutex on a closed breaker")

	for range DefaultBreakerFailures {
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errFailed})
	}
	assert.Equal(t, DefaultBreakerFailures, locked, "every failure reports")
}
