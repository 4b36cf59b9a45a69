package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// pricedBy records the State and the LLM scorer's cost of each endpoint.
type pricedBy struct {
	states map[string]scoring.State
	costs  map[string]float64
}

func (m pricedBy) Cost(req *inferlb.Request, s scoring.State) float64 {
	c := (&scoring.LLM{}).Cost(req, s)
	m.states[s.Endpoint.Addr], m.costs[s.Endpoint.Addr] = s, c
	return c
}

// A KV-cache usage is brought up to now by the calls sent since it was
// measured, not since the load reading's time: the /metrics scrape (Running,
// Waiting, KV) is up to a scrape interval old, while vLLM's load header
// (KV, Waiting, no Running) comes after every response and already counts
// the calls sent before it. Projected from the scrape's time, a header's 90%
// with 10 running and 2-3 calls sent since the scrape read as a full cache
// (factor 10, the cap) instead of 90% (factor 3): the endpoint cost 3-4x its
// due, and two endpoints in the same state differed by the age of their
// scrapes alone.
func TestKVProjectionCountsFromTheKVReadingsTime(t *testing.T) {
	clock := testutil.NewClock()
	seen := pricedBy{states: map[string]scoring.State{}, costs: map[string]float64{}}
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(7),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: seen}})
	eps := endpoints(2)
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	var held []balancer.Pick
	defer func() {
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
	}()
	pick := func() {
		p, err := b.Pick(req)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	for _, ep := range eps { // the scrape
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 10)
		s.Set(telemetry.Waiting, 0)
		s.Set(telemetry.KVCacheUsage, 0.8)
		b.Publish(ep.Addr, s)
	}
	pick() // the scrape is seen
	for range 4 {
		clock.Advance(time.Second)
		pick()
	}
	clock.Advance(time.Second)
	for _, ep := range eps { // a load header, after the calls above
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, 0.9)
		s.Set(telemetry.Waiting, 0)
		b.Publish(ep.Addr, s)
	}
	clear(seen.states)
	pick() // both priced: the header is seen, nothing sent since it
	assert.Len(t, seen.states, len(eps))
	kvFactor := scoring.Pressure(0.9, 0.85, 4)
	for _, ep := range eps {
		st := seen.states[ep.Addr]
		t.Logf("%s: %d in flight, %d sent since the scrape, %d since the KV reading, cost %.1f",
			ep.Addr, st.InFlight, st.InFlightSinceReading, st.InFlightSinceKV, seen.costs[ep.Addr])
		assert.Positive(t, st.InFlightSinceReading, "%s: calls were sent since the scrape", ep.Addr)
		assert.Zero(t, st.InFlightSinceKV, "%s: none since the KV reading", ep.Addr)
		load := 10 + float64(st.InFlightSinceReading)
		assert.InDelta(t, (load+1)*kvFactor, seen.costs[ep.Addr], 1e-9, "%s: the KV usage as the header read it", ep.Addr)
	}

	// The calls sent after the header count against its usage.
	atHeader := map[string]int64{}
	for _, ep := range eps {
		atHeader[ep.Addr] = seen.states[ep.Addr].InFlight
	}
	for range 4 {
		pick()
	}
	clear(seen.states)
	pick()
	assert.Len(t, seen.states, len(eps))
	for _, ep := range eps {
		st := seen.states[ep.Addr]
		assert.Equal(t, st.InFlight-atHeader[ep.Addr], st.InFlightSinceKV, "%s: sent since the header", ep.Addr)
		assert.Greater(t, st.InFlightSinceReading, st.InFlightSinceKV, "%s: the scrape is older", ep.Addr)
	}

	// A scrape gives the usage with the load reading: one count for both.
	clock.Advance(time.Second)
	for _, ep := range eps {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 12)
		s.Set(telemetry.Waiting, 0)
		s.Set(telemetry.KVCacheUsage, 0.9)
		b.Publish(ep.Addr, s)
	}
	pick()
	pick()
	clear(seen.states)
	pick()
	assert.Len(t, seen.states, len(eps))
	for _, ep := range eps {
		st := seen.states[ep.Addr]
		assert.Equal(t, st.InFlightSinceReading, st.InFlightSinceKV, ep.Addr)
	}
}
