package cache

import (
	"math"
	"testing"
)

// pointsOf counts each member's points on the ring.
func pointsOf(p *Placement) map[int]int {
	c := map[int]int{}
	for _, pt := range p.points {
		c[int(pt&memberMask)]++
	}
	return c
}

// Member.Weight documents that any non-positive or non-finite weight means
// 1: +Inf too, not MaxWeight (which min would make of it), so a member
// reporting an infinite capacity does not take almost every key.
func TestNonFiniteWeightMeansOne(t *testing.T) {
	ms := []Member{{ID: "a", Weight: 1}, {ID: "inf", Weight: math.Inf(1)}, {ID: "nan", Weight: math.NaN()},
		{ID: "neg", Weight: math.Inf(-1)}, {ID: "zero", Weight: 0}}
	got := pointsOf(NewPlacement(ms, 3))
	for i, m := range ms {
		if got[i] != PointsPerWeight {
			t.Errorf("member %q of weight %v has %d points, want %d (weight 1)", m.ID, m.Weight, got[i], PointsPerWeight)
		}
	}
}

// A weight above MaxWeight counts as MaxWeight: two members, one at twice
// the cap, split the (scaled) ring evenly.
func TestWeightAboveMaxWeightCountsAsMaxWeight(t *testing.T) {
	ms := []Member{{ID: "max", Weight: MaxWeight}, {ID: "twice", Weight: 2 * MaxWeight}}
	got := pointsOf(NewPlacement(ms, 3))
	if got[0] != got[1] || got[0] == 0 {
		t.Errorf("points %d (weight MaxWeight) and %d (2 x MaxWeight), want equal: weights are capped at MaxWeight", got[0], got[1])
	}
}

// A member's points are its weight x PointsPerWeight rounded to the
// nearest, not truncated: weight 0.029 is 2.9 points, so 3.
func TestPointsRoundToNearest(t *testing.T) {
	for _, tc := range []struct {
		w    float64
		want int
	}{{0.029, 3}, {0.021, 2}, {1.006, 101}, {2.994, 299}} {
		got := pointsOf(NewPlacement([]Member{{ID: "a", Weight: tc.w}}, 3))[0]
		if got != tc.want {
			t.Errorf("weight %v: %d points, want %d", tc.w, got, tc.want)
		}
	}
}

// A walk makes one whole turn of the ring: a member whose only point is the
// one just before the owner's is the last point the walk reaches, and it is
// still offered (Walk.Next: every member is offered at least once).
func TestWalkReachesThePointJustBeforeTheOwner(t *testing.T) {
	ms := []Member{{ID: "big", Weight: 1}, {ID: "tiny", Weight: 0.001}}
	p := NewPlacement(ms, 9)
	tiny := -1
	for i, pt := range p.points {
		if pt&memberMask == 1 {
			tiny = i
		}
	}
	if tiny < 0 {
		t.Fatal("the tiny member has no point")
	}
	after := int32((tiny + 1) % len(p.points))
	found := 0
	for k := uint64(0); k < 1_000_000 && found < 5; k++ {
		w := p.Walk(k)
		if w.i != after {
			continue
		}
		found++
		var order []int
		for m, ok := w.Next(); ok; m, ok = w.Next() {
			order = append(order, m)
		}
		if len(order) != 2 || order[0] != 0 || order[1] != 1 {
			t.Errorf("key %d, owned by the point after the tiny member's: offered %v, want [0 1]", k, order)
		}
	}
	if found == 0 {
		t.Fatal("no key found at the point after the tiny member's")
	}
}

// The bucket index has the least power of two of buckets that holds the
// ring at pointsPerBucket a bucket (a scaled ring: its cap), which sets the
// precision positions compare at; one more doubling at a ring of exactly
// buckets x pointsPerBucket points would change it.
func TestBucketsAreTheLeastPowerOfTwoThatHoldsTheRing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ms      []Member
		buckets int
	}{
		{"1024 points", []Member{{ID: "a", Weight: 10.24}}, 1024 / pointsPerBucket},
		{"1025 points", []Member{{ID: "a", Weight: 10.25}}, 2 * 1024 / pointsPerBucket},
		{"one point", []Member{{ID: "a", Weight: 0.001}}, 1},
		{"scaled to the cap", []Member{{ID: "a", Weight: MaxWeight}, {ID: "b", Weight: MaxWeight}}, MaxRingPoints / pointsPerBucket},
	} {
		p := NewPlacement(tc.ms, 3)
		if got := len(p.index) - 1; got != tc.buckets {
			t.Errorf("%s (%d points): %d buckets, want %d", tc.name, len(p.points), got, tc.buckets)
		}
	}
}
