package balancer

import (
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
