package balancer

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/telemetry"
)

// AffinityMode says how a request's AffinityKey steers the pick.
type AffinityMode uint8

const (
	// AffinityPrefer (the default): the key's owner takes the request when
	// it is usable and within its load bound; otherwise P2C decides between
	// the next two usable, within-bound endpoints in the key's own
	// preference order, so spills also agree across independent callers and
	// stay on a few endpoints that warm up for the key.
	AffinityPrefer AffinityMode = iota
	// AffinityOff ignores AffinityKey: plain P2C.
	AffinityOff
	// AffinityStrict takes the first usable, within-bound endpoint in the
	// key's preference order: consistent hashing with bounded loads
	// (Mirrokni, Thorup and Zadimoghaddam, 2018), with no load-aware choice.
	AffinityStrict
)

var affinityNames = [...]string{"prefer", "off", "strict"}

func (m AffinityMode) String() string {
	if int(m) < len(affinityNames) {
		return affinityNames[m]
	}
	return fmt.Sprintf("AffinityMode(%d)", uint8(m))
}

// ParseAffinityMode maps "prefer", "off" or "strict" (any case) to a mode.
func ParseAffinityMode(s string) (AffinityMode, error) {
	for i, n := range affinityNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return AffinityMode(i), nil
		}
	}
	return 0, fmt.Errorf("inferlb: affinity mode %q: want prefer, off or strict", s)
}

// DefaultLoadBound is the bounded-load factor: an endpoint takes affinity
// traffic only while its in-flight calls stay within 1.25x the group's mean
// per unit of capacity (the factor Vimeo and HAProxy use with Mirrokni et
// al.'s scheme; it keeps the maximum load within 25% of the mean while
// moving few keys).
const DefaultLoadBound = 1.25

// placementMembers describes a group's members to the cache package.
func placementMembers(ms []*endpoint, weights []float64) []cache.Member {
	out := make([]cache.Member, len(ms))
	for i, e := range ms {
		out[i] = cache.Member{ID: e.id, Weight: weights[i]}
	}
	return out
}

// withinBound reports whether member i can take one more call without
// passing its bounded-load capacity, counting the new call:
//
//	load_i + 1 <= ceil(c * w_i / W * (L + 1))
//
// (Mirrokni et al.'s bound, weighted by capacity). The ceiling lets an idle
// group's owners take their keys: without it the bound is below one call.
// Past that bound, an LLM server whose fresh telemetry shows an empty queue is
// not saturated: continuous batching absorbs the extra call, while a spill
// costs a cold prefill of the whole prefix elsewhere, so it keeps its keys up
// to unqueuedSlack times the bound.
//
// pressure is the larger of fresh KV-cache usage and GPU memory usage, or -1
// when neither is known. Near a full KV cache the next long prompt preempts
// or evicts others, so the caller moves a key off a pressured owner, but only
// to an endpoint nearby in the key's order that is clearly less pressured:
// when the whole fleet is that full (saturation), a warm prefix is worth more
// than the spill, and keys stay home.
func (b *Balancer) withinBound(g *group, i int, now time.Time) (ok bool, pressure float64) {
	total := max(g.load.Load(), 0) + 1
	load := float64(g.members[i].inFlight.Load() + 1)
	share := g.weights[i] / g.total * float64(total)
	if load > math.Ceil(b.cfg.loadBoundHard*share) {
		return false, -1
	}
	var s telemetry.Sample
	g.members[i].slot.LoadInto(&s, now, b.cfg.telemetryMaxAge)
	pressure = -1
	kv, okKV := s.Get(telemetry.KVCacheUsage)
	if okKV {
		pressure = kv
	}
	if mem, ok := s.MemoryUsage(); ok {
		pressure = max(pressure, mem)
	}
	if load <= math.Ceil(b.cfg.loadBound*share) {
		return true, pressure
	}
	w, okW := s.Get(telemetry.Waiting)
	return okW && w == 0 && (!okKV || kv < 0.9), pressure
}

// Affinity under pressure (see withinBound).
const (
	// unqueuedSlack times LoadBound is the hard cap up to which an owner
	// whose telemetry shows an empty queue keeps its keys. Chosen in the
	// fleet simulator: see Options.LoadBound.
	unqueuedSlack = 1.2
	// pressureSpill is the KV-cache (or GPU memory) usage from which an
	// owner looks for relief.
	pressureSpill = 0.95
	// pressureMargin is how much less pressured the relief must be.
	pressureMargin = 0.2
	// pressureLook is how far along the key's order a pressured owner looks
	// for relief before keeping the key after all.
	pressureLook = 4
)

// pickAffine routes req by its affinity key; -1 means "no opinion" (fall
// back to plain P2C). It walks the key's preference order at most once
// around the ring and never allocates.
func (b *Balancer) pickAffine(req *inferlb.Request, g *group, now time.Time, c cand) int {
	if b.sticky == nil {
		return b.walkAffine(req, g, now, c)
	}
	// StickyTTL: follow the key to where it last went while that endpoint
	// is usable and within bound; its KV cache is the warmest.
	if v, ok := b.sticky.Get(req.AffinityKey); ok {
		if i, ok := g.byHash[v]; ok && c.ok(g.members[i]) {
			if in, p := b.withinBound(g, i, now); in && p < pressureSpill {
				return i
			}
		}
	}
	i := b.walkAffine(req, g, now, c)
	if i >= 0 {
		b.sticky.Put(req.AffinityKey, g.hashes[i])
	}
	return i
}

// walkAffine follows the key's preference order on the ring.
func (b *Balancer) walkAffine(req *inferlb.Request, g *group, now time.Time, c cand) int {
	w := g.placement.Walk(req.AffinityKey)
	first := -1
	home := -1 // a pressured owner, kept in reserve
	relief := 0.0
	n := len(g.members)
	for steps := 0; steps < 2*n+8; steps++ {
		i, ok := w.Next()
		if !ok {
			break
		}
		if home >= 0 && steps > pressureLook && first < 0 {
			return home // nothing nearby is better off: stay home
		}
		if i == first || i == home || !c.ok(g.members[i]) {
			continue
		}
		in, pressure := b.withinBound(g, i, now)
		if !in {
			continue
		}
		if home >= 0 && !(pressure >= 0 && pressure <= relief) {
			continue // not clearly better off than the pressured owner
		}
		if steps == 0 || b.cfg.affinity == AffinityStrict {
			// The owner (or, when strict, the first acceptable endpoint).
			// A ramping endpoint takes its keys only in proportion to its
			// ramp, or slow start would be bypassed by affinity traffic.
			if f := g.members[i].rampFactor(b.cfg, c.nowNs); f < 1 && float64(b.rand()>>11)/(1<<53) >= f {
				continue
			}
			if pressure >= pressureSpill && home < 0 {
				home, relief = i, pressure-pressureMargin
				continue
			}
			return i
		}
		if first < 0 {
			first = i
			if home >= 0 {
				return first // the nearest unpressured endpoint relieves the owner
			}
			continue
		}
		sc := b.scorer(req.Service)
		ci, cj := b.cost(sc, req, g, first, now), b.cost(sc, req, g, i, now)
		if cj < ci || (cj == ci && b.rand()&1 == 1) {
			return i
		}
		return first
	}
	if first >= 0 {
		return first
	}
	return home
}
