package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A rolling deploy removes a replica that still streams 40 long calls.
// Those calls are no longer the group's to share: counted in its load,
// they raised every remaining member's fair share until they ended, and a
// hot key piled twice the bound onto its owner while the two other
// replicas sat idle.
func TestRemovedEndpointsCallsDoNotWidenTheBound(t *testing.T) {
	const key = 0x1234567890abcdef
	b := affine(t, 4, balancer.Options{Rand: testutil.NewRand(7), Clock: testutil.NewClock()})
	home := owner(t, b, key)
	var stay []inferlb.Endpoint
	var gone string
	for _, e := range endpoints(4) {
		if id := e.Key(); id != home && gone == "" {
			gone = id
		} else {
			stay = append(stay, e)
		}
	}
	s, _ := b.Serial(gone)
	var draining []balancer.Pick
	for range 40 {
		p, err := b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		require.Equal(t, gone, p.ID())
		draining = append(draining, p)
	}
	require.NoError(t, b.Update(stay))

	const calls = 30
	bound := balancer.DefaultLoadBound*calls/3 + 1
	got := ownerTakes(t, b, key, home, calls)
	assert.LessOrEqual(t, float64(got), bound, "the owner's in-flight calls of the key")
	for i := range draining {
		draining[i].Done(inferlb.Outcome{})
	}
}
