package balancer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
)

// TestBarrierMonotone: over random prefill estimates of a three-rank
// engine, more prefill on the candidate or a longer prompt never lowers
// its barrier, and a rank never pays more than an engine of one (a replica
// in no engine) for the same prompt: its own step rises by at most the
// prompt, less where it fills under a busier mate's.
func TestBarrierMonotone(t *testing.T) {
	b := New(Options{})
	eps := []inferlb.Endpoint{{ID: "solo"}}
	for i := range 3 {
		eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("r%d", i), Labels: map[string]string{DefaultDPGroupLabel: "a"}})
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	now := int64(1_700_000_000) * int64(time.Second)
	for trial := range 2000 {
		now += int64(time.Minute) // every estimate decays to 0 first
		for i := range 3 {
			if n := r.IntN(3); n > 0 {
				b.eps[fmt.Sprintf("r%d", i)].prefill.add(now, float64(r.IntN(20000)*n))
			}
		}
		e := b.eps["r0"]
		tokens := 1 + r.IntN(32000)
		base := barrier(e, tokens, now)
		if solo := barrier(b.eps["solo"], tokens, now); base > solo {
			t.Fatalf("trial %d: rank pays %v, an engine of one %v", trial, base, solo)
		}
		if longer := barrier(e, tokens+1+r.IntN(8000), now); longer < base {
			t.Fatalf("trial %d: a longer prompt costs %v < %v", trial, longer, base)
		}
		e.prefill.add(now, float64(1+r.IntN(8000)))
		if busier := barrier(e, tokens, now); busier < base {
			t.Fatalf("trial %d: more prefill on the candidate costs %v < %v", trial, busier, base)
		}
	}
}
