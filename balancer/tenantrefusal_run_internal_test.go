package balancer

import (
	"math"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A run's word counts the tenant's answers elsewhere from the run's
// first refusal: served ones, and refused ones less the run's own; it
// restarts with a new run or a new slot of the tenant's (its counts
// reset), and refusals past the run's first refusalOwnRun, not counted,
// or past a full count (refusalRunMax), change nothing. The counts are taken modulo 1<<refusalRunBits, through a refused
// count below the run's length (a slot reset while the run went on) and
// the 32-bit halves' wrap.
func TestRefusalRunCountsAnswersElsewhere(t *testing.T) {
	for _, base := range []uint64{0, 5<<32 | 7, 1<<32 - 1, 0xffffff<<32 | 0xfffffe} {
		c := base + 1 // the run's first refusal
		run := refusalRun(0xdead, 0, 1, c, 3)
		k, m := refusalElsewhere(run, c, 1)
		assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m}, "base %#x: a new run", base)

		c += 4*refusalServed + 2 // elsewhere: 4 served, 2 refused
		c++                      // here: the run's second refusal
		run = refusalRun(run, 1, 2, c, 3)
		k, m = refusalElsewhere(run, c, 2)
		assert.Equal(t, [2]uint64{4, 2}, [2]uint64{k, m}, "base %#x: after 4 served and 2 refused elsewhere", base)

		// Refusals here past the first refusalOwnRun are not counted
		// in c, nor past a full count in the run's length.
		for n := uint64(3); n <= refusalRunMax+5; n++ {
			if n <= refusalOwnRun {
				c++
			}
			run = refusalRun(run, min(n-1, refusalRunMax), min(n, refusalRunMax), c, 3)
		}
		k, m = refusalElsewhere(run, c, refusalRunMax)
		assert.Equal(t, [2]uint64{4, 2}, [2]uint64{k, m}, "base %#x: past a full count", base)

		// The tenant's slot taken anew (births differ): its counts
		// restarted, and the run is weighed from now on. This refusal,
		// past the run's first refusalOwnRun, is not in them.
		c2 := uint64(0)
		run = refusalRun(run, refusalRunMax, refusalRunMax, c2, 4)
		k, m = refusalElsewhere(run, c2, refusalRunMax)
		assert.Equal(t, [2]uint64{0, 0}, [2]uint64{k, m}, "base %#x: a new slot", base)
		c2 += refusalServed
		run = refusalRun(run, refusalRunMax, refusalRunMax, c2, 4)
		k, m = refusalElsewhere(run, c2, refusalRunMax)
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
// in 32; of refusalRunMax, 127, 1 in 128), none served leaves it to the
// share, and with none refused elsewhere a run of 31 needs 6 served (1 in
// 2,324,784; 5 is 1 in 376,992), one of 39 5 (1 in 1,086,008; 38 is 1 in
// 962,598), one of 68 4; no run shorter than the share asks of a tenant
// never refused (needRun(0), 6) is, however many were served. The runs
// that marked a tenant bad at 90% and 95% everywhere in the sweeps
// (TestTenantRefusalSweepBadEverywhere) with runs counted to 255, 132
// and 214 long, are unlikely by the test; shortened to refusalRunMax they
// are not.
func TestRefusalUnlikely(t *testing.T) {
	for _, tc := range []struct {
		n, k, m uint64
		want    bool
	}{
		{31, 0, 0, false},
		{28, 1, 0, false},
		{31, 1, 0, false},
		{31, 5, 0, false},
		{31, 6, 0, true},
		{31, 6, 1, false},
		{38, 5, 0, false},
		{39, 5, 0, true},
		{67, 4, 0, false},
		{68, 4, 0, true},
		{refusalRunMax, 1, 0, false},
		{refusalRunMax, 3, 0, false},
		{refusalRunMax, 4, 0, true},
		{132, 157, 1354, true},
		{refusalRunMax, 157, 1354, false},
		{214, 46, 568, true},
		{refusalRunMax, 46, 568, false},
		{10, 40, 0, true},
		{10, 40, 40, false},
		{3, 1 << 20, 0, false}, // shorter than needRun(0)
		{5, 1 << 20, 0, false},
		{6, 1 << 20, 0, true},
	} {
		assert.Equal(t, tc.want, refusalUnlikely(tc.n, tc.k, tc.m), "n %d, k %d, m %d", tc.n, tc.k, tc.m)
	}
}

// The full count bounds whom the test can mark: the chance is at least
// exp(-k n/m), so with n at most refusalRunMax (127) a tenant refused at
// m/(m+k) >= 127/(127+ln 1e6), 90.2% of its answers elsewhere, has no
// endpoint passed over by it, however long the run or many the answers.
func TestRefusalUnlikelyNeverAboveTheFullCountsRate(t *testing.T) {
	for k := uint64(1); k <= 20000; k += 1 + k/50 {
		m := uint64(math.Ceil(float64(k) * refusalRunMax / math.Log(1/refusalChance)))
		assert.False(t, refusalUnlikely(refusalRunMax, k, m), "k %d, m %d", k, m)
	}
}

// A run's length counts past the entry's 5-bit field, to refusalRunMax:
// tenant A's calls refused on e0 and 5 served on e1 during the run, none
// refused elsewhere, e0 is passed over at the 39th refusal in a row (1 in
// 1,086,008 for a tenant refused alike everywhere), not at the 38th; with
// the count stopping at 31 (1 in 376,992) it never was. With 3 served on
// e1 it is not even at the full count (127: 1 in 357,760), and the count
// stays full past it, the run's weight unchanged.
func TestTenantRunCountsPastTheEntrysField(t *testing.T) {
	for _, tc := range []struct {
		served int
		at     int // the refusal that marks e0, 0 for none
	}{{5, 39}, {3, 0}} {
		clock := testutil.NewClock()
		b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "e0"}, {Addr: "e1"}, {Addr: "e2"}}))
		nowNs := func() int64 { return clock.Now().UnixNano() }
		got := 0
		for n := 1; n <= 200; n++ {
			clock.Advance(time.Millisecond)
			if b.tenantRefused(b.eps["e0"], "A", nowNs()) {
				require.Zero(t, got, "%d served elsewhere: a second pass-over began at refusal %d", tc.served, n)
				got = n
			}
			if n <= tc.served {
				b.tenantServed(b.eps["e1"], "A", nowNs(), false)
			}
		}
		assert.Equal(t, tc.at, got, "%d served elsewhere: the refusal that began e0's pass-over", tc.served)
		tb := b.refused.Load()
		lens := []uint8{}
		for i := range tb.pairs {
			if tb.pairs[i].Load() != 0 {
				require.Equal(t, b.eps["e0"].serial, tb.owners[i].Load(), "%d served elsewhere: the one pair is e0's", tc.served)
				lens = append(lens, tb.lens[i])
			}
		}
		assert.Equal(t, []uint8{refusalRunMax}, lens, "%d served elsewhere: e0's run", tc.served)
	}
}

