package fleetsim

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// least-request samples its two replicas with replacement, as grpc-go's
// least_request and Envoy's LEAST_REQUEST do: with two replicas, one of
// them busy, both draws name the busy one about a quarter of the time,
// and the call goes there.
func TestLeastRequestSamplesWithReplacement(t *testing.T) {
	rt := LeastRequest().New(Env{Seed: 7, IDs: []string{"r0", "r1"}})
	rt.SetMembers([]int{0, 1})
	req := &Request{Service: inferlb.ServiceLLM}
	busy, _, err := rt.Pick(req) // held in flight for the whole test
	require.NoError(t, err)
	const n = 4000
	toBusy := 0
	for range n {
		i, done, err := rt.Pick(req)
		require.NoError(t, err)
		if i == busy {
			toBusy++
		}
		done(inferlb.Outcome{})
	}
	assert.InDelta(t, 0.25, float64(toBusy)/n, 0.03, "share of calls sent to the busy replica")
}

// The consistent-hash ring is as large as grpc-go's ring_hash makes it by
// default: at least 1,024 points, spread evenly over the replicas.
func TestRingHashSizedAsGRPC(t *testing.T) {
	for _, tc := range []struct{ n, per int }{{1, 1024}, {3, 342}, {7, 147}, {8, 128}, {16, 64}} {
		ids := make([]string, tc.n)
		members := make([]int, tc.n)
		for i := range ids {
			ids[i], members[i] = fmt.Sprintf("r%d", i), i
		}
		rt := RingHash().New(Env{Seed: 1, IDs: ids}).(*ringHash)
		rt.SetMembers(members)
		count := map[int]int{}
		for _, p := range rt.points {
			count[p.rep]++
		}
		assert.Len(t, rt.points, tc.n*tc.per, "%d replicas", tc.n)
		for i := range tc.n {
			assert.Equal(t, tc.per, count[i], "points of r%d of %d", i, tc.n)
		}
	}
}
