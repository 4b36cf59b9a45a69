package balancer

import (
	"math"
	"slices"

	"github.com/inferlb/inferlb"
)

// MaxTenantShard bounds Options.TenantShardSize: a shard is held on the
// stack of each pick.
const MaxTenantShard = 32

// shard is one tenant's endpoints for one pick: member indices into the
// group, in the order of the tenant's walks (see tenantShard). It lives on the pick's stack; nothing
// is stored per tenant.
type shard struct {
	n       int
	members [MaxTenantShard]int32

	// The shard's load and usable weight for the affinity bound, read
	// once per pick (see share).
	shared bool
	load   int64
	weight float64
}

// share returns the capacity weight of the shard's members the load is
// shared among, those in good standing or, when none is, the ready ones (as
// group.eligibility counts them, but for those whose fresh reading says
// they sleep, those in a run of generation calls abandoned with nothing
// back and, with shunning (some endpoint is marked shunnable), those
// passed over for their client errors, see fleetView), or all, each at the
// weight it takes calls at (times its slow-start factor, relative to lead,
// see standing.lead), and the in-flight calls on those members (calls on
// members out of rotation are not theirs to share). With pass's filter
// (see fitView), the members it passes over are left out of those in good
// standing and the ready ones. The first call of a pick reads them; the
// pick changes no load before it acquires.
func (s *shard) share(c *config, g *group, nowNs int64, lead float64, shunning bool, pass *cand) (load int64, weight float64) {
	if !s.shared {
		var good, ready, all float64
		var goodLoad, readyLoad, allLoad int64
		sleepy := c.store.AsleepObserved() != 0 // a sleeping server was seen (sleep.go)
		floor := math.Inf(1)
		if shunning {
			floor = s.shunnedFloor(c, g, sleepy, nowNs)
		}
		for _, m := range s.members[:s.n] {
			e := g.members[m]
			w := g.weights[m] * min(e.rampFactor(c, nowNs)/lead, 1)
			l := max(e.inFlight.Load(), 0)
			all += w
			allLoad += l
			if e.readyMask.Load()&g.bit == 0 || sleepy && e.asleep(nowNs, c.telemetryMaxAge) {
				continue // a sleeping member takes no call either (see fleetView)
			}
			if e.ceShunnable.Load() && e.clientErrorShare(c, nowNs) > floor {
				continue // nor does one passed over for its client errors (see fleetView)
			}
			if e.unanswering() {
				continue // nor one hung (see fleetView.silent)
			}
			if pass != nil && pass.fit != nil && pass.passOver(e) {
				continue // nor one the pick passes over (see fitView)
			}
			ready += w
			readyLoad += l
			if e.excludedUntil.Load() <= nowNs && inGoodStanding(e, nowNs) {
				good += w
				goodLoad += l
			}
		}
		switch {
		case good > 0:
			s.weight, s.load = good, goodLoad
		case ready > 0:
			s.weight, s.load = ready, readyLoad
		default:
			s.weight, s.load = all, allLoad
		}
		s.shared = true
	}
	return s.load, s.weight
}

// shunnedFloor is group.shunnedFloor over the shard's members: the
// client-error share above which a member marked shunnable is passed over,
// clientErrorGap above the lowest among the shard's awake members in good
// standing or, when none is, its ready ones; +Inf when none is marked.
func (s *shard) shunnedFloor(c *config, g *group, sleepy bool, nowNs int64) float64 {
	marked := false
	goodLeast, readyLeast := math.Inf(1), math.Inf(1)
	for _, m := range s.members[:s.n] {
		e := g.members[m]
		marked = marked || e.ceShunnable.Load()
		if e.readyMask.Load()&g.bit == 0 || sleepy && e.asleep(nowNs, c.telemetryMaxAge) {
			continue
		}
		share := 0.0
		if e.ceShare.Load() != 0 {
			share = e.clientErrorShare(c, nowNs)
		}
		readyLeast = min(readyLeast, share)
		if e.excludedUntil.Load() <= nowNs && inGoodStanding(e, nowNs) {
			goodLeast = min(goodLeast, share)
		}
	}
	switch {
	case !marked:
		return math.Inf(1)
	case !math.IsInf(goodLeast, 1):
		return goodLeast + clientErrorGap
	default:
		return readyLeast + clientErrorGap
	}
}

// calm reports whether the shard is out of panic routing by its own
// members, judged as pick judges the group's: some of its ready members
// (readiness bit bit) are in good standing, and at least PanicThreshold of
// them.
func (s *shard) calm(c *config, g *group, bit uint64, nowNs int64) bool {
	var good, ready int
	for _, m := range s.members[:s.n] {
		e := g.members[m]
		if e.readyMask.Load()&bit == 0 {
			continue
		}
		ready++
		if e.excludedUntil.Load() <= nowNs && inGoodStanding(e, nowNs) {
			good++
		}
	}
	return good > 0 && float64(good) >= c.panicThreshold*float64(ready)
}

func (s *shard) has(i int) bool {
	return slices.Contains(s.members[:s.n], int32(i))
}

// tenantShard fills sh with req's tenant's shard in g and reports whether
// the pick is sharded: sharding is on, the request names a tenant, and the
// group has more members than a shard holds.
//
// Each member comes from a walk of its own: member j is the first on the
// ring from the tenant's j-th key (shardKey) that the shard does not hold
// yet. So a shard is k independent draws by capacity weight, as shuffle
// sharding needs: two tenants share a whole shard about once in C(n, k)
// pairs. The first k members clockwise from one point, as shards were
// first drawn, were as alike as their points: tenants whose keys fell on
// the same arc of the ring (2 pairs in 100n) had the same shard whatever
// k. An endpoint joining or leaving still changes only the shards it
// enters or leaves, by one member each: a member is taken only in place of
// what a walk met first.
func (b *Balancer) tenantShard(req *inferlb.Request, g *group, sh *shard) bool {
	k := b.cfg.tenantShard
	if k <= 0 || req.Tenant == "" || g.placement == nil || len(g.members) <= k {
		return false
	}
	key := b.keyer.Tenant(req.Tenant)
	for j := 0; sh.n < k; j++ {
		w := g.placement.Walk(shardKey(key, j))
		for {
			i, ok := w.Next()
			if !ok {
				// A walk offers every member within a turn: with more
				// members than k, it never ends before a new one.
				return sh.n > 0
			}
			if !sh.has(i) { // a walk past DistinctOffers members may repeat one
				sh.members[sh.n] = int32(i)
				sh.n++
				break
			}
		}
	}
	return sh.n > 0
}

// shardKey is the tenant's j-th placement key: its own for j = 0, then a
// SplitMix64 sequence from it (Walk mixes each key), so the walks start at
// independent points of the ring.
func shardKey(key uint64, j int) uint64 {
	return key + uint64(j)*0x9e3779b97f4a7c15
}

// sample draws a shard member by capacity weight from one 64-bit random
// value. Shards are small (MaxTenantShard), so a linear pass does.
func (s *shard) sample(g *group, r uint64) int {
	total := 0.0
	for _, m := range s.members[:s.n] {
		total += g.weights[m]
	}
	x := float64(r>>11) / (1 << 53) * total
	for _, m := range s.members[:s.n] {
		if x -= g.weights[m]; x < 0 {
			return int(m)
		}
	}
	return int(s.members[s.n-1]) // rounding
}
