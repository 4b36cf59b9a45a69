package decay

import (
	"math"
	"testing"
)

func TestWeightApproximatesExp(t *testing.T) {
	prev := 2.0
	for x := 0.0; x <= 40; x += 0.01 {
		w := Weight(x)
		if d := math.Abs(w - math.Exp(-x)); d > 0.02 {
			t.Fatalf("Weight(%v) = %v, exp = %v", x, w, math.Exp(-x))
		}
		if w > prev || w < 0 || w > 1 {
			t.Fatalf("Weight(%v) = %v not in [0, 1] or not decreasing", x, w)
		}
		prev = w
	}
	if Weight(-1) != 1 || Weight(math.NaN()) != 1 || Weight(0) != 1 {
		t.Fatal("non-positive input must weigh 1")
	}
	if Weight(math.Inf(1)) != 0 {
		t.Fatal("infinite age must weigh 0")
	}
}

var sink float64

func BenchmarkWeight(b *testing.B) {
	x := 0.3
	for b.Loop() {
		sink += Weight(x)
	}
}

func BenchmarkExp(b *testing.B) {
	x := 0.3
	for b.Loop() {
		sink += math.Exp(-x)
	}
}
