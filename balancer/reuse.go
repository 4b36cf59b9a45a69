package balancer

import (
	"sync/atomic"

	"github.com/inferlb/inferlb/cache"
)

// Key reuse (Options.MinKeyReuse).
const (
	// DefaultMinKeyReuse: affinity steers picks while at least 5% of the
	// observed keyed requests carry a key seen recently. Workloads with
	// shared prefixes or conversations are far above it (the fleet
	// simulator's chat and shared-prefix workloads repeat 85-99% of their
	// keys); a stream of prompts that never recur is at 0.
	DefaultMinKeyReuse = 0.05
	// reuseSlots is the size of the table of recently seen keys of the
	// requests without a tenant: 4,096 keys, 32 KiB per Balancer; each
	// class of tenants has reuseTenantSlots of its own (28 KiB for the
	// seven). Keys are seeded hashes, so request data can neither grow a
	// table nor aim at one slot.
	reuseSlots = 4096
	// reuseTenantSlots is a class of tenants' table: its sampled keys
	// alone come and go there, so one tenant's flood of keys that never
	// recur cannot evict the keys of the tenants in other classes (it
	// did from a shared table: a tenant sending 256 unique prompts for
	// each of another's recurring ones turned affinity off for the
	// other, 20 repeats of 848 observed).
	reuseTenantSlots = 512
	// reuseSampleBits: only keys whose top bits are zero are observed, 1 in
	// 8, so most picks touch no shared table slot or counter. A key is
	// observed every time or never, so repeats are seen as repeats.
	reuseSampleBits = 3
	// reuseWarm is how many observations the estimate needs before it may
	// turn affinity off: a fresh Balancer, whose keys are all new, routes
	// by affinity from the first call.
	reuseWarm = 64
	// reuseWindow: when this many observations have accumulated, both
	// counts halve, so the estimate follows a change of workload within
	// about reuseWindow x 8 keyed requests.
	reuseWindow = 1024
	// reuseClasses is how many estimates are kept: one for requests with
	// no tenant and the rest for tenants, by a seeded hash of the name,
	// so that one tenant whose prompts never recur (a RAG pipeline over
	// fresh documents) cannot turn affinity off for the tenants whose
	// prompts do. Tenants sharing a class share its estimate.
	reuseClasses = 8
)

// keyReuse estimates the share of keyed requests whose key recurs, from a
// direct-mapped table of recently observed keys. A key found in its slot
// is a repeat; a collision only makes a repeat look new, which errs
// towards turning affinity off a little early, never towards keeping it
// for keys that do not recur.
//
// Why: affinity sends a key to its owner, chosen by hash, as long as the
// owner is within its load bound; that is a random pick among the
// endpoints within bound. For prompts that recur it buys the KV cache and
// is worth far more than load balance. For prompts that never recur (a
// stream of unique documents, RAG calls whose retrieved context differs
// every time) it buys nothing and costs what P2C would have gained: in the
// fleet simulator's heavy/light mix of unique prompts at 30 req/s, p90 TTFT
// 37 s with affinity against 23 s without. The decision is per workload,
// not per key: a key's first sighting still goes to its owner while keys
// recur, so independent callers keep agreeing on owners (a per-key gate,
// tried first as a temporary edit, sent every caller's first sighting
// elsewhere and cost 8 independent clients 5-15% of their throughput on
// shared prefixes). And it
// depends only on the keys this process sends, not on routing or on
// telemetry, so it cannot feed back on itself the way a gate on the
// fleet's cache hit rate would (which routing without affinity lowers).
//
// The estimate is kept per class of tenants (reuseClasses): requests
// without a Tenant share one, and a tenant's keys are judged with its
// class's, in a table of the class's own (reuseTenantSlots), so that
// another class's keys cannot evict them; a key sent by tenants of two
// classes is a repeat in each only when each sends it again.
//
// Concurrency: all fields are atomic; a race can lose an observation,
// which the estimate tolerates. seed is immutable.
type keyReuse struct {
	seen    [reuseSlots + (reuseClasses-1)*reuseTenantSlots]atomic.Uint64
	keyer   *cache.Keyer // the Balancer's: tenants hash with AffinitySeed
	classes [reuseClasses]reuseCounts
}

