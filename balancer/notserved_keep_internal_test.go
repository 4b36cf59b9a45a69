package balancer

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noStep is a horizon no entry of these tests lapses beyond: the clock
// never steps back in them.
const noStep = lackTimeMask

// entryOf returns set's entry of tag, lapsed or not, and whether it has one.
func entryOf(set []atomic.Uint64, tag uint64) (uint64, bool) {
	for i := range set {
		if w := set[i].Load(); w != 0 && lackTag(w) == tag {
			return w, true
		}
	}
	return 0, false
}

// A kept entry lapses when it was written to: keeping it (keepEntry,
// or a put asking for it) never extends it, and a put for a sooner time
// leaves it as it was.
func TestLackKeptEntryLapsesOnTime(t *testing.T) {
	set := make([]atomic.Uint64, lackWays)
	const now, until = 1000, 2000
	assert.True(t, lackPut(set, 7, until, now, noStep, false))
	assert.True(t, keepEntry(set, 7, now, noStep))
	assert.False(t, lackPut(set, 7, until-500, now, noStep, true), "lapses no sooner already")
	assert.False(t, lackPut(set, 7, until-500, now, noStep, false))
	w, ok := entryOf(set, 7)
	require.True(t, ok)
	assert.EqualValues(t, until, w&lackTimeMask)
	assert.NotZero(t, w&lackKept)
	// Asked to keep a live entry not kept, the put keeps it, at its own time.
	assert.True(t, lackPut(set, 8, until, now, noStep, false))
	assert.False(t, lackPut(set, 8, until-500, now, noStep, true))
	w, _ = entryOf(set, 8)
	assert.EqualValues(t, until, w&lackTimeMask)
	assert.NotZero(t, w&lackKept)
	// Lapsed, it is not live, cannot be kept, and its slot's next entry
	// starts without the mark.
	_, ok = lackFind(set, 7, until, noStep)
	assert.False(t, ok)
	assert.False(t, keepEntry(set, 7, until, noStep))
	assert.True(t, lackPut(set, 7, until+100, until, noStep, false), "fresh again once lapsed")
	w, _ = entryOf(set, 7)
	assert.Zero(t, w&lackKept, "a lapsed entry's mark does not carry over")
	assert.EqualValues(t, until+100, w&lackTimeMask)
}

// The mark stays with its tag: a slot a kept entry held, once lapsed or
// given up, holds another tag unmarked; a full set gives up its entries not
// kept before kept ones, and a kept one only when all four are.
func TestLackKeptMarkStaysWithItsTag(t *testing.T) {
	set := make([]atomic.Uint64, lackWays)
	const now = 1000
	lackPut(set, 1, now+50, now, noStep, true) // kept, lapsing first of all
	for tag := uint64(2); tag <= 4; tag++ {
		lackPut(set, tag, now+100*tag, now, noStep, false)
	}
	for tag := uint64(5); tag < 50; tag++ { // made-up names evict each other
		lackPut(set, tag, now+1000+tag, now, noStep, false)
		w, ok := lackFind(set, 1, now, noStep)
		require.True(t, ok, "the kept entry is given up for a made-up name's")
		assert.NotZero(t, w&lackKept)
	}
	for i := range set {
		if w := set[i].Load(); lackTag(w) != 1 {
			assert.Zero(t, w&lackKept, "slot %d: %x", i, w)
		}
	}
	// All four kept: the one that lapses first is given up, and the
	// newcomer is not kept.
	for tag := uint64(100); tag < 103; tag++ {
		lackPut(set, tag, now+2000+tag, now, noStep, true)
	}
	lackPut(set, 200, now+5000, now, noStep, false)
	_, ok := lackFind(set, 1, now, noStep)
	assert.False(t, ok, "kept, it lapsed first")
	w, ok := lackFind(set, 200, now, noStep)
	require.True(t, ok)
	assert.Zero(t, w&lackKept)
	// Past its time, the kept entry's slot goes first, unmarked.
	lackPut(set, 300, now+9000, now+2100, noStep, false)
	w, ok = lackFind(set, 300, now+2100, noStep)
	require.True(t, ok)
	assert.Zero(t, w&lackKept)
	for tag := uint64(100); tag < 103; tag++ {
		_, ok := lackFind(set, tag, now+2100, noStep)
		assert.Equal(t, tag != 100, ok, "tag %d", tag)
	}
}

// Several goroutines put made-up tags into one set while others put and
// keep one served tag: the mark never lands on another tag, the served
// one is never given up for a made-up one, and never outlives what was
// written for it. Run with -race.
func TestLackKeepConcurrentPuts(t *testing.T) {
	set := make([]atomic.Uint64, lackWays)
	const now, kept, maxUntil = 1000, 9, 5000
	lackPut(set, kept, now+10, now, noStep, true)
	var wg sync.WaitGroup
	var stop atomic.Bool
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < 20000 && !stop.Load(); i++ {
				tag := uint64(100 + r.IntN(1000))
				lackPut(set, tag, now+1+uint64(r.IntN(maxUntil-1)), now, noStep, false)
			}
		}()
	}
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 2))
			for range 20000 {
				lackPut(set, kept, now+1+uint64(r.IntN(maxUntil-1)), now, noStep, r.IntN(2) == 0)
				keepEntry(set, kept, now, noStep)
				if w, ok := lackFind(set, kept, now, noStep); !ok || w&lackKept == 0 {
					stop.Store(true)
					t.Errorf("the kept tag's entry: %x, %v", w, ok)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := range set {
		w := set[i].Load()
		if lackTag(w) != kept {
			assert.Zero(t, w&lackKept, "slot %d: %x", i, w)
		} else {
			assert.LessOrEqual(t, w&lackTimeMask, uint64(now+maxUntil))
		}
	}
}
