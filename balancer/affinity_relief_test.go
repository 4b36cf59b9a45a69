package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// reliefFleet is an affinity Balancer over n endpoints whose fresh
// telemetry reports only the given KV-cache usage (no queue), and up to 60
// keys endpoint 0 owns.
func reliefFleet(t *testing.T, n int, kv ...float64) (*balancer.Balancer, []uint64) {
	t.Helper()
	clock := testutil.NewClock()
	b := affine(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(13)})
	var keys []uint64
	for k := uint64(1); len(keys) < 60; k++ {
		if owner(t, b, k*0x9e3779b97f4a7c15) == endpoints(n)[0].Addr {
			keys = append(keys, k*0x9e3779b97f4a7c15)
		}
	}
	for i, ep := range endpoints(n) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, kv[i])
		b.Publish(ep.Addr, s)
	}
	return b, keys
}

// A pressured owner (97% of its KV cache) passes keys only to a neighbour
// at least pressureMargin (0.2) emptier: neighbours at 90% with no queue
// are as near saturation, and the key keeps its warm prefix.
func TestPressuredOwnerKeepsKeysFromNeighboursOnlyALittleEmptier(t *testing.T) {
	b, keys := reliefFleet(t, 8, 0.97, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9)
	for _, k := range keys {
		require.Equal(t, endpoints(8)[0].Addr, owner(t, b, k), "key %x", k)
	}
	b, keys = reliefFleet(t, 8, 0.97, 0.75, 0.75, 0.75, 0.75, 0.75, 0.75, 0.75)
	for _, k := range keys {
		assert.NotEqual(t, endpoints(8)[0].Addr, owner(t, b, k), "key %x: a neighbour 22 points emptier relieves it", k)
	}
}

// A pressured owner looks past a neighbour that cannot relieve it: with
// the next endpoint in the key's order at 90% and the one after it at
// 40%, the key goes to the one at 40%, whichever order the key has.
func TestPressuredOwnerLooksPastANeighbourThatCannotRelieveIt(t *testing.T) {
	b, keys := reliefFleet(t, 3, 0.97, 0.9, 0.4)
	for _, k := range keys {
		assert.Equal(t, endpoints(3)[2].Addr, owner(t, b, k), "key %x", k)
	}
}
