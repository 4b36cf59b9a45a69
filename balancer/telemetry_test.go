package balancer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// llmShares runs a closed loop of LLM calls with 8 outstanding and counts
// new calls per endpoint.
func llmShares(t *testing.T, b *balancer.Balancer, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	var window []balancer.Pick
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 800, MaxOutputTokens: 300}
	for range n {
		p, err := b.Pick(req)
		if err != nil {
			t.Fatal(err)
		}
		counts[p.ID()]++
		window = append(window, p)
		if len(window) == 8 {
			window[0].Done(inferlb.Outcome{})
			window = window[1:]
		}
	}
	for _, p := range window {
		p.Done(inferlb.Outcome{})
	}
	return counts
}

func TestTelemetryPressureSteersAndGoesStale(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sample func(*telemetry.Sample)
	}{
		{"gpu memory 95%", func(s *telemetry.Sample) {
			s.Set(telemetry.GPUMemUsed, 76e9)
			s.Set(telemetry.GPUMemTotal, 80e9)
		}},
		{"kv cache 95%", func(s *telemetry.Sample) { s.Set(telemetry.KVCacheUsage, 0.95) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(10)})
			hot := endpoints(4)[0].Addr
			s := telemetry.Sample{Time: clock.Now()}
			tc.sample(&s)
			b.Publish(hot, s)
			for _, ep := range endpoints(4)[1:] { // peers report comfortable levels
				calm := telemetry.Sample{Time: clock.Now()}
				calm.Set(telemetry.KVCacheUsage, 0.3)
				calm.Set(telemetry.GPUMemUsed, 72e9)
				calm.Set(telemetry.GPUMemTotal, 80e9)
				b.Publish(ep.Addr, calm)
			}
			c := llmShares(t, b, 4000)
			t.Logf("fresh: %v", c)
			assert.Less(t, c[hot], 4000/4/5, "the pressured endpoint gets far fewer new requests")

			clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
			c = llmShares(t, b, 4000)
			t.Logf("stale: %v", c)
			assert.InDelta(t, 1000, c[hot], 150, "a stale sample is neutral: treated like its peers")
		})
	}
}

// A scrape does not move between scrapes, whatever this process sends. The
// endpoint that looked emptiest at the last one must take a burst only
// until its projected load meets its peers', not every pick until the next
// scrape; and a new reading, which counts those calls itself, starts over.
func TestStaleReadingDoesNotDrawEveryPick(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3)})
	eps := endpoints(4)
	low := eps[0].Addr
	publish := func(id string, running, kv float64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, running)
		s.Set(telemetry.Waiting, 0)
		s.Set(telemetry.KVCacheUsage, kv)
		b.Publish(id, s)
	}
	publish(low, 10, 0.90)
	for _, ep := range eps[1:] {
		publish(ep.Addr, 10, 0.95)
	}
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 800, MaxOutputTokens: 300}
	burst := func(n int) (map[string]int, []balancer.Pick) {
		counts := map[string]int{}
		var held []balancer.Pick
		for range n {
			p, err := b.Pick(req)
			if err != nil {
				t.Fatal(err)
			}
			counts[p.ID()]++
			held = append(held, p)
		}
		return counts, held
	}
	// 40 calls stay in flight: a burst between two scrapes. Scored on the
	// reading alone, low wins every comparison it is in: about half.
	c, held := burst(40)
	t.Logf("burst: %v", c)
	assert.LessOrEqual(t, c[low], 14, "low takes a few more than its 10, not half of the burst")
	assert.GreaterOrEqual(t, c[low], 8, "and about its share: it was the emptiest")

	// The next scrape counts the burst: low now reads as full as the rest
	// after its extra calls, and the base starts over from there.
	clock.Advance(time.Second)
	for _, ep := range eps {
		publish(ep.Addr, 10+float64(c[ep.Addr]), 0.97)
	}
	c2, held2 := burst(40)
	t.Logf("after the next scrape: %v", c2)
	for _, ep := range eps {
		assert.InDelta(t, 10, c2[ep.Addr], 5, "equal readings, equal shares: %s", ep.Addr)
	}
	for _, p := range append(held, held2...) {
		p.Done(inferlb.Outcome{})
	}
}

