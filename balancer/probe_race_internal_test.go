package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A half-open breaker with one probe slot lets one probe through. When a
// probe had run past its deadline and then ended without a verdict (a
// long generation the caller canceled), its slot came back but the
// deadline stayed, in the past: of two picks racing for the slot, the one
// that lost found the old deadline overdue and went as a probe too (and
// doubled the wait before the next overdue probe), two probes for one
// slot.
func TestReturnedProbeSlotLeavesNoOverdueDeadline(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{
		Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1,
		BreakerFailures: 1, BreakerProbes: 1,
	})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}))
	b.mu.Lock()
	e := b.eps["a"]
	b.mu.Unlock()

	p, err := b.PickAt(&inferlb.Request{}, e.serial)
	require.NoError(t, err)
	require.Equal(t, "a", p.ID())
	p.Done(inferlb.Outcome{Err: context.DeadlineExceeded}) // trips
	require.True(t, e.brOpen.Load())

	clock.Advance(DefaultEjectionTime)
	probe, err := b.PickAt(&inferlb.Request{}, e.serial)
	require.NoError(t, err)
	require.NotZero(t, probe.flags&pickProbe, "the exclusion ended: a probe")
	clock.Advance(DefaultEjectionTime + time.Second) // past its deadline
	probe.Done(inferlb.Outcome{Err: context.Canceled})
	require.EqualValues(t, 1, e.probeSlots.Load(), "the slot is back")

	// Two picks race for the slot: the first has taken it (and not yet
	// set its deadline) when the second tries.
	nowNs := clock.Now().UnixNano()
	require.EqualValues(t, 0, e.probeSlots.Add(-1))
	assert.False(t, b.takeProbe(e, nowNs), "a second probe for the one slot")
}
