package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// SetReconnected is SetReady(id, true) for an endpoint that got a new
// connection without an outage: it does not start slow start, and a ramp
// under way goes on as it was.
func TestSetReconnectedDoesNotRamp(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update([]inferlb.Endpoint{{ID: "x"}, {ID: "y"}}))
	p, err := m.PickAt(&inferlb.Request{}, serialOf(t, b, "x"))
	require.NoError(t, err)
	p.Done(inferlb.Outcome{}) // x is in use

	require.True(t, m.SetReady("x", false))
	clock.Advance(time.Second)
	require.True(t, m.SetReconnected("x"))
	assert.True(t, stat(t, b, "x").Ready)
	assert.Equal(t, 1.0, stat(t, b, "x").RampFactor, "ramping after a reconnect")

	require.True(t, m.SetReady("x", false))
	clock.Advance(time.Second)
	require.True(t, m.SetReady("x", true)) // an outage: ramps
	clock.Advance(balancer.DefaultSlowStartWindow / 2)
	mid := stat(t, b, "x").RampFactor
	require.Less(t, mid, 1.0)
	require.True(t, m.SetReady("x", false))
	require.True(t, m.SetReconnected("x"))
	assert.Equal(t, mid, stat(t, b, "x").RampFactor, "a reconnect restarted or ended the ramp under way")
	assert.False(t, m.SetReconnected("nope"), "an ID the Membership does not list")
}