type reuseCounts struct {
	observed atomic.Int64
	repeated atomic.Int64
	// The class's table: seen[lo : lo+mask+1]. Immutable.
	lo, mask uint32
	_        [40]byte // a cache line each: classes are counted concurrently
}

func newKeyReuse(k *cache.Keyer) *keyReuse {
	r := &keyReuse{keyer: k}
	r.classes[0].mask = reuseSlots - 1
	for i := 1; i < reuseClasses; i++ {
		r.classes[i].lo = uint32(reuseSlots + (i-1)*reuseTenantSlots)
		r.classes[i].mask = reuseTenantSlots - 1
	}
	return r
}

// class returns the estimate that requests of tenant count in. Tenants
// hash with the Balancer's seed, as tenant shards do: processes with the
// same AffinitySeed class them alike, and without it nobody can pick a
// name that lands in another tenant's class (one in seven does anyway:
// classes soften a neighbour's effect, they do not isolate).
func (r *keyReuse) class(tenant string) *reuseCounts {
	if tenant == "" {
		return &r.classes[0]
	}
	return &r.classes[1+r.keyer.Tenant(tenant)%(reuseClasses-1)]
}

// observe records key in the estimate c (the class of the key's tenant),
// if it is one of the sampled keys.
func (r *keyReuse) observe(key uint64, c *reuseCounts) {
	if key>>(64-reuseSampleBits) != 0 {
		return
	}
	repeat := r.seen[c.lo+uint32(key)&c.mask].Swap(key) == key
	if repeat {
		c.repeated.Add(1)
	}
	if c.observed.Add(1) == reuseWindow {
		c.observed.Add(-reuseWindow / 2)
		c.repeated.Add(-c.repeated.Load() / 2)
	}
}

// recurring reports whether at least min of the keys observed for the
// class c recurred. Until the class has an estimate of its own, the
// classes' sum stands in for it (a tenant's first requests are judged by
// the workload at large), or, with too few observed anywhere to tell, keys
// are followed.
func (r *keyReuse) recurring(c *reuseCounts, min float64) bool {
	if c.observed.Load() >= reuseWarm {
		return c.recurring(min)
	}
	var o, rep int64
	for i := range r.classes {
		o += r.classes[i].observed.Load()
		rep += r.classes[i].repeated.Load()
	}
	return recurring(o, rep, min)
}

func (c *reuseCounts) recurring(min float64) bool {
	return recurring(c.observed.Load(), c.repeated.Load(), min)
}

func recurring(observed, repeated int64, min float64) bool {
	if observed < reuseWarm {
		return true
	}
	return float64(repeated) >= min*float64(observed)
}

// KeyReuseStats is what Balancer.KeyReuse reports.
type KeyReuseStats struct {
	// Observed is how many keyed requests the current estimates rest on
	// (sampled, decayed), summed over the classes of tenants; 0 when no
	// estimate is kept: MinKeyReuse negative, or an affinity mode other
	// than AffinityPrefer.
	Observed int64
	// Ratio is the share of those whose key recurred. Each class decays
	// on its own, so with tenants it weighs a quiet class more than its
	// share of the traffic.
	Ratio float64
	// FollowingKeys is whether affinity keys steer some picks now: false
	// for AffinityOff, and while every class with an estimate is below
	// MinKeyReuse.
	FollowingKeys bool
}

// KeyReuse reports how often affinity keys recur and whether they steer
// picks (see Options.MinKeyReuse), for metrics and debugging.
func (b *Balancer) KeyReuse() KeyReuseStats {
	if b.cfg.affinity == AffinityOff {
		return KeyReuseStats{}
	}
	r := b.reuse
	if r == nil {
		return KeyReuseStats{FollowingKeys: true}
	}
	var repeated int64
	var s KeyReuseStats
	seen := false // some class has an estimate
	for i := range r.classes {
		c := &r.classes[i]
		o := c.observed.Load()
		s.Observed += o
		repeated += c.repeated.Load()
		if o > 0 {
			seen = true
			// As Pick judges the class: by the classes' sum until it
			// has an estimate of its own.
			s.FollowingKeys = s.FollowingKeys || r.recurring(c, b.cfg.minKeyReuse)
		}
	}
	s.FollowingKeys = s.FollowingKeys || !seen
	if s.Observed > 0 {
		s.Ratio = min(float64(repeated)/float64(s.Observed), 1)
	}
	return s
}
