package balancer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Keyed picks whose filters rotate over up to fitSlots distinct ones (two
// window ranges of each of several models: calls of 3,000 tokens pass
// over the members remembered with a 2,000-token window, calls of 5,000
// those with 4,000 too) each keep their fit view: after one round, no
// pick sums the group anew (testhook.FitCounts, counted, not timed). With
// the views lapsed (fleetViewTTL), each filter sums its view once, and
// only once. With 4 slots chosen by model and tenant, the two ranges of a
// model took one slot, and every such pick summed the group. One filter
// more than the slots takes the oldest's slot, round after round.
func TestFitCacheKeepsAViewPerFilterUpToItsSlots(t *testing.T) {
	for _, k := range []int{2, 5, fitSlots, fitSlots + 1} {
		t.Run(fmt.Sprintf("K=%d", k), func(t *testing.T) {
			clock := testutil.NewClock()
			b := New(Options{AffinitySeed: 0x5eed, Clock: clock, Rand: testutil.NewRand(1)})
			t.Cleanup(b.Close)
			eps := make([]inferlb.Endpoint, 12)
			for i := range eps {
				eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("ep-%d", i)}
			}
			require.NoError(t, b.Update(eps))
			g := b.def.snap.Load().groupFor("")
			models := (k + 1) / 2
			for m := range models {
				for i, e := range g.members {
					if i%3 < 2 {
						b.rememberWindow(e, fmt.Sprintf("m%d", m), 2000*(1+i%3), false, clock.Now().UnixNano())
					}
				}
			}
			var counts testhook.FitCounts
			testhook.SetFitCounts(b, &counts)
			round := func() (reads, sums int64) {
				r0, s0 := counts.Reads.Load(), counts.Sums.Load()
				for i := range 32 * k {
					j := i % k
					req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("m%d", j/2), PromptTokens: 3000 + 2000*(j%2),
						AffinityKey: uint64(i/k+1) * 0x9e3779b97f4a7c15}
					p, err := b.Pick(req)
					require.NoError(t, err)
					p.Done(inferlb.Outcome{})
				}
				return counts.Reads.Load() - r0, counts.Sums.Load() - s0
			}
			reads, sums := round()
			require.Greater(t, reads, int64(16*k), "picks that read a fit view")
			assert.GreaterOrEqual(t, sums, int64(k), "each filter sums its view once")
			reads, sums = round()
			require.Greater(t, reads, int64(16*k), "picks that read a fit view")
			if k > fitSlots {
				// On this clock every view has the same age: the
				// newcomer and the filter of the first slot take it in turn.
				assert.Equal(t, int64(2*32), sums, "more filters than slots: the views summed anew of %d read", reads)
				return
			}
			assert.Zero(t, sums, "views summed anew of %d read after the first round", reads)
			clock.Advance(fleetViewTTL)
			_, sums = round()
			assert.Equal(t, int64(k), sums, "views summed anew once they lapsed")
			_, sums = round()
			assert.Zero(t, sums, "views summed anew after the lapsed ones were")
		})
	}
}
