package balancer

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// A session stuck to a replica that is passed over for its client errors
// (a wrong API key there) moves on to its key's owner; when that one
// refuses the call too (the user's own token expired), the refusal is the
// key's: it counts in neither the owner's share nor sticks the session
// there. Kills pickAffine not marking the pick past its shunned sticky
// endpoint (pastShunned left false): the owner's share then rose on the
// user's refusals, the session stuck to it, and the next ones took it out
// of every other user's rotation in turn.
func TestRefusalPastAShunnedStickyEndpointIsTheKeys(t *testing.T) {
	r := newStayRig(t, 4, Options{StickyTTL: time.Minute})
	owner, stuck := r.order[0], r.order[1]
	r.b.sticky.Put(r.b.memKey(stayKey, ""), r.g.hashes[stuck])
	for range 20 {
		r.b.noteAnswer(r.g.members[stuck], r.clock.Now().UnixNano(), true)
	}
	require.True(t, r.g.members[stuck].ceShunnable.Load(), "the sticky endpoint refuses every call")

	p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey})
	require.NoError(t, err)
	require.Equal(t, r.g.members[owner].id, p.ID(), "the session left its shunned endpoint for the key's owner")
	p.Done(inferlb.Outcome{ClientError: true})

	assert.Zero(t, r.g.members[owner].clientErrorShare(r.b.cfg, r.clock.Now().UnixNano()), "the key's refusal counted as the owner's")
	v, ok := r.b.sticky.Get(r.b.memKey(stayKey, ""))
	require.True(t, ok)
	assert.Equal(t, r.g.hashes[stuck], v, "the refused session stuck to the owner")
}

// A candidate is passed over for its client errors only when its share is
// more than clientErrorGap above the other's: at exactly the gap the two
// are compared on cost. Kills shunned's comparison made >=.
func TestClientErrorShareAtTheGapIsNotPassedOver(t *testing.T) {
	r := newStayRig(t, 2, Options{})
	nowNs := r.clock.Now().UnixNano()
	marked, other := r.g.members[0], r.g.members[1]
	marked.ceShunnable.Store(true)
	r.b.shunnable.Add(1)
	marked.ceShare.Store(math.Float64bits(clientErrorGap))
	marked.ceAt.Store(nowNs)
	require.Equal(t, clientErrorGap, marked.clientErrorShare(r.b.cfg, nowNs))
	other.inFlight.Store(3) // on cost, marked wins
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	for range 10 {
		assert.False(t, r.b.prefer(req, r.g, 0, 1, r.clock.Now(), false), "passed over at exactly the gap")
		assert.True(t, r.b.prefer(req, r.g, 1, 0, r.clock.Now(), false))
	}
}

// An endpoint whose answers bring its share back under the gap leaves the
// count of marked endpoints (Balancer.shunnable), which is 0 again once
// none is marked: Pick reads no share then, and the affinity bound reads
// no fleet view for it (clientErrorShare). Kills the count not lowered on
// unmarking: every pick of a Balancer that ever marked an endpoint kept
// reading shares and fleet views for good.
func TestUnmarkedEndpointLeavesTheShunnableCount(t *testing.T) {
	r := newStayRig(t, 4, Options{})
	e := r.g.members[0]
	for range 20 {
		r.b.noteAnswer(e, r.clock.Now().UnixNano(), true)
	}
	require.True(t, e.ceShunnable.Load())
	require.EqualValues(t, 1, r.b.shunnable.Load())
	for range 20 {
		r.b.noteAnswer(e, r.clock.Now().UnixNano(), false) // its key rotated: it answers
	}
	assert.False(t, e.ceShunnable.Load())
	assert.Zero(t, r.b.shunnable.Load(), "marked endpoints counted with none marked")
}

// Only a share above clientErrorGap marks an endpoint shunnable: one at
// exactly the gap (one client error at ErrorAlpha 0.5) takes none of the
// pool's room, which goes to the replica refusing every call. Kills
// noteAnswer marking at the gap (r >= clientErrorGap): the first took the
// only room (MaxEjectedFraction 0.25 of 4), and the refusing replica
// stayed in every pick's rotation.
func TestShareAtTheGapTakesNoShunnableRoom(t *testing.T) {
	r := newStayRig(t, 4, Options{ErrorAlpha: 0.5, MaxEjectedFraction: 0.25})
	nowNs := r.clock.Now().UnixNano()
	atGap, refusing := r.g.members[0], r.g.members[1]
	r.b.noteAnswer(atGap, nowNs, true)
	require.Equal(t, clientErrorGap, atGap.clientErrorShare(r.b.cfg, nowNs))
	for range 4 {
		r.b.noteAnswer(refusing, nowNs, true)
	}
	assert.False(t, atGap.ceShunnable.Load(), "marked at the gap")
	assert.True(t, refusing.ceShunnable.Load(), "the refusing replica found no room")
	refusing.inFlight.Store(0)
	r.g.members[2].inFlight.Store(3) // on cost, the refusing replica wins
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding}
	assert.True(t, r.b.prefer(req, r.g, 1, 2, r.clock.Now(), false), "the refusing replica was not passed over")
}

// A tenant's keyed call compares its owner's client-error share with the
// first members of the key's order within the tenant's shard, not with
// endpoints outside it: one tenant whose calls every replica refuses (an
// expired key) raises its shard members' shares alone, and its keys stay
// on their owners, whose peers in the shard refuse alike. Kills
// keyBestShare counting members outside the shard: the reference was an
// outsider's share of 0, every shard member was passed over, and the
// tenant's keys left their owners (for a random member of the shard).
func TestKeyShareReferenceIsTheTenantsShard(t *testing.T) {
	r := newStayRig(t, 8, Options{TenantShardSize: 2})
	req := inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "x"}
	var sh shard
	require.True(t, r.b.tenantShard(&req, r.g, &sh))
	for _, m := range sh.members[:sh.n] {
		for range 20 {
			r.b.noteAnswer(r.g.members[m], r.clock.Now().UnixNano(), true)
		}
		require.True(t, r.g.members[m].ceShunnable.Load())
	}
	for k := uint64(1); k <= 16; k++ {
		w := r.g.placement.Walk(k << 20)
		owner, outsiderFirst := -1, false
		for owner < 0 {
			i, ok := w.Next()
			require.True(t, ok)
			if sh.has(i) {
				owner = i
			} else {
				outsiderFirst = true
			}
		}
		req.AffinityKey = k << 20
		p, err := r.b.Pick(&req)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: context.Canceled}) // its shares stay as they are
		assert.Equal(t, r.g.members[owner].id, p.ID(), "key %d (an outsider before its owner: %v) left its owner", k, outsiderFirst)
	}
}
