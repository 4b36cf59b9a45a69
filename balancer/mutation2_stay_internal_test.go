package balancer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// stayRig is a group of n equal endpoints, the order of one affinity key
// (stayKey) on its ring, and a key owned by each member, to hold calls on
// it.
type stayRig struct {
	b     *Balancer
	clock *testutil.Clock
	g     *group
	order []int          // stayKey's ring order, member indices
	keyOf map[int]uint64 // a key each member owns
	held  []Pick
}

const stayKey = 4242

func newStayRig(t *testing.T, n int, opts Options) *stayRig {
	t.Helper()
	r := &stayRig{clock: testutil.NewClock(), keyOf: map[int]uint64{}}
	opts.Clock = r.clock
	opts.Rand = testutil.NewRand(3)
	opts.AffinitySeed = 77
	opts.MinKeyReuse = -1
	opts.SlowStartWindow = -1
	r.b = New(opts)
	eps := make([]inferlb.Endpoint, n)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("e%d", i), Addr: fmt.Sprintf("e%d:1", i)}
	}
	require.NoError(t, r.b.Update(eps))
	r.g = r.b.def.snap.Load().all
	w := r.g.placement.Walk(stayKey)
	for m, ok := w.Next(); ok; m, ok = w.Next() {
		r.order = append(r.order, m)
	}
	require.Len(t, r.order, n)
	for k := uint64(1); len(r.keyOf) < n; k++ {
		w := r.g.placement.Walk(k)
		m, _ := w.Next()
		if _, ok := r.keyOf[m]; !ok {
			r.keyOf[m] = k
		}
	}
	return r
}

// warm records a spill of stayKey to the member at rank (in stayKey's
// order), as a past pick would have.
func (r *stayRig) warm(rank int) {
	r.b.spilled(stayKey, r.g, r.order[rank], r.clock.Now().UnixNano())
}

// hold puts calls on members (by rank in stayKey's order), one round at
// a time so that no owner passes its bound, each on its own key.
func (r *stayRig) hold(t *testing.T, calls map[int]int) {
	t.Helper()
	for placed := true; placed; {
		placed = false
		for rank := range len(r.order) {
			if calls[rank] == 0 {
				continue
			}
			m := r.order[rank]
			p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: r.keyOf[m]})
			require.NoError(t, err)
			require.Equal(t, r.g.members[m].id, p.ID(), "a call placed on its key's owner")
			r.held = append(r.held, p)
			calls[rank]--
			placed = true
		}
	}
}

func (r *stayRig) release() {
	for i := range r.held {
		r.held[i].Done(inferlb.Outcome{})
	}
	r.held = nil
}

// rankOf is the rank in stayKey's order of the endpoint id.
func (r *stayRig) rankOf(id string) int {
	for rank, m := range r.order {
		if r.g.members[m].id == id {
			return rank
		}
	}
	return -1
}

// overOwner holds 23 calls on 6 endpoints: the owner 4, the member at
// rank cool 3, the others 4. With the next call the fair share is 24/6 =
// 4 and the bound ceil(1.25 x 4) = 5: the owner (5 with the call) is
// within its bound but above its share, the member at rank cool (4) at
// its share.
func (r *stayRig) overOwner(t *testing.T, cool int) {
	calls := map[int]int{}
	for rank := range 6 {
		calls[rank] = 4
	}
	calls[cool] = 3
	r.hold(t, calls)
}

func (r *stayRig) pickKey(t *testing.T, exclude string) string {
	t.Helper()
	p, err := r.b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey}, exclude)
	require.NoError(t, err)
	id := p.ID()
	p.Done(inferlb.Outcome{})
	return id
}

// stayAway looks at the next stayAwayLook (2) endpoints past an owner
// above its share for one warm for the key: the second is looked at, the
// third is not.
func TestStayAwayLooksAtTheNextTwoEndpoints(t *testing.T) {
	for _, tc := range []struct {
		warm, want int
	}{{1, 1}, {2, 2}, {3, 0}} {
		t.Run(fmt.Sprintf("warm at rank %d", tc.warm), func(t *testing.T) {
			r := newStayRig(t, 6, Options{})
			r.warm(tc.warm)
			r.overOwner(t, tc.warm)
			defer r.release()
			assert.Equal(t, tc.want, r.rankOf(r.pickKey(t, "")), "rank of the endpoint the key went to")
		})
	}
}

// The key staying on its warm spill target is a spill: counted as a warm
// one in Stats, as any spill to an endpoint that took the key before.
func TestStayingAwayCountsAWarmSpill(t *testing.T) {
	r := newStayRig(t, 6, Options{})
	r.warm(1)
	target := r.g.members[r.order[1]]
	before := target.spillsWarm.Load()
	r.overOwner(t, 1)
	defer r.release()
	require.Equal(t, 1, r.rankOf(r.pickKey(t, "")))
	assert.Equal(t, before+1, target.spillsWarm.Load(), "the stay is counted as a warm spill")
}

// Only AffinityPrefer has the hysteresis (goHome): under AffinityStrict an
// owner within its bound takes its key back, warm spill target or not.
func TestStrictAffinityHasNoHysteresis(t *testing.T) {
	r := newStayRig(t, 6, Options{Affinity: AffinityStrict})
	r.warm(1)
	r.overOwner(t, 1)
	defer r.release()
	assert.Equal(t, 0, r.rankOf(r.pickKey(t, "")), "strict: the key goes home")
}

// A warm spill target the call may not go to (a retry excluding it) does
// not keep the key away: the key goes home, not to the excluded endpoint.
func TestStayAwayNeverReturnsAnExcludedEndpoint(t *testing.T) {
	r := newStayRig(t, 6, Options{})
	r.warm(1)
	r.overOwner(t, 1)
	defer r.release()
	excluded := r.g.members[r.order[1]].id
	got := r.pickKey(t, excluded)
	assert.NotEqual(t, excluded, got, "a retry went to the endpoint it excludes")
	assert.Equal(t, 0, r.rankOf(got), "the key goes home")
}

// A warm spill target passed over for its client errors (shunnedOnWalk)
// does not keep the key away from its owner.
func TestStayAwaySkipsAShunnedTarget(t *testing.T) {
	r := newStayRig(t, 6, Options{})
	r.warm(1)
	r.overOwner(t, 1)
	defer r.release()
	e := r.g.members[r.order[1]]
	for range 20 {
		r.b.noteAnswer(e, r.clock.Now().UnixNano(), true)
	}
	require.True(t, e.ceShunnable.Load(), "the target is marked shunnable")
	assert.Equal(t, 0, r.rankOf(r.pickKey(t, "")), "the key goes home, not to a target refusing calls")
}
