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

// An endpoint that joined while its shared Store was full of held slots
// got none, and used to stay without one for as long as it stayed in the
// set: every sample about it was dropped as unknown, and it was scored as
// if it reported nothing, long after other Balancers' endpoints had left
// and made room. It takes a slot at its Balancer's next membership change.
func TestAnEndpointWithoutASlotTakesOneOnceThereIsRoom(t *testing.T) {
	clock := testutil.NewClock()
	store := &telemetry.Store{MaxEndpoints: 2, Clock: clock}
	a := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	b := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	const x, y = "10.0.0.1:8000", "10.0.0.2:8000"
	set := []inferlb.Endpoint{{Addr: x}, {Addr: y}}
	require.NoError(t, a.Update([]inferlb.Endpoint{{Addr: "10.0.0.9:8000"}}))
	require.NoError(t, b.Update(set)) // x takes the last slot; y finds the Store full
	full := telemetry.Sample{Time: clock.Now()}
	full.Set(telemetry.KVCacheUsage, 0.99)
	b.Publish(y, full)
	require.EqualValues(t, 1, store.Stats().DroppedUnknown, "y has no slot yet")

	require.NoError(t, a.Update(nil)) // a's endpoint leaves: room for one
	require.NoError(t, b.Update(set)) // the same set: y tries again
	b.Publish(y, full)
	_, ok := store.Latest(y, clock.Now(), 0)
	require.True(t, ok, "y's telemetry is kept now")
	assert.EqualValues(t, 1, store.Stats().DroppedUnknown)

	// And the picks read it: y's KV cache is full, x reports nothing
	// (neutral), so every pick of the two goes to x.
	req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100}
	for range 50 {
		p, err := b.Pick(req)
		require.NoError(t, err)
		assert.Equal(t, x, p.ID())
		p.Done(inferlb.Outcome{})
	}

	// Holding it, b gives it back when y leaves.
	require.NoError(t, b.Update(nil))
	assert.Zero(t, store.Len())
}
