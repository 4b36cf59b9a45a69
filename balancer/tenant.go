package balancer

import (
	"slices"
	"time"

	"github.com/inferlb/inferlb"
)

// MaxTenantShard bounds Options.TenantShardSize: a shard is held on the
// stack of each pick.
const MaxTenantShard = 32

// shard is one tenant's endpoints for one pick: member indices into the
// group, in the tenant's ring order. It lives on the pick's stack; nothing
// is stored per tenant.
type shard struct {
	n       int
	members [MaxTenantShard]int32
}

func (s *shard) has(i int) bool {
	return slices.Contains(s.members[:s.n], int32(i))
}

// tenantShard fills sh with req's tenant's shard in g and reports whether
// the pick is sharded: sharding is on, the request names a tenant, and the
// group has more members than a shard holds.
func (b *Balancer) tenantShard(req *inferlb.Request, g *group, sh *shard) bool {
	k := b.cfg.tenantShard
	if k <= 0 || req.Tenant == "" || g.placement == nil || len(g.members) <= k {
		return false
	}
	w := g.placement.Walk(b.keyer.Tenant(req.Tenant))
	for sh.n < k {
		i, ok := w.Next()
		if !ok {
			break
		}
		if !sh.has(i) { // a walk past DistinctOffers members may repeat one
			sh.members[sh.n] = int32(i)
			sh.n++
		}
	}
	return sh.n > 0
}

// pickInShard is pick confined to sh: affinity in the key's order among the
// shard's members, else P2C between two of them; -1 when none can take req.
func (b *Balancer) pickInShard(req *inferlb.Request, g *group, now time.Time, c cand, sh *shard) int {
	if req.AffinityKey != 0 {
		if i := b.pickAffine(req, g, now, c, sh); i >= 0 {
			return i
		}
	}
	i := b.drawShard(g, c, sh, -1)
	if i < 0 {
		return -1
	}
	if j := b.drawShard(g, c, sh, i); j >= 0 && b.prefer(req, g, i, j, now) {
		return j
	}
	return i
}

// drawShard is draw within a shard: a usable member other than not, by
// capacity weight and slow start, or -1.
func (b *Balancer) drawShard(g *group, c cand, sh *shard, not int) int {
	total := 0.0
	for _, i := range sh.members[:sh.n] {
		total += g.weights[i]
	}
	for range drawTries {
		x := float64(b.rand()>>11) / (1 << 53) * total
		i := int(sh.members[sh.n-1])
		for _, m := range sh.members[:sh.n] {
			if x -= g.weights[m]; x < 0 {
				i = int(m)
				break
			}
		}
		if i == not || !c.ok(g.members[i]) {
			continue
		}
		if f := g.members[i].rampFactor(b.cfg, c.nowNs); f < 1 && float64(b.rand()>>11)/(1<<53) >= f {
			continue
		}
		return i
	}
	start := int(b.rand() % uint64(sh.n))
	for k := range sh.n {
		i := int(sh.members[(start+k)%sh.n])
		if i != not && c.ok(g.members[i]) {
			return i
		}
	}
	return -1
}
