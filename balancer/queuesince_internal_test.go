package balancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// The affinity bound's view of a group's load (sumReported, as fleetLoad
// caches it) reads a scrape's Running and a newer load header's Waiting as
// the scorer does (TestSentSinceDoesNotCountTheQueuedCallsAgain): the calls
// sent since the scrape that the header's queue holds count once. A member
// with 8 running at the scrape and 5 more calls sent and queued since
// counted 8 + 5 + 5 = 18 for its 13, so its fair share of the group looked
// exceeded at a load it did not carry, and its keys spilled.
func TestGroupLoadCountsTheQueuedCallsOnce(t *testing.T) {
	clock := testutil.NewClock()
	f, total := groupLoadFleet(t, clock)
	f.SendTo(8)
	f.Scrape(8, 0)
	assert.Equal(t, 8.0, total(), "just scraped")
	clock.Advance(10 * time.Second)
	f.SendTo(5)
	header := telemetry.Sample{Time: clock.Now()}
	header.Set(telemetry.Waiting, 5)
	f.b.Publish(f.Busy, header)
	assert.Equal(t, 13.0, total(), "8 running at the scrape, 5 queued since")
	f.SendTo(2)
	assert.Equal(t, 15.0, total(), "and 2 sent after the header")
}

// The group's view counts calls that ended between a scrape and a newer
// load header with a queue once, as the scorer does
// (TestCallsEndedBetweenTheReadingsCountOnce): 8 running and 10 waiting
// at the scrape, 10 of them this caller's; 4 of those end and 4 queued
// calls start in their places, so the header's queue is 6 and the member
// holds 14. Taken off again, it read 10.
func TestGroupLoadCountsTheEndedCallsOnce(t *testing.T) {
	clock := testutil.NewClock()
	f, total := groupLoadFleet(t, clock)
	f.SendTo(10)
	f.Scrape(8, 10)
	assert.Equal(t, 18.0, total(), "just scraped")
	clock.Advance(10 * time.Second)
	f.End(4)
	header := telemetry.Sample{Time: clock.Now()}
	header.Set(telemetry.Waiting, 6)
	f.b.Publish(f.Busy, header)
	assert.Equal(t, 14.0, total(), "8 running, 6 waiting")
}

// groupLoadFleet returns a ScrapedFleet on a fresh Balancer and the total
// load of its group as the affinity bound's view sums it (sumReported).
func groupLoadFleet(t *testing.T, clock *testutil.Clock) (*ScrapedFleet, func() float64) {
	b := New(Options{Clock: clock, Rand: testutil.NewRand(5)})
	t.Cleanup(b.Close)
	f := NewScrapedFleet(t, b, clock)
	g := b.def.snap.Load().all
	return f, func() float64 {
		now := clock.Now()
		v := g.sumReported(b.cfg, g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano()), now, nil, nil)
		require.True(t, v.ok)
		return v.total
	}
}

// ScrapedFleet is the two-endpoint fleet of the queue-since tests, here and
// in package balancer_test: Busy, which this caller sends calls to
// (SendTo, held until End or the test's end), and Idle.
type ScrapedFleet struct {
	t          *testing.T
	b          *Balancer
	clock      *testutil.Clock
	Busy, Idle string
	serial     uint64
	held       []Pick
}

// NewScrapedFleet puts two endpoints in b and returns them as a
// ScrapedFleet.
func NewScrapedFleet(t *testing.T, b *Balancer, clock *testutil.Clock) *ScrapedFleet {
	t.Helper()
	f := &ScrapedFleet{t: t, b: b, clock: clock, Busy: "10.0.0.1:8000", Idle: "10.0.0.2:8000"}
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: f.Busy}, {Addr: f.Idle}}))
	serial, ok := b.Serial(f.Busy)
	require.True(t, ok)
	f.serial = serial
	t.Cleanup(func() {
		for _, p := range f.held {
			p.Done(inferlb.Outcome{})
		}
	})
	return f
}

// SendTo sends n generation calls to Busy and holds them.
func (f *ScrapedFleet) SendTo(n int) {
	f.t.Helper()
	for range n {
		p, err := f.b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, f.serial)
		require.NoError(f.t, err)
		f.held = append(f.held, p)
	}
}

// End ends the n oldest of the calls SendTo holds.
func (f *ScrapedFleet) End(n int) {
	f.t.Helper()
	require.LessOrEqual(f.t, n, len(f.held))
	for _, p := range f.held[:n] {
		p.Done(inferlb.Outcome{})
	}
	f.held = f.held[n:]
}

// Scrape publishes a scrape of both: Busy running running and queueing
// waiting, Idle nothing.
func (f *ScrapedFleet) Scrape(running, waiting float64) {
	for _, id := range []string{f.Busy, f.Idle} {
		s := telemetry.Sample{Time: f.clock.Now()}
		s.Set(telemetry.Running, 0)
		s.Set(telemetry.Waiting, 0)
		if id == f.Busy {
			s.Set(telemetry.Running, running)
			s.Set(telemetry.Waiting, waiting)
		}
		f.b.Publish(id, s)
	}
}
