package balancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A run's word counts the tenant's answers elsewhere from the run's
// first refusal: served ones, and refused ones less the run's own; it
// restarts with a new run or a new slot of the tenant's (its counts
// reset), and refusals past a full count stay the run's own. The counts
// are taken modulo 1<<refusalRunBits, through a refused count below the
// run's length (a slot reset while the run went on) and the 32-bit
// halves' wrap.
func TestRefusalRunCountsAnswersElsewhere(t *testing.T) {
	entry := func(count uint64) uint64 { return count<<refusalCountShift | 1 }
	for _, base := range []uint64{0, 5<<32 | 7, 1<<32 - 1, 0xffffff<<32 | 0xfffffe} {
		c := base + 1 // the run's first refusal
		run := refusalRun(0xdead, 0, 1, c, 3)
		k, m := refusalElsewhere(run, c, 1)
		assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m}, "base %#x: a new run", base)

		c += 4*refusalServed + 2 // elsewhere: 4 served, 2 refused
		c++                      // here: the run's second refusal
		run = refusalRun(run, entry(1), 2, c, 3)
		k, m = refusalElsewhere(run, c, 2)
		assert.Equal(t, [2]uint64{4, 2}, [2]uint64{k, m}, "base %#x: after 4 served and 2 refused elsewhere", base)

		// Refusals here past a full count are the run's own.
		for n := uint64(3); n <= refusalCountMask+5; n++ {
			c++
			prev := min(n-1, refusalCountMask)
			run = refusalRun(run, entry(prev), min(n, refusalCountMask), c, 3)
		}
		k, m = refusalElsewhere(run, c, refusalCountMask)
		assert.Equal(t, [2]uint64{4, 2}, [2]uint64{k, m}, "base %#x: past a full count", base)

		// The tenant's slot taken anew (births differ): its counts
		// restarted, and the run is weighed from now on.
		c2 := uint64(1)
		run = refusalRun(run, entry(refusalCountMask), refusalCountMask, c2, 4)
		k, m = refusalElsewhere(run, c2, refusalCountMask)
		assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m}, "base %#x: a new slot", base)
		c2 += refusalServed + 1
		run = refusalRun(run, entry(refusalCountMask), refusalCountMask, c2, 4)
		k, m = refusalElsewhere(run, c2, refusalCountMask)
		assert.Equal(t, [2]uint64{1, 0}, [2]uint64{k, m}, "base %#x: one served in the new slot", base)

		// A new run (the pair's entry ended by a success there).
		c2 += 7*refusalServed + 1
		run = refusalRun(run, 0, 1, c2, 4)
		k, m = refusalElsewhere(run, c2, 1)
		assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m}, "base %#x: a new run again", base)
	}
	// Counts that disagree with the run (fewer refused than its length)
	// weigh nothing.
	k, m := refusalElsewhere(5<<refusalRunBits|10, 9<<32|12, 3)
	assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m})
}

// A run is unlikely, against the tenant's answers elsewhere, by Fisher's
// exact test: one call served elsewhere never makes one (a run of 31, 1
// in 32), none served leaves it to the share, and with none refused
// elsewhere a full run needs 6 served (1 in 2,324,784; 5 is 1 in 376,992);
// no run shorter than the share asks of a tenant never refused
// (needRun(0), 6) is, however many were served.
func TestRefusalUnlikely(t *testing.T) {
	for _, tc := range []struct {
		n, k, m uint64
		want    bool
	}{
		{refusalCountMask, 0, 0, false},
		{28, 1, 0, false},
		{refusalCountMask, 1, 0, false},
		{refusalCountMask, 5, 0, false},
		{refusalCountMask, 6, 0, true},
		{refusalCountMask, 6, 1, false},
		{10, 40, 0, true},
		{10, 40, 40, false},
		{3, 1 << 20, 0, false}, // shorter than needRun(0)
		{5, 1 << 20, 0, false},
		{6, 1 << 20, 0, true},
	} {
		assert.Equal(t, tc.want, refusalUnlikely(tc.n, tc.k, tc.m), "n %d, k %d, m %d", tc.n, tc.k, tc.m)
	}
}
