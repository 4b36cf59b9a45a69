package balancer

import (
	"math/rand/v2"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A group's load counter is the calls in flight on its members (group.load),
// after every step of a random sequence of picks, Dones, Updates, a second
// membership's Updates and Closes, and readiness changes: the counters the
// affinity bound shares move with the endpoints exactly, and an endpoint
// that leaves takes its calls with it (its calls still in flight stayed
// on its old groups' counters until they ended).
//
// With countedGroup 0 every group keeps a counter, small as these are; with
// 2 the model groups of stressFleets keep one at 3 members and none at 2,
// so Updates move them across the boundary with calls in flight.
func TestGroupLoadIsItsMembersCallsAtEveryStep(t *testing.T) {
	defer func(n int) { countedGroup = n }(countedGroup)
	for _, counted := range []int{0, 2} {
		countedGroup = counted
		groupLoadSteps(t)
	}
}

func groupLoadSteps(t *testing.T) {
	fleets := stressFleets()
	for seed := uint64(0); seed < 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 2))
		clock := testutil.NewClock()
		b := New(Options{Clock: clock, Rand: testutil.NewRand(seed)})
		other, _ := b.NewMembership()
		_ = b.Update(fleets[0])
		_ = other.Update(fleets[1])
		var held []Pick
		models := []string{"", "a", "b", "c"}
		for step := 0; step < 400; step++ {
			switch r := rng.IntN(10); {
			case r < 4:
				pk := b.Pick
				if rng.IntN(2) == 0 {
					pk = other.Pick
				}
				if p, err := pk(&inferlb.Request{Model: models[rng.IntN(4)]}); err == nil {
					held = append(held, p)
				}
			case r < 7 && len(held) > 0:
				k := rng.IntN(len(held))
				held[k].Done(inferlb.Outcome{})
				held = append(held[:k], held[k+1:]...)
			case r == 7:
				_ = b.Update(fleets[rng.IntN(len(fleets))])
			case r == 8:
				if rng.IntN(5) == 0 {
					other.Close()
					other, _ = b.NewMembership()
				}
				_ = other.Update(fleets[rng.IntN(len(fleets))])
			case r == 9:
				f := fleets[rng.IntN(len(fleets))]
				b.SetReady(f[rng.IntN(len(f))].ID, rng.IntN(2) == 0)
			}
			for _, m := range []*Membership{b.def, other} {
				snap := m.snap.Load()
				gs := []*group{snap.all, snap.anyModel}
				for _, g := range snap.byModel {
					gs = append(gs, g)
				}
				for _, g := range gs {
					if g == nil {
						continue
					}
					var sum int64
					for _, e := range g.members {
						sum += e.inFlight.Load()
					}
					if g.load != nil && g.load.Load() != sum {
						t.Fatalf("countedGroup %d seed %d step %d: membership %d group of %d: load %d, members' in flight %d", countedGroup, seed, step, m.idx, len(g.members), g.load.Load(), sum)
					}
				}
			}
		}
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
		b.mu.Lock()
		for _, m := range []*Membership{b.def, other} {
			for key, c := range m.loads {
				if c.Load() != 0 {
					t.Errorf("countedGroup %d seed %d: membership %d counter %q holds %d after every Done", countedGroup, seed, m.idx, key, c.Load())
				}
			}
		}
		b.mu.Unlock()
	}
}
