package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// A scrape's Running and a newer load header's Waiting (vLLM's header
// carries the queue and the KV usage, not Running) are priced as one
// reading, brought up to now with the calls sent since the scrape. The
// calls sent between the two that the server queued are in the header's
// Waiting: counted again as sent since the scrape, a saturated replica
// (8 running at the scrape, 5 more calls sent and queued) read 8 running,
// 5 waiting and 5 sent since, and the LLM scorer's load 8 + 2x5 + 5 = 23
// for its 8 + 2x5 = 18. At most Waiting of them are in the queue: a
// server with nothing waiting runs them, and they count as before.
func TestSentSinceDoesNotCountTheQueuedCallsAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting float64 // the header's queue, after the 5 calls sent since the scrape
		// The calls sent since the reading, as the scorer is given them:
		// after the header, and after 2 more calls.
		atHeader, after int64
	}{
		{"saturated: the calls sent since the scrape wait", 5, 0, 2},
		{"the queue holds other callers' calls too", 9, 0, 2},
		{"nothing waits: they run", 0, 5, 7},
		{"one of them waits", 1, 4, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			seen := seenBy{}
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(5),
				Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: seen}})
			t.Cleanup(b.Close)
			f := balancer.NewScrapedFleet(t, b, clock)
			price := func() scoring.State { return priceBusy(t, b, seen, f) }
			f.SendTo(8)
			f.Scrape(8, 0)
			assert.Zero(t, price().InFlightSinceReading, "just scraped")
			clock.Advance(10 * time.Second)
			f.SendTo(5)
			header := telemetry.Sample{Time: clock.Now()}
			header.Set(telemetry.Waiting, tc.waiting)
			header.Set(telemetry.KVCacheUsage, 0.9)
			b.Publish(f.Busy, header)

			st := price()
			r, _ := st.Telemetry.Get(telemetry.Running)
			w, _ := st.Telemetry.Get(telemetry.Waiting)
			require.Equal(t, [2]float64{8, tc.waiting}, [2]float64{r, w}, "the scrape's Running, the header's Waiting")
			t.Logf("13 in flight, %v running, %v waiting, %d sent since: LLM load %v", r, w, st.InFlightSinceReading, r+2*w+float64(st.InFlightSinceReading))
			assert.Equal(t, tc.atHeader, st.InFlightSinceReading, "at the header")

			f.SendTo(2)
			st = price()
			assert.Equal(t, tc.after, st.InFlightSinceReading, "2 calls after the header")
		})
	}
}

// Calls of this caller that end between a scrape and a newer load header
// count once. A worked model (queuedSince's doc has it in full): a server
// runs up to a limit and starts a queued call as soon as a running one
// ends. This caller knows the scrape's Running R0, the header's Waiting
// W1, and its own net change between the two, D (calls sent less calls
// ended, from its in-flight count when it first saw each reading); not
// other callers' calls, the limit, nor the scrape's Waiting W0 once the
// header replaced it. With a queue at the header the server is at its
// limit, so it runs at least R0: the calls that ended gave their places
// to queued ones, and W1 is shorter by them already. Subtracted again as
// ended since the scrape, a server with 8 running and 10 waiting at the
// scrape (10 of the 18 this caller's), 4 of this caller's calls ended and
// 4 queued ones started, holding 8 + 6 = 14, read 8 + 6 - 4 = 10: the
// saturated replica looked emptier by every call it finished, and drew
// calls into its queue.
//
// The cases with no queue at the header show the limit of what this
// caller can know: a scrape of 8 running and 2 waiting and one of 8
// running and none, after 5 of this caller's calls end, both show it
// Running 8, Waiting 0 and 5 fewer in flight; the first holds 5 (the 2
// queued calls took places), the second 3. The reading is 3 for both:
// exact for the second, low by the scrape's queue for the first.
func TestCallsEndedBetweenTheReadingsCountOnce(t *testing.T) {
	for _, tc := range []struct {
		name             string
		own              int     // this caller's calls at the scrape
		running, waiting float64 // the scrape's
		ended            int     // this caller's calls that end before the header
		header           float64 // the header's Waiting
		truth            float64 // what the server runs and queues at the header
		atHeader, after  int64   // InFlightSinceReading at the header, and after 2 more calls
	}{
		{"full at both: the queue took the places of the calls that ended", 10, 8, 10, 4, 6, 14, 0, 2},
		{"full at both, this caller's calls alone", 18, 8, 10, 4, 6, 14, 0, 2},
		// A limit of 12: 4 places freed, 4 of another caller's sent and 6
		// queued. R1 >= R0 holds; the 4 places above R0 it cannot see.
		{"full at the header only: low by the room others took", 8, 8, 0, 4, 2, 14, 0, 2},
		{"no queue at either: the calls that ended left room", 8, 8, 0, 5, 0, 3, -5, -3},
		{"the scrape's queue drained: low by it, which this caller cannot see", 8, 8, 2, 5, 0, 5, -5, -3},
		// A server that queues with room to run (calls waiting for a LoRA
		// adapter): 4 ended, 2 of another caller's wait. The count errs
		// high by this caller's calls that ended, the bound's cost.
		{"a queue with room: high by the calls that ended", 8, 8, 0, 4, 2, 6, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			seen := seenBy{}
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(5),
				Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: seen}})
			t.Cleanup(b.Close)
			f := balancer.NewScrapedFleet(t, b, clock)
			f.SendTo(tc.own)
			f.Scrape(tc.running, tc.waiting)
			assert.Zero(t, priceBusy(t, b, seen, f).InFlightSinceReading, "just scraped")
			clock.Advance(10 * time.Second)
			f.End(tc.ended)
			header := telemetry.Sample{Time: clock.Now()}
			header.Set(telemetry.Waiting, tc.header)
			b.Publish(f.Busy, header)

			st := priceBusy(t, b, seen, f)
			r, _ := st.Telemetry.Get(telemetry.Running)
			w, _ := st.Telemetry.Get(telemetry.Waiting)
			require.Equal(t, [2]float64{tc.running, tc.header}, [2]float64{r, w}, "the scrape's Running, the header's Waiting")
			t.Logf("holding %v: reads %v running + %v waiting + %d sent since = %v", tc.truth, r, w, st.InFlightSinceReading, r+w+float64(st.InFlightSinceReading))
			assert.Equal(t, tc.atHeader, st.InFlightSinceReading, "at the header")

			f.SendTo(2)
			assert.Equal(t, tc.after, priceBusy(t, b, seen, f).InFlightSinceReading, "2 calls after the header")
		})
	}
}

// priceBusy picks both of f's endpoints' prices and returns Busy's; its
// call goes to Idle, which has no calls (seenBy's cost is the in-flight
// count), and ends at once.
func priceBusy(t *testing.T, b *balancer.Balancer, seen seenBy, f *balancer.ScrapedFleet) scoring.State {
	t.Helper()
	clear(seen)
	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
	require.NoError(t, err)
	assert.Equal(t, f.Idle, p.ID())
	p.Done(inferlb.Outcome{})
	require.Contains(t, seen, f.Busy)
	return seen[f.Busy]
}
