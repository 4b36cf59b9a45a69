package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A tenant's pass-over written before the clock stepped back ends at the
// step, as the not-served memory's entries do (lackLapsed): r0 refused
// A's calls until its key arrived, then the clock stepped back. The
// entries, which lapse two ErrorDecays (a minute) after they were
// written, then read as lapsing the step later; they counted as live
// while the step was below the not-served memory's horizon (the longest
// of NotServedMemory and MaxEjectionTime, plus the two ErrorDecays), and
// r0 was passed over for A for the whole step on top of its ErrorDecay:
// A drew none of its calls there in the minute after a step of 100 s
// with the defaults, or of 10 minutes with an hour's MaxEjectionTime.
func TestTenantRefusalEndsAtAClockStepBack(t *testing.T) {
	for _, tc := range []struct {
		maxEject, step time.Duration
	}{{0, 100 * time.Second}, {time.Hour, 10 * time.Minute}} {
		maxEject := tc.maxEject
		r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(3), MaxEjectionTime: maxEject}, "r0", "r1", "r2", "r3")
		r.tenant = tenantMix(30)
		fixed := false
		r.refuse = func(addr, tn string, _ int) bool { return !fixed && addr == "r0" && tn == "A" }
		got := r.rounds(1000, 4) // 20 s
		assert.Less(t, got.drew["A"]["r0"], 25, "A's calls on r0 while it refuses them")
		fixed = true
		r.clock.Set(r.clock.Now().Add(-tc.step))
		got = r.rounds(3000, 4) // 60 s
		t.Logf("MaxEjectionTime %v, a step of %v: A's calls in the minute after the step: %v", maxEject, tc.step, got.drew["A"])
		assert.Greater(t, got.drew["A"]["r0"], got.calls["A"]/8, "MaxEjectionTime %v: A's calls back on r0 after the step", maxEject)
	}
}
