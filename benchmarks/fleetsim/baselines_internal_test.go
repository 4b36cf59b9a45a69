package fleetsim

import (
	"fmt"
	"testing"
	"time"

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

// clientRecorder records which client sends each chat session's turns.
type clientRecorder struct {
	Router
	client int
	got    map[uint64]int // session ID to client
	moved  *int           // turns sent by another client than the session's first
}

func (c *clientRecorder) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	if cs, _ := req.session.(*chatSession); cs != nil {
		if first, ok := c.got[cs.id]; !ok {
			c.got[cs.id] = c.client
		} else if first != c.client {
			*c.moved++
		}
	}
	return c.Router.Pick(req)
}

// Which client sends a call depends on the call, not on when it is
// submitted: a chat session's turns come from one client, and two
// policies, whose routing changes the order turns are submitted in, map
// each session to the same client.
func TestClientsFollowSessionsNotSubmissionOrder(t *testing.T) {
	sc := ChatScenario()
	sc.Fleet = sc.Fleet[:4]
	clientsOf := func(p Policy) map[uint64]int {
		got, moved := map[uint64]int{}, 0
		rec := Policy{Name: p.Name, New: func(e Env) Router {
			return &clientRecorder{Router: p.New(e), client: e.Client, got: got, moved: &moved}
		}}
		res := Run(sc, rec, RunConfig{Rate: 10, Clients: 4, Seed: 3, Warmup: 10 * time.Second, Duration: 60 * time.Second, Drain: 30 * time.Second})
		require.Positive(t, res.Completed, p.Name)
		assert.Zero(t, moved, "%s: turns sent by another client than their session's first", p.Name)
		return got
	}
	a, b := clientsOf(RoundRobin()), clientsOf(LeastRequest())
	same, differ := 0, 0
	for id, c := range a {
		if d, ok := b[id]; ok {
			if c == d {
				same++
			} else {
				differ++
			}
		}
	}
	assert.Greater(t, same, 50, "sessions both runs sent")
	assert.Zero(t, differ, "sessions sent by different clients under the two policies")
}
