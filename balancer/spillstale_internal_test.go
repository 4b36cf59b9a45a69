package balancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A spill older than the spill memory is cold, but the table's read
// refreshed its slot's expiry: an entry read on every pick of its key
// (stayAway looks at the next endpoints in the key's walk) held its slot
// for good and, expiring last, pushed the warm entries of its set out
// first. The read that finds it cold forgets it.
func TestAColdSpillLeavesTheTable(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, SpillMemory: time.Minute})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:1"}, {ID: "b", Addr: "b:1"}}))
	g := b.def.snap.Load().all
	const cold, warm = 101, 202
	b.spilled(cold, g, 0, clock.Now().UnixNano())
	for range 5 {
		// Read often, as a key's walk is: each read within the memory
		// refreshes the slot.
		clock.Advance(10 * time.Second)
		require.True(t, b.warmFor(cold, g, 0, clock.Now().UnixNano()))
	}
	clock.Advance(30 * time.Second)
	b.spilled(warm, g, 0, clock.Now().UnixNano())
	require.Equal(t, 2, b.spills.Len(), "both in the table before the cold one is read again")

	nowNs := clock.Now().UnixNano()
	assert.False(t, b.warmFor(cold, g, 0, nowNs), "80 s after its spill, with a memory of 60 s")
	assert.True(t, b.warmFor(warm, g, 0, nowNs))
	_, ok := b.spills.Get(spillKey(cold, g.members[0]))
	assert.False(t, ok, "the cold spill still holds its slot")
	assert.Equal(t, 1, b.spills.Len())
}
