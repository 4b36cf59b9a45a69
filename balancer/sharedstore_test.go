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

// Two Balancers share a telemetry Store. An endpoint the application
// forgot on the Store (Store.Forget, as it left the fleet) while the
// first Balancer still had it, and that the second then took, keeps its
// telemetry in the second when the first lets it go: the first releases
// its own, forgotten slot. Released by ID, it dropped the second's, whose
// endpoint then read an orphaned slot that nothing published to.
func TestSharedStoreReleaseSparesAnotherBalancersSlot(t *testing.T) {
	clock := testutil.NewClock()
	store := &telemetry.Store{Clock: clock}
	a := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	b := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	x := inferlb.Endpoint{ID: "x", Addr: "10.0.0.1:8000"}
	y := inferlb.Endpoint{ID: "y", Addr: "10.0.0.2:8000"}
	require.NoError(t, a.Update([]inferlb.Endpoint{x, y}))
	store.Forget("x")
	require.NoError(t, b.Update([]inferlb.Endpoint{x}))
	require.NoError(t, a.Update([]inferlb.Endpoint{y})) // a lets x go

	var s telemetry.Sample
	s.Time = clock.Now()
	s.Set(telemetry.Waiting, 7)
	b.Publish("x", s)
	got, ok := store.Latest("x", clock.Now(), 0)
	require.True(t, ok, "x's slot is b's still")
	v, _ := got.Get(telemetry.Waiting)
	assert.Equal(t, 7.0, v)
	st := b.Stats()
	require.Len(t, st, 1)
	assert.Equal(t, 7.0, st[0].Telemetry.Values[telemetry.Waiting], "b routes on it")
}
