package balancer

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// threeWindowFleet is a Balancer on a fake clock over 6 endpoints of
// model, two remembered with a 4,096-token window, two with 8,192 and two
// with none, and that group with its eligibility at the clock's time.
func threeWindowFleet(t *testing.T, model string) (*Balancer, *group, *standing, time.Time) {
	t.Helper()
	b, g, now := threeWindowFleetWith(t, model, Options{}, false)
	st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
	return b, g, st, now
}

// threeWindowFleetWith is threeWindowFleet with o's other options, the
// windows remembered as prompt windows when prompt is set.
func threeWindowFleetWith(t *testing.T, model string, o Options, prompt bool) (*Balancer, *group, time.Time) {
	t.Helper()
	clock := testutil.NewClock()
	o.AffinitySeed, o.Clock, o.Rand = 0x5eed, clock, testutil.NewRand(1)
	b := New(o)
	t.Cleanup(b.Close)
	eps := make([]inferlb.Endpoint, 6)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("ep-%d", i)}
	}
	require.NoError(t, b.Update(eps))
	g := b.def.snap.Load().groupFor(model)
	now := clock.Now()
	for i, w := range []int{4096, 4096, 8192, 8192} {
		b.rememberWindow(g.members[i], model, w, prompt, now.UnixNano())
	}
	return b, g, now
}

// A group caches the view of a filtered call (fitCache) for the calls
// whose filter passes the same members over: those whose tokens lie
// between the windows of the members passed over and those not. A fleet
// of three windows: a call of 6,000 tokens passes the two 4,096 members
// over, and so does one of 7,000, which reads the cached view; one of
// 10,000 passes the 8,192 members over too, and must not read it, nor
// must a call of 6,000 read the view cached for 10,000: it reads its own,
// which the view of 10,000 took another slot than (fitSlots), as 8,193
// reads the view of 10,000.
func TestFitCacheHoldsForTheSameMembersPassedOver(t *testing.T) {
	const model = "llama"
	b, g, _, now := threeWindowFleet(t, model)
	for _, step := range []struct {
		tokens int
		passed float64
		cached bool
	}{
		{6000, 2, false},
		{7000, 2, true},
		{10000, 4, false},
		{6000, 2, true},
		{8192, 2, true},
		{8193, 4, true},
	} {
		c := windowCand(t, b, g, model, step.tokens, now)
		v, summed := fitRead(t, b, g, now, &c, fmt.Sprintf("%d tokens", step.tokens)) // the view as summed afresh
		assert.Equal(t, step.passed, v.passed, "%d tokens: the weight passed over", step.tokens)
		assert.Equal(t, step.cached, !summed, "%d tokens: read from the cache", step.tokens)
	}
}

// Calls of two token counts that pass different members over, for more
// models than a group has slots (fitSlots), overwrite each other's views
// while others read them: no reader pairs one's key with the other's sums
// (the slot's seqlock).
func TestFitCacheReadersNeverMixTwoViews(t *testing.T) {
	const model = "llama"
	b, g, st, now := threeWindowFleet(t, model)
	models := []string{model}
	for m := range fitSlots / 2 {
		other := fmt.Sprintf("%s-%d", model, m)
		for i, w := range []int{4096, 4096, 8192, 8192} {
			b.rememberWindow(g.members[i], other, w, false, now.UnixNano())
		}
		models = append(models, other)
	}
	st = g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
	var cands []cand
	var want []float64
	for _, m := range models {
		for _, tokens := range []int{6000, 10000} {
			c := cand{nowNs: now.UnixNano(), bit: b.def.bit}
			require.False(t, b.windowFilter(&inferlb.Request{Service: inferlb.ServiceLLM, Model: m, PromptTokens: tokens}, g, &c, false))
			cands = append(cands, c)
			want = append(want, map[int]float64{6000: 2, 10000: 4}[tokens])
		}
	}
	require.Greater(t, len(cands), fitSlots)
	var wg sync.WaitGroup
	bad := make([]int, 4)
	summed := make([]int, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				j := (i + 3*w) % len(cands)
				c := cands[j]
				v, sum := g.fitLoad(b.cfg, st, now, &c)
				if v.passed != want[j] || v.weight != 6-want[j] {
					bad[w]++
				}
				if sum {
					summed[w]++
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, []int{0, 0, 0, 0}, bad, "views read with the wrong members passed over, per reader")
	assert.Greater(t, summed[0]+summed[1]+summed[2]+summed[3], 400, "views summed anew, taking another's slot")
}
