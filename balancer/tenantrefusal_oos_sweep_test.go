package balancer_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Sweeps of the tenant refusal memory's guard out of the sample its
// constants were chosen on (refusalRunMax, refusalOwnRun: the sweeps of
// tenantrefusal_sweep_test.go), too slow for every run and for that
// file's command, each fleet size a parallel subtest:
// INFERLB_TENANT_SWEEP=1 go test -run TestTenantRefusalOutOfSample -parallel 2 -timeout 80m -v ./balancer/

// badEverywhereRun is one run of badEverywhereSweep's: tenant A (30% of
// the calls) bad at pct% wherever its calls go, under keys affinity keys
// (0: none), over eps endpoints, 1,500 rounds of 40 calls; with r0Refuses
// r0 refuses all of A's calls besides. It returns the pass-overs begun for
// A, by endpoint.
func badEverywhereRun(t *testing.T, eps, pct, keys int, seed uint64, r0Refuses bool) map[string]int {
	t.Helper()
	addrs := make([]string, eps)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("r%d", i)
	}
	marks := map[string]int{}
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(seed), AffinitySeed: seed, OnEvent: func(ev balancer.Event) {
		if ev.Kind == balancer.EventTenantRefused {
			marks[ev.Endpoint]++
		}
	}}, addrs...)
	mix := tenantMix(30)
	r.tenant = mix
	if keys > 0 {
		r.key = func(n int) uint64 {
			if mix(n) == "A" {
				return 1 + uint64(n%keys)
			}
			return 1000 + uint64(n%64)
		}
	}
	src := rand.New(rand.NewPCG(seed, uint64(pct)))
	r.refuse = func(addr, tn string, _ int) bool {
		if tn != "A" {
			return false
		}
		bad := src.IntN(100) < pct
		return bad || r0Refuses && addr == "r0"
	}
	r.rounds(1500, 40)
	return marks
}

// oosSweep runs badEverywhereRun over every fleet size, rate, key count
// and seed given, a fleet size a parallel subtest, and logs for each
// configuration the runs in which some endpoint other than r0 (with
// r0Refuses), or any (without), was passed over for A; with r0Refuses
// also the runs in which r0 was.
func oosSweep(t *testing.T, r0Refuses bool, fleets, pcts, keyCounts []int, seeds [2]uint64) {
	for _, eps := range fleets {
		t.Run(fmt.Sprintf("%d endpoints", eps), func(t *testing.T) {
			t.Parallel()
			runs, wrong, r0Runs := 0, 0, 0
			for _, pct := range pcts {
				for _, keys := range keyCounts {
					n, bad, r0 := 0, 0, 0
					var which []string
					for seed := seeds[0]; seed <= seeds[1]; seed++ {
						marks := badEverywhereRun(t, eps, pct, keys, seed, r0Refuses)
						n++
						others := 0
						for addr, c := range marks {
							if !r0Refuses || addr != "r0" {
								others += c
							}
						}
						if others > 0 {
							bad++
							which = append(which, fmt.Sprintf("seed %d %v", seed, marks))
						}
						if marks["r0"] > 0 {
							r0++
						}
					}
					runs, wrong, r0Runs = runs+n, wrong+bad, r0Runs+r0
					line := fmt.Sprintf("%2d endpoints, %d%% bad, %d keys: %d of %d runs passed over an endpoint that refuses A no more than others", eps, pct, keys, bad, n)
					if r0Refuses {
						line += fmt.Sprintf(", r0 passed over in %d", r0)
					}
					if bad > 0 {
						line += fmt.Sprintf(" (%v)", which)
					}
					t.Log(line)
				}
			}
			line := fmt.Sprintf("%d endpoints: %d of %d runs passed over an endpoint that refuses A no more than others", eps, wrong, runs)
			if r0Refuses {
				line += fmt.Sprintf("; r0 passed over in %d", r0Runs)
			}
			t.Log(line)
		})
	}
}

// Out of sample for TestTenantRefusalSweepBadEverywhere and its High
// twin: seeds 21 to 60, rates between and above theirs, fleets of 2 to
// 16 endpoints, 0, 1, 2 or 5 affinity keys: 7,840 runs.
func TestTenantRefusalOutOfSampleBadEverywhere(t *testing.T) {
	tenantSweep(t)
	oosSweep(t, false, []int{2, 3, 4, 6, 8, 12, 16}, []int{55, 65, 75, 85, 92, 97, 99}, []int{0, 1, 2, 5}, [2]uint64{21, 60})
}

// As TestTenantRefusalOutOfSampleBadEverywhere, at the rates the
// first sweeps took, over the fleet sizes they did not: 4,000 runs.
func TestTenantRefusalOutOfSampleOtherFleets(t *testing.T) {
	tenantSweep(t)
	oosSweep(t, false, []int{2, 3, 6, 12, 16}, []int{50, 70, 80, 90, 95}, []int{0, 1, 2, 5}, [2]uint64{21, 60})
}

// A tenant bad everywhere and refused by r0 besides (its key missing
// there): r0, and no other endpoint, should be passed over, as far as the
// rate leaves A's calls elsewhere served often enough to tell.
func TestTenantRefusalOutOfSampleOneRefusing(t *testing.T) {
	tenantSweep(t)
	oosSweep(t, true, []int{2, 3, 4, 6, 8, 12, 16}, []int{30, 50, 70, 80, 90, 95}, []int{0, 1, 2, 5}, [2]uint64{21, 30})
}