// A Balancer that got no slot for an endpoint (its Store was full then)
// holds none, so when it drops the endpoint it must not release the slot
// another Balancer on the same Store took later: that one's telemetry
// would be forgotten while it still routes to the endpoint.
func TestDroppingAnEndpointWithoutASlotKeepsAnothersSlot(t *testing.T) {
	clock := testutil.NewClock()
	store := &telemetry.Store{MaxEndpoints: 1}
	a := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	b := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	c := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	const x = "10.0.0.9:8000"
	require.NoError(t, c.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}))
	require.NoError(t, a.Update([]inferlb.Endpoint{{Addr: x}})) // full: x gets no slot in a
	require.NoError(t, c.Update(nil))                           // frees the one slot
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: x}})) // b holds x's slot
	s := telemetry.Sample{Time: clock.Now()}
	s.Set(telemetry.KVCacheUsage, 0.5)
	b.Publish(x, s)
	require.NoError(t, a.Update(nil))
	_, ok := store.Latest(x, clock.Now(), 0)
	assert.True(t, ok, "b still has x: its telemetry stays")
	assert.Equal(t, 1, store.Len())
}

// Endpoints that come and go (pods replaced on every rollout) must not
// fill the telemetry table: a departed endpoint's slot goes with it, a
// late report about it does not bring it back, and a Store shared by two
// Balancers keeps a slot while either still has the endpoint.
func TestEndpointChurnDoesNotFillTheTelemetryStore(t *testing.T) {
	clock := testutil.NewClock()
	store := &telemetry.Store{MaxEndpoints: 4}
	a := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	other := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	kv := func(v float64) telemetry.Sample {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, v)
		return s
	}
	var last string
	for i := range 50 { // rollouts: each replaces the one pod
		last = fmt.Sprintf("pod-%d:8000", i)
		assert.NoError(t, a.Update([]inferlb.Endpoint{{Addr: last}}))
		a.Publish(last, kv(0.5))
		if i > 0 {
			a.Publish(fmt.Sprintf("pod-%d:8000", i-1), kv(0.9)) // a late report about the one that left
		}
	}
	assert.Equal(t, 1, store.Len(), "only the live pod has a slot")
	_, ok := store.Latest(last, clock.Now(), 0)
	assert.True(t, ok, "the live pod's telemetry is kept")
	assert.EqualValues(t, 49, store.Stats().DroppedUnknown, "late reports are counted, not kept")
	assert.Zero(t, store.Stats().DroppedFull)

	// Shared Store: the slot stays while either Balancer has the endpoint.
	assert.NoError(t, other.Update([]inferlb.Endpoint{{Addr: last}}))
	assert.NoError(t, a.Update(nil))
	_, ok = store.Latest(last, clock.Now(), 0)
	assert.True(t, ok, "still held by the other Balancer")
	assert.NoError(t, other.Update(nil))
	assert.Zero(t, store.Len())
}

// One telemetry plane for several Balancers: a Poller publishing straight
// into their shared Store makes a slot for every ID its Source reports,
// also pods that have left (a scrape in flight as they go, a Prometheus
// series that outlives its pod by the 5 minute staleness window) and pods
// of fleets no Balancer routes to. Nobody holds those slots, so nothing
// drops them; they must not take the room of the endpoints a Balancer
// routes to, or once as many pods as MaxEndpoints have come and gone
// (65,536 by default: weeks of rollouts and autoscaling) every new pod
// would route with no telemetry at all.
func TestUnheldSlotsMakeRoomForABalancersEndpoints(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	store := &telemetry.Store{MaxEndpoints: 64, Clock: clock}
	b := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	var live []string // this round's pods, then the ones that just left
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		var obs []telemetry.Observation
		for _, id := range live {
			var s telemetry.Sample
			s.Set(telemetry.KVCacheUsage, 0.5)
			obs = append(obs, telemetry.Observation{EndpointID: id, Sample: s})
		}
		return obs, nil
	})
	p, err := telemetry.NewPoller(src, store, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	const rounds = 10_000
	lost := 0
	for r := range rounds {
		pods := []string{fmt.Sprintf("pod-%d:8000", r), fmt.Sprintf("pod-%d:8000", r+rounds)}
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: pods[0]}, {Addr: pods[1]}}))
		// A late scrape of the pods that left, and a pod of another fleet.
		live = append(pods, fmt.Sprintf("pod-%d:8000", r-1), fmt.Sprintf("other-%d:8000", r))
		p.Poll(context.Background())
		clock.Advance(time.Second)
		for _, id := range pods {
			if _, ok := store.Latest(id, clock.Now(), 0); !ok {
				lost++
			}
		}
		assert.LessOrEqual(t, store.Len(), 64)
	}
	assert.Zero(t, lost, "routed endpoints without telemetry, of %d", 2*rounds)
}
