package balancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An adapter counts in one of its two entries; a third adapter whose two
// entries both hold others' calls is not counted (and reads as rare), and
// an entry is free again once its calls end.
func TestAdapterCountsEntries(t *testing.T) {
	a := &adapterCounts{seed: 99}
	h := modelID("sql")
	i, j := a.entries(h)
	assert.NotEqual(t, i, j, "two entries (for this name and seed)")
	e1 := a.add(h)
	e2 := a.add(h)
	assert.NotZero(t, e1)
	assert.Equal(t, e1, e2, "a second call counts in the same entry")
	assert.EqualValues(t, 2, a.count(h))

	// Two other adapters that take h's entries (found by search: the
	// table has 64 entries).
	var others []uint64
	for k := 0; len(others) < 2 && k < 1_000_000; k++ {
		o := modelID(string(rune('a'+k%26)) + string(rune(k)))
		oi, oj := a.entries(o)
		if loraTag(o) == loraTag(h) {
			continue
		}
		if (len(others) == 0 && oi == j) || (len(others) == 1 && oi == int(e1)-1 && oj != j) {
			others = append(others, o)
		}
	}
	if len(others) < 2 {
		t.Skip("no colliding names found")
	}
	a.flight[e1-1].Add(^uint64(0))
	a.flight[e1-1].Add(^uint64(0)) // h's calls end: its entry is free
	assert.Zero(t, a.count(h))
	o1 := a.add(others[0])
	o2 := a.add(others[1])
	assert.NotZero(t, o1)
	assert.NotZero(t, o2)
	assert.Zero(t, a.add(h), "both of h's entries hold others' calls")
	assert.Zero(t, a.count(h))
	a.flight[o1-1].Add(^uint64(0))
	assert.NotZero(t, a.add(h), "one of them is free again")
	assert.EqualValues(t, 1, a.count(h))
}
