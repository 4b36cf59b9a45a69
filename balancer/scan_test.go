package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// scanned is costByAddr asking for the full scan (scoring.FullScanner);
// an address not in the table costs 1.
type scanned costByAddr

func (c scanned) Cost(_ *inferlb.Request, s scoring.State) float64 {
	if v, ok := c[s.Endpoint.Key()]; ok {
		return v
	}
	return 1
}

func (scanned) FullScan() bool { return true }

// scanCosts prices endpoints(6) 5, 4, 3, 1, 2, 6: the fourth is cheapest.
func scanCosts() scanned {
	eps := endpoints(6)
	c := scanned{}
	for i, v := range []float64{5, 4, 3, 1, 2, 6} {
		c[eps[i].Addr] = v
	}
	return c
}

func scanBalancer(t *testing.T, n int, o balancer.Options, sc scoring.Scorer) *balancer.Balancer {
	t.Helper()
	o.Clock, o.Rand = testutil.NewClock(), testutil.NewRand(7)
	o.Scorers = map[inferlb.Service]scoring.Scorer{inferlb.ServiceEmbedding: sc}
	return newBalancer(t, n, o)
}

var embed = &inferlb.Request{Service: inferlb.ServiceEmbedding}

// A scorer that asks for the full scan has every call go to the cheapest
// endpoint; with two random choices a call goes elsewhere whenever the
// cheapest is not drawn (two thirds of the time among six).
func TestScanPicksTheCheapestEndpoint(t *testing.T) {
	best := endpoints(6)[3].Addr
	got := spread(t, scanBalancer(t, 6, balancer.Options{}, scanCosts()), embed, 600)
	assert.Equal(t, map[string]int{best: 600}, got)

	got = spread(t, scanBalancer(t, 6, balancer.Options{ScanLimit: -1}, scanCosts()), embed, 600)
	t.Logf("two choices: %v", got)
	assert.Less(t, got[best], 300, "ScanLimit -1: two random choices")
	assert.Zero(t, got[endpoints(6)[5].Addr], "the dearest never wins a pair")
}

// Ties go to each of the tied alike, not to the first or the last one
// scanned.
func TestScanSpreadsTiesEvenly(t *testing.T) {
	got := spread(t, scanBalancer(t, 6, balancer.Options{}, scanned{}), embed, 6000)
	require.Len(t, got, 6)
	for id, n := range got {
		assert.InDelta(t, 1000, n, 150, "%s: %v", id, got)
	}
}

// Past ScanLimit members a pick compares ScanLimit in a row from a random
// start. At 2 of the six priced 5, 4, 3, 1, 2, 6 the pairs from each
// start (wrapping) go to the members priced 4, 3, 1, 1, 2 and 5: the
// cheapest takes two sixths of the calls, the dearest none.
func TestScanLimitComparesThatManyInARow(t *testing.T) {
	eps := endpoints(6)
	got := spread(t, scanBalancer(t, 6, balancer.Options{ScanLimit: 2}, scanCosts()), embed, 3000)
	t.Logf("%v", got)
	for i, want := range []int{500, 500, 500, 1000, 500, 0} {
		assert.InDelta(t, want, got[eps[i].Addr], 100, "member %d", i)
	}
}

// A joining endpoint ramping up (slow start) is a candidate of the scan as
// often as it would be one of two choices': with probability its factor
// times 2/m. Two joiners at 0.1 beside one serving endpoint, every cost
// alike, take 0.1 x 2/3 x (0.93/2 + 0.07/3) each, 0.065 of the calls
// together.
func TestScanRampsJoiners(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		b := balancer.New(balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(seed), SlowStartWindow: time.Minute,
			Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceEmbedding: scanned{}}})
		eps := endpoints(3)
		require.NoError(t, b.Update(eps[:1]))
		require.NoError(t, b.Update(eps))
		got := spread(t, b, embed, 4000)
		joiners := float64(got[eps[1].Addr]+got[eps[2].Addr]) / 4000
		t.Logf("seed %d: %v; the joiners' share %.3f", seed, got, joiners)
		assert.InDelta(t, 0.065, joiners, 0.015)
	}
}

// joinerShare runs embedding calls of 20ms, one started a millisecond,
// over 31 endpoints warmed up and one that joins (as fast, no latency
// yet), and returns the joiner's share of the 2,000 calls after it joins,
// its slow-start factor 0.1 to 0.16.
func joinerShare(t *testing.T, o balancer.Options) float64 {
	t.Helper()
	clock := testutil.NewClock()
	o.Clock, o.Rand, o.SlowStartWindow = clock, testutil.NewRand(5), time.Minute
	b := balancer.New(o)
	eps := endpoints(32)
	require.NoError(t, b.Update(eps[:31]))
	type out struct {
		p   balancer.Pick
		end time.Duration
	}
	var flying []out
	var now time.Duration
	step := func() string {
		now += time.Millisecond
		clock.Advance(time.Millisecond)
		for len(flying) > 0 && flying[0].end <= now {
			flying[0].p.Done(inferlb.Outcome{Latency: 20 * time.Millisecond})
			flying = flying[1:]
		}
		p, err := b.Pick(embed)
		require.NoError(t, err)
		flying = append(flying, out{p, now + 20*time.Millisecond})
		return p.ID()
	}
	for range 2000 {
		step()
	}
	require.NoError(t, b.Update(eps))
	joined := 0
	for range 2000 {
		if step() == eps[31].Addr {
			joined++
		}
	}
	for _, f := range flying {
		f.p.Done(inferlb.Outcome{})
	}
	return float64(joined) / 2000
}

