package balancer

import (
	"math"
	"time"
)

// Client errors (inferlb.Outcome.ClientError): answers that the call was
// bad or not allowed, a 401, 403, 404 or 400 in a millisecond. Counted as
// successes, they made a replica with a wrong API key or without the
// route the fastest and least loaded endpoint there is (nothing ever in
// flight, a millisecond a call): it drew 1,998 of 2,000 embedding calls.
// Counted as failures, they would trip every breaker when the caller's
// own token expires and every replica answers 401. So they count as
// neither, give no latency, and each endpoint keeps the share of its
// answers that were client errors: an EWMA over its answers (successes,
// failures and client errors; weight ErrorAlpha each) that fades towards
// 0 with time (ErrorDecay), as the error rate does.
//
// Two candidates are compared on it before their costs: the one whose
// share is more than clientErrorGap above the other's is passed over
// (prefer; scan compares each candidate with the least share among the
// candidates). A replica
// that refuses every call (share near 1) loses to peers that refuse only
// the caller's own bad calls, up to half of them; the caller's own bad
// calls, refused by every replica alike, leave every share alike, and
// change no choice, as long as they spread over the replicas as other
// calls do. Calls that go to a few replicas only do not: a tenant's
// shard (TenantShardSize), a model's endpoints, an affinity key's owner.
// One tenant whose calls are all refused (an expired key; or sent so on
// purpose, since a request's content decides it) raises its shard
// members' shares alone, and once those are far above their peers' every
// other tenant's calls pass them over too, whatever their load: they
// then draw little but that tenant's own calls, which keeps their shares
// high. Model subsets and affinity keys concentrate bad calls alike.
// markShunnable's cap bounds how many of a pool such calls take out of
// the others' rotation, as it bounds outlier ejection. An affinity key's
// refused calls take out its owner, no more: once the walk passes over a
// member for its client errors on the way to an endpoint, a client error
// from that endpoint is the key's (pickPastShunned), counted in neither
// share, and the pick does not stick the key (StickyTTL) there. Counted,
// the key's calls moved to the next endpoint in its order, raised its
// share, moved on, and took endpoint after endpoint out up to the cap:
// one user's session of refused calls, a third of the traffic over 4
// replicas, took 2 out, and the busiest of the rest drew half of every
// other user's calls (TestRefusedKeyTakesOutItsOwnerOnly). A replica that
// refuses every call still raises its share on its own keys' calls and
// its draws, which meet it first.
//
// A shunned replica is not shut out for good: its share fades while it
// draws no calls, and once it is within the gap of
// its peers' it is drawn again, costs deciding. If it still refuses, the
// answer pushes it back above; if it was fixed (its key rotated), its
// successes bring the share down at once. Refusing, it so draws a trickle
// bounded by time, not by traffic: with its peers' share p, about
// s / (ErrorDecay x ErrorAlpha x (1 - s)) calls a second, s = p +
// clientErrorGap: one call every 3 s at the defaults and p = 0 (measured,
// 21 and 30 calls a minute at 200 and 2,000 calls a second:
// TestShunnedReplicaIsTriedNowAndThen).
//
// The gap is wide so that noise does not pass a replica over: with
// ErrorAlpha 0.1 the share of a replica answering a fraction p of calls
// as client errors varies by sqrt(0.1 / 1.9 x p(1 - p)), at most 0.115
// (p = 0.5), and the difference of two peers' by 0.16: the gap is three
// of those.
//
// Only as many of a pool's members may be passed over as outlier
// ejection may hold out (MaxEjectedFraction): see markShunnable. While
// none is marked, Pick reads no share.
//
// The share is one per endpoint, over every tenant's calls: an endpoint
// that refuses one tenant's calls only (its API key not provisioned
// there yet) either stayed below the gap, the tenant's calls failing
// there, or was shunned for every tenant, when that tenant was a large
// part of its calls. A client error that names its tenant
// (Outcome.Tenant) also counts for that endpoint and tenant, which pass
// each other by in picks of that tenant only: see tenantrefusal.go.
//
// The affinity walk passes over a member whose share is more than the gap
// above the lowest of the key's first members (shunnedOnWalk), as it
// passes over one whose breaker is open: a key owned by a replica that
// refuses every call spills to the next endpoints in its order, and a
// session stuck to it moves. Taken without reading the share, the owner
// failed every call of its keys: with prefix keys or sessions over 4
// replicas, a quarter of the chats (TestShunnedOwnerLosesItsKeys).
// Taking no calls, such a member takes no part of the load the others'
// bounds share either, as a member with an open breaker does not
// (fleetView.shunned, shard.share): counted, it left the others' fair
// share a member's weight short, and their keys spilled early
// (TestShunnedMemberLeavesOwnersTheirKeys).
const clientErrorGap = 0.5

// clientErrorShare is e's decayed share of client-error answers at
// nowNs, 0 below errorRateFloor. Pick reads shares only while some
// endpoint is marked shunnable (Balancer.shunnable, markShunnable): a
// Balancer with none pays one load per pick.
func (e *endpoint) clientErrorShare(c *config, nowNs int64) float64 {
	if r := e.rawClientErrorShare(c, nowNs); r >= errorRateFloor {
		return r
	}
	return 0
}

// rawClientErrorShare is clientErrorShare without its floor.
func (e *endpoint) rawClientErrorShare(c *config, nowNs int64) float64 {
	return decayedRate(&e.ceShare, &e.ceAt, c.errorDecay, nowNs)
}

