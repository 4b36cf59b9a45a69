package balancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// With every probe slot taken, a new probe goes only once the probes out
// are overdue: not a moment before their deadline, at it, and then not
// again until the doubled wait has passed.
func TestOverdueProbeGoesAtItsDeadlineAndNotBefore(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}}))
	b.mu.Lock()
	e := b.eps["a"]
	b.mu.Unlock()

	due := clock.Now().Add(time.Minute).UnixNano()
	e.probeSlots.Store(0) // every probe out
	e.probeLife.Store(int64(10 * time.Second))
	e.probeDue.Store(due)

	assert.False(t, b.takeProbe(e, due-int64(500*time.Millisecond)), "half a second before the deadline")
	assert.False(t, b.takeProbe(e, due-1), "a nanosecond before it")
	require.True(t, b.takeProbe(e, due), "at the deadline")
	assert.Equal(t, due+int64(20*time.Second), e.probeDue.Load(), "the next wait doubles")
	assert.False(t, b.takeProbe(e, due+int64(19*time.Second)))
	assert.True(t, b.takeProbe(e, due+int64(20*time.Second)))
}
