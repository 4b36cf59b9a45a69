package cache

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"
)

var figures = flag.Bool("figures", false, "print the placement comparison of the package doc")

type ownerFunc func(key uint64) int

func ringOwnerFunc(p *Placement) ownerFunc {
	return func(k uint64) int { w := p.Walk(k); m, _ := w.Next(); return m }
}

// moved counts keys whose owner ID differs between two placements.
func moved(a, b ownerFunc, ia, ib []Member, keys int) float64 {
	n := 0
	for k := range uint64(keys) {
		key := mix64(k + 0x1234567)
		if ia[a(key)].ID != ib[b(key)].ID {
			n++
		}
	}
	return float64(n) / float64(keys)
}

func maxOverMean(f ownerFunc, n, keys int) float64 {
	c := make([]int, n)
	for k := range uint64(keys) {
		c[f(mix64(k+0xabcdef))]++
	}
	mx := 0
	for _, v := range c {
		mx = max(mx, v)
	}
	return float64(mx) * float64(n) / float64(keys)
}

// ringShare is the exact largest share of the ring a member owns, over the
// mean share (members of weight 1).
func ringShare(p *Placement) float64 {
	share := make([]float64, p.n)
	pos := positions(p)
	res := 64 - p.shift + subBits
	for i, x := range pos {
		prev := pos[(i+len(pos)-1)%len(pos)]
		share[uint16(p.points[i])] += float64((x-prev)&(1<<res-1)) / float64(uint64(1)<<res)
	}
	return slices.Max(share) * float64(p.n)
}

func TestPlacementFigures(t *testing.T) {
	if !*figures {
		t.Skip("run with -args -figures")
	}
	for _, n := range []int{8, 16, 64, 512, 4096} {
		ms := members(n)
		less := ms[1:]
		more := members(n + 1)
		keys := 100_000
		for _, v := range []int{64, 100, 160} {
			t0 := time.Now()
			p := newPlacement(ms, 42, v)
			build := time.Since(t0)
			pl, pm := newPlacement(less, 42, v), newPlacement(more, 42, v)
			fmt.Printf("ring V=%-3d n=%-5d build %-10v mem %7d B  share max/mean %.3f  keys max/mean %.3f  remove1 %.3f/n  add1 %.3f/(n+1)\n",
				v, n, build.Round(time.Microsecond), 4*len(p.points)+4*len(p.index), ringShare(p), maxOverMean(ringOwnerFunc(p), n, 1000*n),
				moved(ringOwnerFunc(p), ringOwnerFunc(pl), ms, less, keys)*float64(n),
				moved(ringOwnerFunc(p), ringOwnerFunc(pm), ms, more, keys)*float64(n+1))
		}
		for _, m := range []int{65537, 262147} {
			t0 := time.Now()
			g := newMaglev(ms, 42, m)
			build := time.Since(t0)
			gl, gm := newMaglev(less, 42, m), newMaglev(more, 42, m)
			fmt.Printf("maglev M=%-6d n=%-5d build %-10v mem %7d B  keys max/mean %.3f  remove1 %.3f/n  add1 %.3f/(n+1)\n",
				m, n, build.Round(time.Microsecond), 2*m, maxOverMean(g.owner, n, 1000*n),
				moved(g.owner, gl.owner, ms, less, keys)*float64(n),
				moved(g.owner, gm.owner, ms, more, keys)*float64(n+1))
		}
		if n <= 512 {
			r := newRendezvous(ms, 42)
			rl, rm := newRendezvous(less, 42), newRendezvous(more, 42)
			rf := func(r *rendezvous) ownerFunc {
				return func(k uint64) int { w := r.Walk(k); m, _ := w.Next(); return m }
			}
			fmt.Printf("rendezvous n=%-5d keys max/mean %.3f  remove1 %.3f/n  add1 %.3f/(n+1)\n", n,
				maxOverMean(rf(r), n, 1000*n), moved(rf(r), rf(rl), ms, less, keys)*float64(n), moved(rf(r), rf(rm), ms, more, keys)*float64(n+1))
		}
	}
}

func TestMprobeFigures(t *testing.T) {
	if !*figures {
		t.Skip("run with -args -figures")
	}
	for _, n := range []int{16, 512, 4096} {
		ms := members(n)
		less, more := ms[1:], members(n+1)
		for _, vk := range [][2]int{{1, 21}, {4, 5}, {4, 9}, {8, 3}, {8, 5}, {16, 3}, {16, 5}} {
			f := func(ms []Member) ownerFunc { return newMprobe(ms, 42, vk[0], vk[1]).owner }
			fmt.Printf("mprobe V=%-2d K=%-2d n=%-5d keys max/mean %.3f  remove1 %.3f/n  add1 %.3f/(n+1)\n", vk[0], vk[1], n,
				maxOverMean(f(ms), n, 1000*n), moved(f(ms), f(less), ms, less, 100000)*float64(n), moved(f(ms), f(more), ms, more, 100000)*float64(n+1))
		}
	}
}

// TestSmallWeightsSpreadKeysUnevenly backs Endpoint.Weight's advice to give
// a standard replica weight 1 or more: a member gets one ring point per
// 1/PointsPerWeight of weight, so at weight 0.1 each of 100 equal members
// has 10 points and the busiest owns far more than the mean share of keys.
// go test -run TestSmallWeightsSpreadKeysUnevenly -v ./cache/ prints the
// figures the doc quotes (mean over 5 seeds).
func TestSmallWeightsSpreadKeysUnevenly(t *testing.T) {
	spread := func(w float64) float64 {
		sum := 0.0
		for seed := range uint64(5) {
			ms := make([]Member, 100)
			for i := range ms {
				ms[i] = Member{ID: fmt.Sprintf("m%d", i), Weight: w}
			}
			sum += maxOverMean(ringOwnerFunc(NewPlacement(ms, seed+1)), len(ms), 200_000)
		}
		return sum / 5
	}
	one, tenth := spread(1), spread(0.1)
	t.Logf("100 members: busiest / mean share %.2f at weight 1, %.2f at weight 0.1", one, tenth)
	if one > 1.5 {
		t.Errorf("weight 1: busiest owns %.2fx the mean, want at most 1.5x", one)
	}
	if tenth < 1.8 || tenth < one+0.5 {
		t.Errorf("weight 0.1: busiest owns %.2fx the mean (weight 1: %.2fx): small weights should spread keys far less evenly", tenth, one)
	}
}