// noteAnswer folds one answer of e's into its client-error share: clientErr
// for a client error, else a success or failure. An answer that is no
// client error on an endpoint whose share is 0 writes nothing. A share
// that crosses clientErrorGap either way marks e shunnable or not
// (markShunnable).
func (b *Balancer) noteAnswer(e *endpoint, nowNs int64, clientErr bool) {
	if !clientErr && e.ceShare.Load() == 0 {
		return
	}
	r := e.foldAnswer(b.cfg, nowNs, clientErr)
	if high := r > clientErrorGap; high != e.ceShunnable.Load() {
		b.markShunnable(e, high, nowNs)
	}
}

// foldAnswer is noteAnswer's update of e's share; it returns the share.
func (e *endpoint) foldAnswer(c *config, nowNs int64, clientErr bool) float64 {
	e.mu.Lock()
	x := 0.0
	if clientErr {
		x = 1
	}
	// From the raw share: read through the floor, client errors that
	// each add less than it (a small ErrorAlpha) would never add up.
	r := e.rawClientErrorShare(c, nowNs)
	r += c.errorAlpha * (x - r)
	if r < errorRateFloor && !clientErr {
		r = 0
	}
	e.ceShare.Store(math.Float64bits(r))
	e.ceAt.Store(nowNs)
	e.mu.Unlock()
	return r
}

// markShunnable makes e shunnable (high) or not. Only so many of a pool's
// members may be passed over for their client errors as outliers may be
// ejected from it (Options.MaxEjectedFraction, at least one): a caller's
// requests are untrusted, and a tenant's shard, a model's endpoints or a
// key's owner take a user's calls alone, so a user sending bad calls
// could raise the shares of the replicas that take them, and the
// comparison alone would pass every one of them over, sending every other
// call to the rest, loaded or not. Within the cap, that is the
// most an outlier ejection does. Room goes to the first to cross; one
// that finds none is not shunned (its share still compared with nobody's)
// and looks again at most once a second, when an answer of its finds its
// share still above the gap. Its mark stays while its share fades with
// time unanswered: the room it holds is freed by the answer that finds
// its share below the gap.
func (b *Balancer) markShunnable(e *endpoint, high bool, nowNs int64) {
	if high {
		if t := e.ceTried.Load(); t != 0 && nowNs-t < int64(time.Second) && nowNs >= t {
			return
		}
	}
	b.shunMu.Lock()
	defer b.shunMu.Unlock()
	if !high {
		if e.ceShunnable.Swap(false) {
			b.shunnable.Add(-1)
		}
		return
	}
	if e.ceShunnable.Load() {
		return
	}
	if pools := e.pools.Load(); pools != nil {
		for _, g := range *pools {
			n := 0
			for _, m := range g.members {
				if m != e && m.ceShunnable.Load() {
					n++
				}
			}
			// As mayEject rounds the cap (at least one).
			if n+1 > max(int(b.cfg.maxEjected*float64(len(g.members))+1e-9), 1) {
				e.ceTried.Store(nonZero(nowNs))
				return
			}
		}
	}
	e.ceShunnable.Store(true)
	b.shunnable.Add(1)
}

// shunned reports whether candidate e, whose client-error share is ci, is
// passed over for one whose share is cj (see clientErrorGap): only if e
// is shunnable (markShunnable).
func shunned(e *endpoint, ci, cj float64) bool {
	return ci-cj > clientErrorGap && e.ceShunnable.Load()
}

// shunLook is how many members of an affinity key's order, from its
// owner on, the key's reference share of client errors is the lowest of
// (keyBestShare). The key's spills go to the first two past the owner
// (stayAwayLook); one more lets a key whose owner and both of those
// refuse calls find the fourth, and on a fleet of four or fewer the
// reference is the group's best.
const shunLook = 4

// shunnedOnWalk reports whether member i, met on the walk of c.key's
// order (its owner, a spill target, the key's sticky endpoint), is passed
// over for its client errors: its share is more than clientErrorGap above
// the lowest of the first shunLook members of the key's order (in the
// shard, in good standing), and it is marked shunnable (markShunnable).
// The walk treats it as it treats a member whose
// breaker is open: an owner so passed over spills its keys to the next
// two in their order, as every caller whose share of it is as high
// spills them. Each caller keeps its own shares, so callers agree on the
// spill as far as their shares agree.
//
// Compared with the key's next members, not with the group's best (a scan
// of the group) nor with only the next one (which let a key whose owner
// and next member both refuse stay home): it costs at most shunLook steps
// of the walk, and only for a member whose share is above the gap (no
// share is below 0, so none under the gap is shunned): nothing while no
// endpoint is marked shunnable, and one load per member met while none
// met is.
func (b *Balancer) shunnedOnWalk(g *group, i int, c *cand, sh *shard) bool {
	e := g.members[i]
	if b.shunnable.Load() == 0 || !e.ceShunnable.Load() {
		return false
	}
	s := e.clientErrorShare(b.cfg, c.nowNs)
	if s <= clientErrorGap {
		return false
	}
	if !c.ceRefSet {
		c.ceRef, c.ceRefSet = b.keyBestShare(g, c, sh), true
	}
	return shunned(e, s, c.ceRef)
}

// keyBestShare is the lowest client-error share among the first shunLook
// members of c.key's order that are in the shard and not passed over for
// the call's model (the order walkAffine follows), counting those in good
// standing (c.ok); 1 when none is.
func (b *Balancer) keyBestShare(g *group, c *cand, sh *shard) float64 {
	best := 1.0
	w := g.placement.Walk(c.key)
	for k := 0; k < shunLook; {
		i, ok := w.Next()
		if !ok {
			break
		}
		e := g.members[i]
		if sh != nil && !sh.has(i) || c.passOver(e) {
			continue // not in the key's order, as in walkAffine
		}
		k++
		if !c.ok(e) {
			continue
		}
		if e.ceShare.Load() == 0 {
			return 0
		}
		best = min(best, e.clientErrorShare(b.cfg, c.nowNs))
	}
	return best
}
