package balancer_test

import (
	"os"
	"slices"
	"testing"
	"time"
)

// The sweeps behind the tenant refusal memory's figures, too slow for
// every run: INFERLB_TENANT_SWEEP=1 go test -run TestTenantRefusalSweep -v ./balancer/
func tenantSweep(t *testing.T) {
	t.Helper()
	if os.Getenv("INFERLB_TENANT_SWEEP") == "" {
		t.Skip("set INFERLB_TENANT_SWEEP=1 to run the tenant refusal sweeps")
	}
}

// The priced-out run of TestTenantRefusalWeighsItsCallsElsewhere over
// seeds 1 to 40: A's calls refused by r0, least, median and most.
func TestTenantRefusalSweepPricedOut(t *testing.T) {
	tenantSweep(t)
	var lost []int
	for seed := uint64(1); seed <= 40; seed++ {
		_, l, _ := pricedOutRun(t, seed, 6*time.Second, func(addr string, _ int) bool { return addr == "r0" })
		lost = append(lost, l)
	}
	t.Logf("A's calls refused, seeds 1 to 40: %v", lost)
	slices.Sort(lost)
	sum := 0
	for _, l := range lost {
		sum += l
	}
	t.Logf("least %d, median %d, most %d, total %d", lost[0], (lost[19]+lost[20])/2, lost[39], sum)
}

// A tenant whose own calls are bad at 50%, 70% or 90% wherever they go,
// its calls under 0 (none), 1 or 3 affinity keys, over 4 and 8
// endpoints, 20 seeds each: 360 runs of 1,500 rounds of 40 calls. It
// logs the runs in which some endpoint was passed over for A (none is
// refusing it more than the others).
func TestTenantRefusalSweepBadEverywhere(t *testing.T) {
	tenantSweep(t)
	badEverywhereSweep(t, 50, 70, 90)
}

// As TestTenantRefusalSweepBadEverywhere, bad at 80% and 95%: rates
// between and above the guard's, where a long run is likelier.
func TestTenantRefusalSweepBadEverywhereHigh(t *testing.T) {
	tenantSweep(t)
	badEverywhereSweep(t, 80, 95)
}

func badEverywhereSweep(t *testing.T, pcts ...int) {
	runs, marked, total := 0, 0, 0
	for _, eps := range []int{4, 8} {
		for _, pct := range pcts {
			for _, keys := range []int{0, 1, 3} {
				for seed := uint64(1); seed <= 20; seed++ {
					marks := 0
					for _, c := range badEverywhereRun(t, eps, pct, keys, seed, false) {
						marks += c
					}
					runs++
					if marks > 0 {
						marked++
						total += marks
						t.Logf("%d endpoints, %d%% bad, %d keys, seed %d: %d pass-overs", eps, pct, keys, seed, marks)
					}
				}
			}
		}
	}
	t.Logf("runs with a pass-over: %d of %d (%d pass-overs)", marked, runs, total)
}

// The priced-out run with r0 and r1 both refusing A, r1 answering in a
// millisecond: A's calls go to r0 and r1 nine in ten (r2 and r3 in slow
// start). A's calls refused over seeds 1 to 40, of 8,000.
func TestTenantRefusalSweepTwoRefusing(t *testing.T) {
	tenantSweep(t)
	lost := 0
	for seed := uint64(1); seed <= 40; seed++ {
		_, l, _ := pricedOutRun(t, seed, time.Millisecond, func(addr string, _ int) bool { return addr == "r0" || addr == "r1" })
		lost += l
	}
	t.Logf("r0 and r1 refusing A: %d of A's 8,000 calls refused over seeds 1 to 40", lost)
}
