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
			busy, idle := f.Busy, f.Idle
			req := &inferlb.Request{Service: inferlb.ServiceLLM}
			// price picks both endpoints' prices and returns busy's; its
			// call goes to idle, which has no calls (seenBy's cost is the
			// in-flight count), and ends at once.
			price := func() scoring.State {
				clear(seen)
				p, err := b.Pick(req)
				require.NoError(t, err)
				assert.Equal(t, idle, p.ID())
				p.Done(inferlb.Outcome{})
				require.Contains(t, seen, busy)
				return seen[busy]
			}
			f.SendTo(8)
			f.Scrape(8)
			assert.Zero(t, price().InFlightSinceReading, "just scraped")
			clock.Advance(10 * time.Second)
			f.SendTo(5)
			header := telemetry.Sample{Time: clock.Now()}
			header.Set(telemetry.Waiting, tc.waiting)
			header.Set(telemetry.KVCacheUsage, 0.9)
			b.Publish(busy, header)

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
