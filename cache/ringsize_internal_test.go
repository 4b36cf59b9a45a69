package cache

import "testing"

// The ring's size follows the number of members, not their weights: 4,096
// members of weight 64 put 26 million points on the ring, 323 MB and 4.2 s
// at every membership change (BenchmarkNewPlacementWeighted), before the
// ring was scaled to MaxRingPoints. Weight-1 rings are not scaled.
func TestRingSizeIsBounded(t *testing.T) {
	heavyOne := members(4096)
	heavyOne[7].Weight = MaxWeight
	for _, tc := range []struct {
		name string
		ms   []Member
		// exact: the ring's points when it is not scaled, or 0
		exact int
	}{
		{"4096 of weight 1", weighted(4096, 1), 4096 * PointsPerWeight},
		{"4096 of weight 64", weighted(4096, 64), 0},
		{"4096 of weight above MaxWeight", weighted(4096, 1e12), 0},
		{"one of MaxWeight beside 4095 of weight 1", heavyOne, 0},
		{"16 of weight 64", weighted(16, 64), 16 * 64 * PointsPerWeight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlacement(tc.ms, 42)
			n := len(tc.ms)
			got := len(p.points)
			if tc.exact > 0 {
				if got != tc.exact {
					t.Errorf("%d points, want %d: a ring within the cap is not scaled", got, tc.exact)
				}
				return
			}
			limit := max(MaxRingPoints, PointsPerWeight*n)
			if got > limit+n {
				t.Errorf("%d points, want at most max(MaxRingPoints, PointsPerWeight*n) + n = %d", got, limit+n)
			}
			if got < limit/2-n {
				t.Errorf("%d points, want at least half the cap less n: %d (scaled down too far)", got, limit/2-n)
			}
			if got < n {
				t.Errorf("%d points for %d members: every member has a point", got, n)
			}
		})
	}
}

// A member far heavier than the others keeps their shares at their
// weights: with weights clamped to 64, four members of weight 1 beside one
// of 200 each owned about 1/68 (1.5%) of the keys against a 1/204 (0.49%)
// share. Weights in tokens per second (100 and 800) split keys 1:8, not
// 1:1 as they did.
func TestHeavyMembersKeepTheirRatios(t *testing.T) {
	ms := weighted(5, 1)
	ms[4].Weight = 200
	share := arcShares(NewPlacement(ms, 42))
	for i := range 4 {
		// 100 points: one standard deviation is 10% of the share.
		if got, want := share[i], 1.0/204; got < 0.65*want || got > 1.35*want {
			t.Errorf("member %d of weight 1 beside one of 200 owns %.3f%% of the keys, want about %.3f%%", i, 100*got, 100*want)
		}
	}

	ms = weighted(16, 100)
	for i := range 8 {
		ms[i].Weight = 800
	}
	share = arcShares(NewPlacement(ms, 42))
	heavy, light := 0.0, 0.0
	for i, s := range share {
		if i < 8 {
			heavy += s
		} else {
			light += s
		}
	}
	if r := heavy / light; r < 7.5 || r > 8.5 {
		t.Errorf("8 members of weight 800 own %.2fx the keys of 8 of weight 100, want 8x", r)
	}
}

// A change that takes the ring across the cap gives every member fewer
// points, and each keeps the first of its own: only the keys of the
// dropped points move, as many as the scale changed. Scaled by powers of
// two, this change halved every member's points and moved 45% of the keys
// between unchanged members; scaled to fit, each keeps 98.5% of its points
// and 1.2% of the keys move between them (1,241 of 100,000; some of the
// dropped points' keys go to the heavier member).
func TestScaleChangeKeepsEachMembersFirstPoints(t *testing.T) {
	// 64 x 160 x 100 = 1,024,000 points, just within MaxRingPoints; one
	// member at 560 takes the ring over, to 1,048,576/1,064,000 of its
	// points each.
	ms := weighted(64, 160)
	p := NewPlacement(ms, 9)
	heavier := weighted(64, 160)
	heavier[5].Weight = 560
	q := NewPlacement(heavier, 9)
	if len(p.points) != 64*160*PointsPerWeight {
		t.Fatalf("%d points before, want the ring unscaled", len(p.points))
	}
	// 16,000 x 1,048,576/1,064,000 = 15,768.05; 56,000 x it = 55,188.17.
	if want := 63*15768 + 55188; len(q.points) != want {
		t.Fatalf("%d points after, want %d: every point count scaled alike", len(q.points), want)
	}

	// Compare positions at the coarser of the two resolutions.
	res := min(64-p.shift, 64-q.shift) + subBits
	coarse := func(r *Placement) map[[2]uint64]int {
		pos := positions(r)
		drop := 64 - r.shift + subBits - res
		set := map[[2]uint64]int{}
		for j, x := range pos {
			set[[2]uint64{x >> drop, uint64(uint16(r.points[j]))}]++
		}
		return set
	}
	before := coarse(p)
	for pt, c := range coarse(q) {
		if pt[1] == 5 {
			continue // the reweighted member
		}
		if before[pt] < c {
			t.Fatalf("member %d has a point at %x after the scale change that it did not have before", pt[1], pt[0])
		}
	}

	moved := movedBetweenOthers(p, q, 5, 5)
	t.Logf("a scale change moved %d of %d keys between unchanged members", moved, scaleKeys)
	if moved > scaleKeys*25/1000 {
		t.Errorf("a scale change moved %d of %d keys between unchanged members, want about 1.2%%", moved, scaleKeys)
	}
}

