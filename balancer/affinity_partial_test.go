package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// holdCallsOn holds n calls without a key on the endpoint id and returns a
// function that ends them.
func holdCallsOn(t *testing.T, b *balancer.Balancer, id string, n int) func() {
	t.Helper()
	serial, ok := b.Serial(id)
	require.True(t, ok)
	held := make([]balancer.Pick, 0, n)
	for range n {
		p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
		require.NoError(t, err)
		held = append(held, p)
	}
	return func() {
		for i := range held {
			held[i].Done(inferlb.Outcome{})
		}
	}
}

// publishLoad publishes Running = running[id], Waiting 0 for each id.
func publishLoad(b *balancer.Balancer, clock *testutil.Clock, running map[string]float64) {
	for id, r := range running {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, r)
		s.Set(telemetry.Waiting, 0)
		b.Publish(id, s)
	}
}

// An endpoint added to a serving fleet (a scale-out) has no reading until
// its first scrape. That is no reason to throw away every other member's
// reading for a telemetry max-age: with the whole group back on this
// caller's own calls, an owner whose server reports the fleet's mean load
// but which happens to carry this caller's calls shed every one of its
// keys for 30 seconds after each scale-out, in every caller at its own
// moments. Only members listed at start-up, whose scrapes are still being
// phased in, are waited for.
func TestBoundEstimatesAMemberAddedToAServingFleet(t *testing.T) {
	clock := testutil.NewClock()
	opts := balancer.Options{Clock: clock, Rand: testutil.NewRand(24)}
	b := affine(t, 4, opts)
	// A key whose owner stays its owner when the fifth endpoint joins.
	b5 := affine(t, 5, balancer.Options{Clock: clock, Rand: testutil.NewRand(24)})
	key := uint64(1)
	for owner(t, b, key) != owner(t, b5, key) {
		key++
	}
	home := owner(t, b, key)
	const calls = 12
	defer holdCallsOn(t, b, home, calls)()
	load := map[string]float64{}
	for _, e := range endpoints(4) {
		load[e.Key()] = calls // the owner's are this caller's; the others', other callers'
	}
	clock.Advance(balancer.DefaultTelemetryMaxAge)
	publishLoad(b, clock, load)
	require.Equal(t, map[string]int{home: 10}, spreadKey(t, b, key, 10), "the owner reports the fleet's mean load")

	require.NoError(t, b.Update(endpoints(5)))
	publishLoad(b, clock, load) // the new endpoint is not scraped yet
	assert.Equal(t, map[string]int{home: 10}, spreadKey(t, b, key, 10), "one endpoint not yet scraped in a serving fleet")
}
