package balancer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// Pods replaced on every rollout, each time at new addresses (10.x.y.z),
// while their calls end in every outcome that leaves a memory behind:
// failures (breaker trips, outlier ejections), overload cooldowns,
// not-served and too-long answers, a model's failures, a tenant's
// refusals, client errors, sticky sessions and affinity spills. The
// state of each endpoint that left goes with it: the Balancer's own
// tables and each endpoint's pools hold the current set only, the
// outlier evaluation's scratch keeps no pool of a set that is gone, and
// the tables of outcomes are the fixed-size ones they were (they hold
// entries of removed endpoints only until those lapse or are evicted,
// and never grow).
func TestChurnWithEveryOutcomeKeepsTheTablesToTheCurrentSet(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	var trips, ejections atomic.Int64
	b := New(Options{Clock: clock, Rand: testutil.NewRand(7), StickyTTL: time.Minute, SpillMemory: time.Minute,
		TenantShardSize: 3, OutlierInterval: time.Second, OutlierMinRequests: 2, SubsetLabel: "model",
		BreakerFailures: 3, OnEvent: func(e Event) {
			switch e.Kind {
			case EventTripped:
				trips.Add(1)
			case EventEjected:
				ejections.Add(1)
			}
		}})
	errDown := errors.New("down")
	const rounds, size = 2_000, 6
	current := func(r int) []inferlb.Endpoint {
		eps := make([]inferlb.Endpoint, size)
		for i := range eps {
			eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.%d.%d.%d:8000", r>>8&255, r&255, i),
				Labels: map[string]string{"model": fmt.Sprintf("base,lora-%d", r)}}
		}
		return eps
	}
	var tableSizes [2]int // the outcome tables' entries, after the first round and at the end
	for r := range rounds {
		eps := current(r)
		require.NoError(t, b.Update(eps))
		var kv telemetry.Sample
		kv.Set(telemetry.KVCacheUsage, 0.3)
		kv.Time = clock.Now()
		for _, e := range eps {
			b.Publish(e.Addr, kv)
		}
		// The first trips its breaker; the second fails every other
		// call, which its breaker forgives, and is ejected as an outlier.
		for i, outcomes := range [][]error{{errDown, errDown, errDown}, {errDown, nil, errDown, nil, errDown, nil}} {
			s, ok := b.Serial(eps[i].Addr)
			require.True(t, ok)
			for _, err := range outcomes {
				if p, perr := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "base"}, s); perr == nil {
					p.Done(inferlb.Outcome{Err: err, Model: "base"})
				}
			}
		}
		for k := range 24 {
			model := []string{"base", fmt.Sprintf("lora-%d", r), fmt.Sprintf("nobody-serves-%d", r)}[k%3]
			tenant := fmt.Sprintf("tenant-%d", k%4)
			req := inferlb.Request{Service: inferlb.ServiceLLM, Model: model, Tenant: tenant,
				AffinityKey: uint64(k%5 + 1), Session: k%2 == 0, PromptTokens: 100 + 50*k}
			p, err := b.Pick(&req)
			if err != nil {
				continue
			}
			o := inferlb.Outcome{Model: model, Tenant: tenant}
			switch {
			case k%16 == 0:
				o.Err = errDown
			case k%16 == 1:
				o.NotServedModel = model
			case k%16 == 2:
				o.ContextWindow = 400
			case k%16 == 3:
				o.ClientError, o.Err = true, errors.New("403")
			case k%16 == 4:
				o.Overloaded, o.RetryAfter = true, time.Second
			default:
				o.Latency, o.TTFT, o.OutputTokens = 20*time.Millisecond, time.Millisecond, 8
			}
			p.Done(o)
		}
		// The outlier evaluation is due at this call's end: it judges
		// the set on the round's calls.
		clock.Advance(1100 * time.Millisecond)
		s, ok := b.Serial(eps[2].Addr)
		require.True(t, ok)
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "base"}, s)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Model: "base"})
		if r == 0 || r == rounds-1 {
			tableSizes[min(r, 1)] = outcomeTableEntries(b)
		}
	}
	require.NotZero(t, tableSizes[0], "the outcome tables were in use from the first round")
	assert.Equal(t, tableSizes[0], tableSizes[1], "the outcome tables' sizes are fixed")
	require.NotZero(t, trips.Load(), "breakers tripped")
	require.NotZero(t, ejections.Load(), "outliers were ejected")
	// One more set, that no call has reached yet: what the last one's
	// calls left (the outlier evaluation's scratch, say) is of a set gone.
	require.NoError(t, b.Update(current(rounds)))

	b.mu.Lock()
	defer b.mu.Unlock()
	want := map[string]bool{}
	for _, e := range current(rounds) {
		want[e.Addr] = true
	}
	for id := range b.eps {
		assert.True(t, want[id], "endpoint %s of an earlier set", id)
	}
	assert.Equal(t, size, len(b.eps), "endpoints")
	assert.Equal(t, size, len(*b.all.Load()), "endpoints judged for outliers")
	assert.Equal(t, size, b.cfg.store.Len(), "telemetry slots")
	assert.Equal(t, size, len(b.def.members))
	assert.Equal(t, size, len(b.def.listed))
	assert.Equal(t, size, len(b.def.groupsOf))
	assert.Equal(t, size, len(b.def.poolsOf))
	// The whole set's counter, and the model groups': base and this
	// round's adapter name the same members, so they are one group.
	assert.Equal(t, 1, len(b.def.loads), "group counters")
	assert.Equal(t, 2, len(b.def.snap.Load().byModel), "model groups")
	for _, g := range b.outlierPools[:cap(b.outlierPools)] {
		assert.Nil(t, g, "the outlier scratch keeps a pool of an earlier set alive")
	}
	if ws := b.windows.Load(); ws != nil {
		assert.LessOrEqual(t, len(*ws), windowModels)
	}
	for _, e := range b.eps {
		if ws := e.windows.Load(); ws != nil {
			assert.LessOrEqual(t, len(*ws), windowsPerEndpoint)
		}
	}
}

// outcomeTableEntries is the number of entries the tables of outcomes
// (not-served answers, a model's failure runs, tenants' refusals) and the
// session tables have room for: arrays and tables sized once, which churn
// must not grow.
func outcomeTableEntries(b *Balancer) int {
	n := 0
	if t := b.lack.Load(); t != nil {
		n += len(t.pairs) + len(t.models)
	}
	if t := b.runs.Load(); t != nil {
		n += len(t.runs)
	}
	if t := b.refused.Load(); t != nil {
		n += len(t.pairs) + len(t.tenants)
	}
	if b.sticky != nil {
		n += b.sticky.Cap()
	}
	if b.spills != nil {
		n += b.spills.Cap()
	}
	return n
}
