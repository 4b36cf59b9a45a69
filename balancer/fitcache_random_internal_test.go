package balancer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A group's cached fit views (fitCache) never give a call the view of
// another filter: over random steps that remember windows (context and
// prompt), "not served" answers and tenants' refusals on 8 endpoints, for
// calls of 6 models and 5 tenants (one none) of random token counts, the
// view a filtered call reads passes over the weight a fresh sum passes
// over for it, and the weight its own filter (cand.passOver) passes over.
// Each step that changes a memory, or moves the clock, lets the views
// lapse first (fleetViewTTL): what a view may miss within its life is not
// what this checks.
func TestFitCacheGivesEachFilterItsOwnView(t *testing.T) {
	t.Parallel()
	for seed := range uint64(8) {
		clock := testutil.NewClock()
		b := New(Options{AffinitySeed: 0x5eed, Clock: clock, Rand: testutil.NewRand(seed), MaxEjectedFraction: 0.5})
		t.Cleanup(b.Close)
		eps := make([]inferlb.Endpoint, 8)
		for i := range eps {
			eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("ep-%d", i)}
		}
		require.NoError(t, b.Update(eps))
		rng := rand.New(rand.NewPCG(seed, 2))
		models := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
		tenants := []string{"", "t0", "t1", "t2", "t3"}
		windows := []int{1000, 2000, 4000, 8000}
		filtered, cached, bad, refusing := 0, 0, 0, 0
		for step := range 5000 {
			g := b.def.snap.Load().groupFor("")
			nowNs := clock.Now().UnixNano()
			r := rng.IntN(20)
			switch {
			case r == 0:
				b.rememberWindow(g.members[rng.IntN(8)], models[rng.IntN(len(models))], windows[rng.IntN(4)], rng.IntN(3) == 0, nowNs)
			case r == 1:
				b.notServed(g.members[rng.IntN(8)], models[rng.IntN(len(models))], nowNs)
			case r == 2:
				// A run of refusals on one member among the tenant's
				// calls served on others, which keep its share of
				// refusals low enough for the run to mark the member
				// (needRun). Refusals alone raised the share faster than
				// the run grew, and no member was ever marked.
				i, tenant := rng.IntN(8), tenants[1+rng.IntN(4)]
				for range 20 {
					for range 3 {
						b.tenantServed(g.members[(i+1+rng.IntN(7))%8], tenant, nowNs, false)
					}
					b.tenantRefused(g.members[i], tenant, nowNs)
				}
			case r == 3:
				clock.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
			}
			if r <= 3 {
				clock.Advance(fleetViewTTL + 1)
			}
			req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: models[rng.IntN(len(models))], Tenant: tenants[rng.IntN(len(tenants))],
				PromptTokens: rng.IntN(9000), MaxOutputTokens: rng.IntN(2000)}
			nowNs = clock.Now().UnixNano()
			now := time.Unix(0, nowNs)
			// The filters as pickWith sets them.
			c := cand{nowNs: nowNs, bit: b.def.bit}
			b.passOverFilters(req, g, &c, false)
			if c.lack == nil && c.windowNeed == 0 && c.promptNeed == 0 && c.refused == nil {
				continue
			}
			filtered++
			if c.refused != nil {
				refusing++
			}
			st := g.eligibility(b.cfg, b.epoch.Load(), nowNs)
			v, summed := g.fitLoad(b.cfg, st, now, &c)
			if !summed {
				cached++
			}
			nr := needRange{lo: -1, hi: 1 << 62, plo: -1, phi: 1 << 62}
			fresh := g.sumReported(b.cfg, st, now, &c, &nr)
			var passed float64
			for i, e := range g.members {
				if c.passOver(e) {
					passed += g.weights[i]
				}
			}
			if v.passed != fresh.passed || v.passed != passed || v.weight != fresh.weight {
				bad++
				t.Logf("seed %d step %d, %+v: cached passes over %v, a fresh sum %v, the filter %v", seed, step, req, v.passed, fresh.passed, passed)
			}
		}
		assert.Zero(t, bad, "seed %d: views of another filter read", seed)
		// The run must exercise the cache: filtered calls, many of them
		// read from it.
		assert.Greater(t, filtered, 500, "seed %d: filtered calls", seed)
		assert.Greater(t, cached, filtered/10, "seed %d: calls that read a cached view", seed)
		t.Logf("seed %d: %d filtered calls, %d read from the cache, %d passing members over for their tenant", seed, filtered, cached, refusing)
		assert.Greater(t, refusing, filtered/20, "seed %d: calls passing members over for their tenant", seed)
	}
}
