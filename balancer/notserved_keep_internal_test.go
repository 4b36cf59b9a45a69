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
	one := make([]atomic.Uint64, lackWays)
	set := lackSets{one}
	const now, until = 1000, 2000
	assert.True(t, lackPut(set, 7, until, now, noStep, false))
	assert.True(t, keepEntry(set, 7, now, noStep))
	assert.False(t, lackPut(set, 7, until-500, now, noStep, true), "lapses no sooner already")
	assert.False(t, lackPut(set, 7, until-500, now, noStep, false))
	w, ok := entryOf(one, 7)
	require.True(t, ok)
	assert.EqualValues(t, until, w&lackTimeMask)
	assert.NotZero(t, w&lackKept)
	// Asked to keep a live entry not kept, the put keeps it, at its own time.
	assert.True(t, lackPut(set, 8, until, now, noStep, false))
	assert.False(t, lackPut(set, 8, until-500, now, noStep, true))
	w, _ = entryOf(one, 8)
	assert.EqualValues(t, until, w&lackTimeMask)
	assert.NotZero(t, w&lackKept)
	// Lapsed, it is not live, cannot be kept, and its slot's next entry
	// starts without the mark.
	_, ok = lackFind(set, 7, until, noStep)
	assert.False(t, ok)
	assert.False(t, keepEntry(set, 7, until, noStep))
	assert.True(t, lackPut(set, 7, until+100, until, noStep, false), "fresh again once lapsed")
	w, _ = entryOf(one, 7)
	assert.Zero(t, w&lackKept, "a lapsed entry's mark does not carry over")
	assert.EqualValues(t, until+100, w&lackTimeMask)
}

// The mark stays with its tag: a slot a kept entry held, once lapsed or
// given up, holds another tag unmarked; a full set gives up its entries not
// kept before kept ones, and a kept one only when all four are.
func TestLackKeptMarkStaysWithItsTag(t *testing.T) {
	one := make([]atomic.Uint64, lackWays)
	set := lackSets{one}
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
	for i := range one {
		if w := one[i].Load(); lackTag(w) != 1 {
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
	one := make([]atomic.Uint64, lackWays)
	set := lackSets{one}
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
	for i := range one {
		w := one[i].Load()
		if lackTag(w) != kept {
			assert.Zero(t, w&lackKept, "slot %d: %x", i, w)
		} else {
			assert.LessOrEqual(t, w&lackTimeMask, uint64(now+maxUntil))
		}
	}
}

// An entry may live in either of two sets: a new one goes to the set with
// more free or lapsed slots, is found, extended, kept and forgotten there,
// and when both are full of live entries the one to give up is chosen
// across both (not kept, lapsing first).
func TestLackTwoSets(t *testing.T) {
	a, b := make([]atomic.Uint64, lackWays), make([]atomic.Uint64, lackWays)
	sets := lackSets{a, b}
	const now = 1000
	lackPut(lackSets{a}, 1, now+500, now, noStep, false) // a has 3 free, b 4
	assert.True(t, lackPut(sets, 2, now+600, now, noStep, false))
	_, inA := entryOf(a, 2)
	_, inB := entryOf(b, 2)
	assert.True(t, inB && !inA, "the emptier set takes it")
	assert.False(t, lackPut(sets, 2, now+700, now, noStep, true), "live in the second set: extended there")
	w, ok := lackFind(sets, 2, now, noStep)
	require.True(t, ok)
	assert.EqualValues(t, now+700, w&lackTimeMask)
	assert.NotZero(t, w&lackKept)
	_, inA = entryOf(a, 2)
	assert.False(t, inA, "not written twice")
	// Fill both: a's entries not kept lapse at now+300..; b's at now+800..
	for tag := uint64(10); tag < 13; tag++ {
		lackPut(lackSets{a}, tag, now+300+tag, now, noStep, true)
	}
	for tag := uint64(20); tag < 23; tag++ {
		lackPut(lackSets{b}, tag, now+800+tag, now, noStep, false)
	}
	// a: 1 (not kept, now+500), 10..12 kept; b: 2 kept, 20..22 not kept.
	assert.True(t, lackPut(sets, 30, now+2000, now, noStep, false))
	_, ok = lackFind(sets, 1, now, noStep)
	assert.False(t, ok, "the entry not kept that lapses first, in either set, is given up")
	for _, tag := range []uint64{2, 10, 11, 12, 20, 21, 22, 30} {
		_, ok := lackFind(sets, tag, now, noStep)
		assert.True(t, ok, "tag %d", tag)
	}
	// Once b's entries not kept lapse, a newcomer takes one of b's slots.
	assert.True(t, lackPut(sets, 40, now+3000, now+900, noStep, false))
	_, inB = entryOf(b, 40)
	assert.True(t, inB)
	p := &lackTable{horizon: noStep}
	e := &endpoint{serial: 3}
	ps, tag := lackSet(p.pairs[:], pairKey(e.serial, 99))
	require.NotNil(t, ps[1], "this key's two choices differ")
	lackPut(lackSets{ps[1]}, tag, now+100, now, noStep, false)
	assert.True(t, p.lacks(e, 99, now), "found in its second set")
	p.forget(e, 99)
	assert.False(t, p.lacks(e, 99, now), "forgotten in its second set")
}
