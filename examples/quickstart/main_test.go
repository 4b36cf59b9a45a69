package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestQuickstartSmoke runs the README's first command at a small scale, so a
// change that breaks the demo fails CI: both policies serve every request,
// and inferlb's affinity shows in the cache hit rate.
func TestQuickstartSmoke(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	if testing.Short() {
		t.Skip("runs a few seconds of scaled real time")
	}
	dur := 8 * time.Second // model time; the backends run faster than real time
	rr := runPolicy("round-robin", 20, dur, 1)
	lb := runPolicy("inferlb", 20, dur, 1)
	t.Logf("round-robin: %d requests, %d failed, hit %.2f; inferlb: %d requests, %d failed, hit %.2f",
		rr.requests, rr.failed, rr.hit, lb.requests, lb.failed, lb.hit)
	for _, r := range []result{rr, lb} {
		if r.requests == 0 || r.failed != 0 {
			t.Errorf("%s: %d requests, %d failed", r.policy, r.requests, r.failed)
		}
	}
	if rr.requests != lb.requests {
		t.Errorf("same seeded workload, different request counts: %d vs %d", rr.requests, lb.requests)
	}
	if lb.hit <= rr.hit {
		t.Errorf("inferlb's cache hit rate %.2f is not above round-robin's %.2f", lb.hit, rr.hit)
	}
}