// Refusals at an endpoint past the first refusalOwnRun of its own run
// are not counted among the tenant's refusals elsewhere: e1 refusing A's
// calls 100 times in a row, then e0 and e1 each A's next call in turn,
// and e2 serving 5 of them early on, e0 is passed over at its 39th
// refusal in a row (k 5, m 0: 1 in 1,086,008), as if e1 refused nothing
// meanwhile. Counting e1's refusals, m is about n, and e0 never was.
// e1's own first 63, while e0's run had not begun, weigh nothing against
// e0's.
func TestTenantRefusalsOfAnotherLongRunAreItsOwn(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "e0"}, {Addr: "e1"}, {Addr: "e2"}, {Addr: "e3"}}))
	nowNs := func() int64 { return clock.Now().UnixNano() }
	for range 100 {
		clock.Advance(time.Millisecond)
		b.tenantRefused(b.eps["e1"], "A", nowNs())
	}
	got := 0
	for n := 1; n <= 120; n++ {
		clock.Advance(time.Millisecond)
		if b.tenantRefused(b.eps["e0"], "A", nowNs()) && got == 0 {
			got = n
		}
		b.tenantRefused(b.eps["e1"], "A", nowNs())
		if n <= 5 {
			b.tenantServed(b.eps["e2"], "A", nowNs(), false)
		}
	}
	assert.Equal(t, 39, got, "the refusal of e0's run that began its pass-over")
}

// The memory's size, as the docs quote it (41 KiB, allocated at the first
// refusal that names a tenant): go test -run TestRefusalTableSize -v ./balancer/
func TestRefusalTableSize(t *testing.T) {
	size := unsafe.Sizeof(refusalTable{})
	t.Logf("refusalTable: %d bytes", size)
	assert.LessOrEqual(t, size, uintptr(41<<10))
}
