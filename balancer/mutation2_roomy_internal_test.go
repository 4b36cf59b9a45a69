package balancer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// setCalls sets this caller's calls in flight on each member by rank in
// stayKey's order (others 0), in the members' counts and the group's.
func (r *stayRig) setCalls(t *testing.T, calls map[int]int64) {
	t.Helper()
	require.NotNil(t, r.g.load)
	for rank, m := range r.order {
		e := r.g.members[m]
		r.g.load.Add(calls[rank] - e.inFlight.Load())
		e.inFlight.Store(calls[rank])
	}
}

// An owner far from saturation (fresh telemetry: no queue, or one arrival,
// and a KV cache under roomyKV) keeps its keys up to roomyExtra calls past
// the hard cap, that many included, and no further; at roomyKV it is not
// far from saturation.
func TestRoomyOwnerKeepsKeysUpToRoomyExtraPastTheHardCap(t *testing.T) {
	// 6 members, the 5 others 2 calls each. With the next call: owner 8
	// makes 19 calls, a share of 19/6 and a hard cap of ceil(1.5 x 19/6)
	// = 5, so the owner's 9 is hard+roomyExtra; owner 9: 20/6, cap 5, 10.
	for _, tc := range []struct {
		owner     int64
		waiting   float64
		kv        float64
		keepsHome bool
	}{
		{8, 0, 0.1, true},
		{9, 0, 0.1, false},
		{6, 1, 0.29, true},
		{6, 1, roomyKV, false},
	} {
		t.Run(fmt.Sprintf("owner %d, waiting %v, kv %v", tc.owner, tc.waiting, tc.kv), func(t *testing.T) {
			r := newStayRig(t, 6, Options{})
			calls := map[int]int64{0: tc.owner}
			for rank := 1; rank < 6; rank++ {
				calls[rank] = 2
			}
			r.setCalls(t, calls)
			s := telemetry.Sample{Time: r.clock.Now()}
			s.Set(telemetry.Waiting, tc.waiting)
			s.Set(telemetry.KVCacheUsage, tc.kv)
			r.b.Publish(r.g.members[r.order[0]].id, s)
			p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey})
			require.NoError(t, err)
			got := r.rankOf(p.ID())
			p.Done(inferlb.Outcome{})
			r.setCalls(t, nil)
			if tc.keepsHome {
				assert.Equal(t, 0, got, "the owner keeps its key")
			} else {
				assert.NotEqual(t, 0, got, "the key spills")
			}
		})
	}
}

// A crowded owner (past its bound, within the hard cap, with a queue or no
// telemetry) keeps its key when the endpoint it would spill to has a KV
// cache at 90% or more (noRelief), and spills it below that.
func TestCrowdedOwnerKeepsItsKeyFromANinetyPercentFullSpillTarget(t *testing.T) {
	// 6 members, the 5 others 3 calls each, the owner 5: with the next
	// call a share of 21/6, a bound of 5 and a hard cap of 6; the
	// owner's 6 is crowded, rank 1's 4 within its bound.
	for _, tc := range []struct {
		kv        float64
		keepsHome bool
	}{{0.9, true}, {0.89, false}} {
		t.Run(fmt.Sprintf("kv %v", tc.kv), func(t *testing.T) {
			r := newStayRig(t, 6, Options{})
			calls := map[int]int64{0: 5}
			for rank := 1; rank < 6; rank++ {
				calls[rank] = 3
			}
			r.setCalls(t, calls)
			s := telemetry.Sample{Time: r.clock.Now()}
			s.Set(telemetry.Waiting, 0)
			s.Set(telemetry.KVCacheUsage, tc.kv)
			r.b.Publish(r.g.members[r.order[1]].id, s)
			p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey})
			require.NoError(t, err)
			got := r.rankOf(p.ID())
			p.Done(inferlb.Outcome{})
			r.setCalls(t, nil)
			if tc.keepsHome {
				assert.Equal(t, 0, got, "the spill would meet a nearly full cache: the key stays home")
			} else {
				assert.NotEqual(t, 0, got, "the key spills (P2C between the next two)")
			}
		})
	}
}
