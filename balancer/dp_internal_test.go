package balancer

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestPrefillEstimateDecays(t *testing.T) {
	var p prefillEstimate
	t0 := int64(1_700_000_000) * int64(time.Second)
	if got := p.at(t0); got != 0 {
		t.Fatalf("empty estimate %v", got)
	}
	p.add(t0, 8000)
	for _, c := range []struct {
		after time.Duration
		want  float64
	}{
		{0, 8000},
		{prefillWindow, 8000 / math.E},
		{2 * prefillWindow, 8000 / math.E / math.E},
		{20 * time.Second, 0},
	} {
		if got := p.at(t0 + int64(c.after)); math.Abs(got-c.want) > 0.02*8000 {
			t.Errorf("after %v: %v, want about %v", c.after, got, c.want)
		}
	}
	// A second prompt adds to what is left of the first.
	p.add(t0+int64(prefillWindow), 1000)
	if got, want := p.at(t0+int64(prefillWindow)), 8000/math.E+1000; math.Abs(got-want) > 0.02*8000 {
		t.Errorf("sum %v, want about %v", got, want)
	}
}

func TestPrefillEstimateLosesNothingUnderConcurrency(t *testing.T) {
	var p prefillEstimate
	now := int64(1_700_000_000) * int64(time.Second) // one instant: no decay between adds
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				p.add(now, 1)
			}
		})
	}
	wg.Wait()
	if got := p.at(now); got != 8000 {
		t.Fatalf("8 x 1000 adds of 1 token: %v", got)
	}
}

// Picks read the clock before they add their prompt, so a racing pick with a
// later reading may update first. The estimate must neither be wiped by a
// reading 1 ms older than its stamp (an unsigned age wrapped to 2^32 ms)
// nor lose what the later update added.
func TestPrefillEstimateTakesOutOfOrderTimes(t *testing.T) {
	var p prefillEstimate
	t0 := int64(1_700_000_000) * int64(time.Second)
	p.add(t0+int64(time.Millisecond), 30000) // the racing pick, later reading
	p.add(t0, 1000)                          // this pick, read 1 ms earlier
	if got := p.at(t0 + int64(time.Millisecond)); math.Abs(got-31000) > 620 {
		t.Fatalf("estimate %v, want about 31000", got)
	}
	if got := p.at(t0); math.Abs(got-31000) > 620 {
		t.Fatalf("read 1 ms before the stamp: %v, want about 31000", got)
	}
}
