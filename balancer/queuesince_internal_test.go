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
	b := New(Options{Clock: clock, Rand: testutil.NewRand(5)})
	t.Cleanup(b.Close)
	busy, idle := "10.0.0.1:8000", "10.0.0.2:8000"
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: busy}, {Addr: idle}}))
	serial, ok := b.Serial(busy)
	require.True(t, ok)
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	var held []Pick
	t.Cleanup(func() {
		for _, p := range held {
			p.Done(inferlb.Outcome{})
		}
	})
	sendTo := func(n int) {
		for range n {
			p, err := b.PickAt(req, serial)
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	g := b.def.snap.Load().all
	total := func() float64 {
		now := clock.Now()
		v := g.sumReported(b.cfg, g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano()), now)
		require.True(t, v.ok)
		return v.total
	}
	sendTo(8)
	for _, id := range []string{busy, idle} { // the scrape
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 0)
		if id == busy {
			s.Set(telemetry.Running, 8)
		}
		s.Set(telemetry.Waiting, 0)
		b.Publish(id, s)
	}
	assert.Equal(t, 8.0, total(), "just scraped")
	clock.Advance(10 * time.Second)
	sendTo(5)
	header := telemetry.Sample{Time: clock.Now()}
	header.Set(telemetry.Waiting, 5)
	b.Publish(busy, header)
	assert.Equal(t, 13.0, total(), "8 running at the scrape, 5 queued since")
	sendTo(2)
	assert.Equal(t, 15.0, total(), "and 2 sent after the header")
}
