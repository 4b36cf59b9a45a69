package balancer_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// AffinitySeed 0 is documented as a random per-process seed: Balancers in
// one process (two HTTP Transports, a gRPC channel and a Transport, two
// channels to one service, or a channel whose config push replaced its
// Balancer) must place a session on the same endpoint. A seed drawn per
// Balancer sent one session to a different endpoint, and cache, from each,
// and moved every key on each gRPC config push.
func TestDefaultSeedIsPerProcess(t *testing.T) {
	a := balancer.New(balancer.Options{Rand: testutil.NewRand(1), MinKeyReuse: -1})
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(2), MinKeyReuse: -1})
	require.NotZero(t, a.Keyer().Seed())
	assert.Equal(t, a.Keyer().Seed(), b.Keyer().Seed(), "one seed per process")
	eps := endpoints(16)
	require.NoError(t, a.Update(eps))
	require.NoError(t, b.Update(eps))
	differ := 0
	for i := range 200 {
		id := fmt.Sprintf("session-%d", i)
		ka, kb := a.Keyer().Session(id), b.Keyer().Session(id)
		if owner(t, a, ka) != owner(t, b, kb) {
			differ++
		}
	}
	assert.Zero(t, differ, "sessions placed apart by two Balancers of one process")
}