// An autoscaler stepping a fleet weighted in tokens per second (1,000 a
// replica) between 20 and 21 replicas moves the new replica's keys and, as
// every member's points shrink by 20/21, as many again between the 20 that
// stayed: about 4.5% of all keys. Scaled by powers of two, the ring sat on
// a threshold there (2.0 and 2.1 million points against a cap of 1.05
// million), halved every member's points at the step, and moved 44%.
func TestAutoscalerStepOnAScaledRingMovesFewKeys(t *testing.T) {
	ms := weighted(21, 1000)
	p := NewPlacement(ms[:20], 3)
	q := NewPlacement(ms, 3)
	moved := movedBetweenOthers(p, q, -1, 20)
	t.Logf("20 -> 21 replicas of weight 1,000 moved %d of %d keys between the 20", moved, scaleKeys)
	if moved > scaleKeys*7/100 {
		t.Errorf("20 -> 21 replicas of weight 1,000 moved %d of %d keys between the 20, want about 4.5%%", moved, scaleKeys)
	}
}

const scaleKeys = 100_000

// movedBetweenOthers counts the keys of scaleKeys whose owner differs on p
// and q, neither owner being member skipP of p or skipQ of q.
func movedBetweenOthers(p, q *Placement, skipP, skipQ int) int {
	moved := 0
	for k := range uint64(scaleKeys) {
		wp, wq := p.Walk(mix64(k)), q.Walk(mix64(k))
		a, _ := wp.Next()
		b, _ := wq.Next()
		if a != b && a != skipP && b != skipQ {
			moved++
		}
	}
	return moved
}

func weighted(n int, w float64) []Member {
	ms := members(n)
	for i := range ms {
		ms[i].Weight = w
	}
	return ms
}

// Members are listed in any order and the ring is the same: its scale
// comes from an integer total.
func TestRingScaleIgnoresOrder(t *testing.T) {
	ms := members(300)
	for i := range ms {
		ms[i].Weight = 1 + float64(i%7)*1e3/3
	}
	p := NewPlacement(ms, 5)
	rev := make([]Member, len(ms))
	for i, m := range ms {
		rev[len(ms)-1-i] = m
	}
	q := NewPlacement(rev, 5)
	if len(p.points) != len(q.points) || p.shift != q.shift {
		t.Fatalf("%d points (shift %d) in order, %d (shift %d) reversed", len(p.points), p.shift, len(q.points), q.shift)
	}
	for j := range p.points {
		a, b := p.points[j], q.points[j]
		if a>>memberBits != b>>memberBits || ms[uint16(a)].ID != rev[uint16(b)].ID {
			t.Fatalf("point %d differs", j)
		}
	}
}

// A scaled ring sizes its bucket index by its cap, also when rounding puts
// its points below the cap: with more than MaxRingPoints/PointsPerWeight
// members the cap is PointsPerWeight*n, which need not be a power of two
// times pointsPerBucket, and a ring rounded a few points under it could
// fall below one. Here 20,971 members of weight 1.5 keep 100 points each,
// 2,097,100 in all, under a cap of 2,097,200; one more member going from
// weight 1 (67 points) to 0.2 (13) took the ring from 2,097,167 points to
// 2,097,113, across 2^17 buckets of 16, which halved the buckets, so the
// precision of every position: keys moved between members whose points
// had not changed (5 of 100,000), where only the changed member's keys
// may move.
func TestScaledRingBelowItsCapKeepsItsBuckets(t *testing.T) {
	ms := weighted(20972, 1.5)
	ms[0].Weight = 1
	p := NewPlacement(ms, 11)
	ms[0].Weight = 0.2
	q := NewPlacement(ms, 11)
	if len(p.points) != 2_097_167 || len(q.points) != 2_097_113 {
		t.Fatalf("%d and %d points, want 2,097,167 and 2,097,113: the case is not the one meant", len(p.points), len(q.points))
	}
	if p.shift != q.shift {
		t.Errorf("shift %d before, %d after: the bucket index followed the ring's points, not its cap", p.shift, q.shift)
	}
	if moved := movedBetweenOthers(p, q, 0, 0); moved != 0 {
		t.Errorf("member 0's weight change moved %d of %d keys between the others, whose points are unchanged", moved, scaleKeys)
	}
}
