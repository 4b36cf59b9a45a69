package balancer

import "sync/atomic"

// Key reuse (Options.MinKeyReuse).
const (
	// DefaultMinKeyReuse: affinity steers picks while at least 5% of the
	// observed keyed requests carry a key seen recently. Workloads with
	// shared prefixes or conversations are far above it (the fleet
	// simulator's chat and shared-prefix workloads repeat 85-99% of their
	// keys); a stream of prompts that never recur is at 0.
	DefaultMinKeyReuse = 0.05
	// reuseSlots is the size of the table of recently seen keys: 4,096
	// keys, 32 KiB per Balancer. Keys are seeded hashes, so request data can
	// neither grow it nor aim at one slot.
	reuseSlots = 4096
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
// Concurrency: all fields are atomic; a race can lose an observation,
// which the estimate tolerates.
type keyReuse struct {
	seen     [reuseSlots]atomic.Uint64
	observed atomic.Int64
	repeated atomic.Int64
}

// observe records key, if it is one of the sampled keys.
func (r *keyReuse) observe(key uint64) {
	if key>>(64-reuseSampleBits) != 0 {
		return
	}
	repeat := r.seen[key%reuseSlots].Swap(key) == key
	if repeat {
		r.repeated.Add(1)
	}
	if r.observed.Add(1) == reuseWindow {
		r.observed.Add(-reuseWindow / 2)
		r.repeated.Add(-r.repeated.Load() / 2)
	}
}

// recurring reports whether at least min of the observed keys recurred,
// or too few were observed to tell.
func (r *keyReuse) recurring(min float64) bool {
	n := r.observed.Load()
	if n < reuseWarm {
		return true
	}
	return float64(r.repeated.Load()) >= min*float64(n)
}

// KeyReuseStats is what Balancer.KeyReuse reports.
type KeyReuseStats struct {
	// Observed is how many keyed requests the current estimate rests on
	// (sampled, decayed); 0 when no estimate is kept: MinKeyReuse negative,
	// or an affinity mode other than AffinityPrefer.
	Observed int64
	// Ratio is the estimated share of keyed requests whose key recurs.
	Ratio float64
	// FollowingKeys is whether affinity keys steer picks now: false for
	// AffinityOff, and while Ratio is below MinKeyReuse.
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
	s := KeyReuseStats{Observed: r.observed.Load(), FollowingKeys: r.recurring(b.cfg.minKeyReuse)}
	if s.Observed > 0 {
		s.Ratio = min(float64(r.repeated.Load())/float64(s.Observed), 1)
	}
	return s
}
