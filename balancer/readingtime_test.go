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

// seenBy records the State the balancer priced each endpoint with.
type seenBy map[string]scoring.State

func (m seenBy) Cost(_ *inferlb.Request, s scoring.State) float64 {
	m[s.Endpoint.Addr] = s
	return float64(s.InFlight)
}

// A reading's time is when the server measured it: a source that reads
// one scrape again (Prometheus polled more often than it scrapes) hands
// the same reading with the same time, and the calls sent since it still
// count (State.InFlightSinceReading, which the LLM scorer adds to the
// reading). Handed under a new time (the query's, as promapi stamped it),
// the reading looked new on every poll and those calls were forgotten:
// every endpoint looked as loaded as at the scrape, the emptiest one at the
// scrape emptiest again.
func TestReadingTimeKeepsTheCallsSentSince(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restamp  bool // the second poll stamps the same reading with the time of the poll
		min, max int64
	}{
		// Each endpoint took about 10 of the 40 calls and 2 of the last 8,
		// all after the scrape.
		{"same scrape, same time", false, 11, 14},
		{"same scrape, new time", true, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			seen := seenBy{}
			b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3),
				Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: seen}})
			eps := endpoints(4)
			scraped := clock.Now().Add(-5 * time.Second)
			publish := func(at time.Time) {
				for _, ep := range eps {
					s := telemetry.Sample{Time: at}
					s.Set(telemetry.Running, 12)
					s.Set(telemetry.Waiting, 0)
					b.Publish(ep.Addr, s)
				}
			}
			req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 800, MaxOutputTokens: 300}
			var held []balancer.Pick
			pick := func() {
				p, err := b.Pick(req)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}
			publish(scraped)
			for range 40 { // calls the reading cannot count
				pick()
			}
			clock.Advance(time.Second) // the next poll: Prometheus has not scraped since
			if tc.restamp {
				publish(clock.Now())
			} else {
				publish(scraped)
			}
			clear(seen)
			for range 8 { // every endpoint priced again, most more than once
				pick()
			}
			assert.Len(t, seen, len(eps))
			for _, ep := range eps {
				st := seen[ep.Addr]
				t.Logf("%s: %d in flight, %d of them sent since the reading", ep.Addr, st.InFlight, st.InFlightSinceReading)
				assert.GreaterOrEqual(t, st.InFlightSinceReading, tc.min, ep.Addr)
				assert.LessOrEqual(t, st.InFlightSinceReading, tc.max, ep.Addr)
			}
			for _, p := range held {
				p.Done(inferlb.Outcome{})
			}
		})
	}
}

// A reading measured longer than TelemetryMaxAge ago is stale when it
// arrives: neutral, however recently it was fetched.
func TestReadingOlderThanMaxAgeIsNeutral(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(10)})
	hot := endpoints(4)[0].Addr
	s := telemetry.Sample{Time: clock.Now().Add(-balancer.DefaultTelemetryMaxAge - time.Second)}
	s.Set(telemetry.KVCacheUsage, 0.99)
	b.Publish(hot, s)
	c := llmShares(t, b, 4000)
	t.Logf("measured %v ago: %v", balancer.DefaultTelemetryMaxAge+time.Second, c)
	assert.InDelta(t, 1000, c[hot], 150, "a stale reading is neutral")

	s.Time = clock.Now().Add(-time.Second)
	b.Publish(hot, s)
	c = llmShares(t, b, 4000)
	t.Logf("measured 1s ago: %v", c)
	assert.Less(t, c[hot], 4000/4/5, "a fresh one steers")
}

// A reading reaches the balancer some time after the server measured it
// (Prometheus scrapes every 15-30 s and is polled after): the calls this
// process sent in between are not in it either. They count from the
// reading's own time, not from when a pick first saw it, which forgot
// them: each endpoint took about 10 of 40 calls after the scrape and before
// the reading arrived, and was priced as if it had taken none.
func TestReadingArrivingLateCountsTheCallsSentSinceItsTime(t *testing.T) {
	clock := testutil.NewClock()
	b, seen, eps, pick, release := heldLLMPicks(t, clock, 4, 3)
	defer release()
	scraped := clock.Now()
	for range 40 { // over the 12 s between the scrape and its arrival
		clock.Advance(300 * time.Millisecond)
		pick()
	}
	for _, ep := range eps {
		s := telemetry.Sample{Time: scraped}
		s.Set(telemetry.Running, 12)
		s.Set(telemetry.Waiting, 0)
		b.Publish(ep.Addr, s)
	}
	clear(seen)
	for range 8 {
		pick()
	}
	assert.Len(t, seen, len(eps))
	for _, ep := range eps {
		st := seen[ep.Addr]
		t.Logf("%s: %d in flight, %d of them sent since the reading", ep.Addr, st.InFlight, st.InFlightSinceReading)
		assert.GreaterOrEqual(t, st.InFlightSinceReading, st.InFlight-3, "%s: at most the last picks' second uncounted", ep.Addr)
		assert.LessOrEqual(t, st.InFlightSinceReading, st.InFlight, ep.Addr)
	}
}

// heldLLMPicks is a Balancer over n endpoints whose LLM scorer records the
// State it is given per endpoint (seen), with a pick of an LLM call that
// holds the call and a release that ends every call held.
func heldLLMPicks(t *testing.T, clock *testutil.Clock, n int, seed uint64) (b *balancer.Balancer, seen seenBy, eps []inferlb.Endpoint, pick, release func()) {
	t.Helper()
	seen = seenBy{}
	b = newBalancer(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(seed),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: seen}})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 800, MaxOutputTokens: 300}
	var held []balancer.Pick
	pick = func() {
		p, err := b.Pick(req)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	release = func() {
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
		held = held[:0]
	}
	return b, seen, endpoints(n), pick, release
}

// The calls sent since a reading count from the time of the reading the
// scorer is given. A server's Running can go stale while its Waiting stays
// fresh (vLLM's load header carries the queue and not the running count,
// and the /metrics scrape that gave Running stopped): the fresh queue was
// then brought up to now from the stale Running's time, with the in-flight
// count of when that old reading was first seen. Ten calls in flight then,
// none now, read as -10 sent since a queue that was measured a moment ago,
// and the LLM scorer's load, max(in flight, running + 2 x waiting + sent
// since), cancelled half of a fresh queue of 10.
func TestSentSinceCountsFromTheFreshReading(t *testing.T) {
	clock := testutil.NewClock()
	b, seen, eps, pick, release := heldLLMPicks(t, clock, 2, 5)
	for range 20 {
		pick()
	}
	for _, ep := range eps { // the scrape, which counts them
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 10)
		s.Set(telemetry.Waiting, 0)
		b.Publish(ep.Addr, s)
	}
	pick() // both endpoints priced: the scrape is seen
	release()
	clock.Advance(balancer.DefaultTelemetryMaxAge + 10*time.Second) // no scrape since: Running is stale
	// A load header: the queue only.
	for _, ep := range eps {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Waiting, 10)
		b.Publish(ep.Addr, s)
	}
	clear(seen)
	pick()
	assert.Len(t, seen, len(eps))
	for _, ep := range eps {
		st := seen[ep.Addr]
		_, running := st.Telemetry.Get(telemetry.Running)
		assert.False(t, running, "%s: Running is stale", ep.Addr)
		assert.Zero(t, st.InFlightSinceReading, "%s: nothing was sent since the queue was measured", ep.Addr)
	}
	release()
}