// A joiner with no latency yet is the cheapest endpoint of every scan it
// is a candidate of: admitted with its slow-start factor alone, it took
// that share of all calls (0.1 of them, three times its full share among
// 32) from its first second, and its ramp meant nothing. Admitted as often
// as among two choices, it takes about what two choices give it.
func TestScanRampsAJoinerLikeTwoChoices(t *testing.T) {
	fair := 1.0 / 32
	scan, two := joinerShare(t, balancer.Options{}), joinerShare(t, balancer.Options{ScanLimit: -1})
	t.Logf("joiner's share: scan %.4f, two choices %.4f, fair %.4f", scan, two, fair)
	assert.Less(t, scan, 0.4*fair, "the ramp holds the joiner down")
	assert.InDelta(t, two, scan, 0.3*fair, "as two choices do")
}

// The scan stays inside a tenant's shard, even when the cheapest endpoint
// of the group is outside it: it takes the cheaper of the shard's two.
func TestScanStaysInTheTenantsShard(t *testing.T) {
	costs := scanCosts()
	o := balancer.Options{TenantShardSize: 2, AffinitySeed: 99}
	scan := scanBalancer(t, 6, o, costs)
	even := scanBalancer(t, 6, o, costByAddr{}) // two choices, every cost alike: both members show
	outside := 0
	for tenant := range 8 {
		req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: fmt.Sprint("tenant-", tenant)}
		shard := spread(t, even, req, 200)
		require.Len(t, shard, 2, "tenant %d", tenant)
		want := ""
		for id := range shard {
			if want == "" || costs[id] < costs[want] {
				want = id
			}
		}
		if _, in := shard[endpoints(6)[3].Addr]; !in {
			outside++
		}
		assert.Equal(t, map[string]int{want: 50}, spread(t, scan, req, 50), "tenant %d, shard %v", tenant, shard)
	}
	assert.Positive(t, outside, "some shard leaves the cheapest endpoint out")
}

// The default scorers: embeddings and rerankers scan (scoring.Latency),
// generation and unknown traffic keep two choices.
func TestDefaultScorersThatScan(t *testing.T) {
	for svc, want := range map[inferlb.Service]bool{
		inferlb.ServiceEmbedding: true, inferlb.ServiceRerank: true,
		inferlb.ServiceLLM: false, inferlb.ServiceUnknown: false,
	} {
		fs, ok := scoring.DefaultFor(svc).(scoring.FullScanner)
		assert.Equal(t, want, ok && fs.FullScan(), "%v", svc)
	}
}

func TestScanLimitValidate(t *testing.T) {
	assert.ErrorContains(t, (&balancer.Options{ScanLimit: balancer.MaxScanLimit + 1}).Validate(), "ScanLimit")
	// A scan of one compares nothing: each call went to one endpoint drawn
	// uniformly, whatever its cost (one failing all its calls too) and
	// weight, worse than two choices.
	assert.ErrorContains(t, (&balancer.Options{ScanLimit: 1}).Validate(), "ScanLimit")
	assert.NoError(t, (&balancer.Options{ScanLimit: 2}).Validate())
	assert.NoError(t, (&balancer.Options{ScanLimit: balancer.MaxScanLimit}).Validate())
	assert.NoError(t, (&balancer.Options{ScanLimit: -1}).Validate())
}

// A half-open breaker's probe wins the scan, as it wins a pair: priced
// with its outage, it would lose to every healthy endpoint until that
// decayed.
func TestScanTakesTheProbe(t *testing.T) {
	clock := testutil.NewClock()
	eps := endpoints(6)
	b := newBalancer(t, 6, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(3), OutlierInterval: -1, BreakerFailures: 1, BreakerProbes: 1,
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceEmbedding: scanned{eps[2].Addr: 5}},
	})
	failed := pickOn(t, b, eps[2].Addr)
	failed.Done(inferlb.Outcome{Err: errDown})
	require.True(t, stat(t, b, eps[2].Addr).BreakerOpen)
	assert.NotContains(t, spread(t, b, embed, 100), eps[2].Addr, "held out")
	clock.Advance(balancer.DefaultEjectionTime)
	p, err := b.Pick(embed)
	require.NoError(t, err)
	assert.Equal(t, eps[2].Addr, p.ID(), "the probe")
	p.Done(inferlb.Outcome{Latency: time.Millisecond})
	assert.False(t, stat(t, b, eps[2].Addr).BreakerOpen)
	assert.NotContains(t, spread(t, b, embed, 100), eps[2].Addr, "closed, it costs the most again")
}
