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
func (b *Balancer) withinBound(g *group, i int, now time.Time) bool {
	total := max(g.load.Load(), 0) + 1
	load := g.members[i].inFlight.Load() + 1
	share := g.weights[i] / g.total * float64(total)
	if float64(load) <= math.Ceil(b.cfg.loadBound*share) {
		return true
	}
	// Past the in-flight bound, an LLM server whose fresh telemetry shows
	// an empty queue and room in its KV cache is not saturated: continuous
	// batching absorbs the extra call, while a spill costs a cold prefill of
	// the whole prefix elsewhere. It keeps its keys up to the hard cap.
	if float64(load) > math.Ceil(b.cfg.loadBoundHard*share) {
		return false
	}
	var s telemetry.Sample
	g.members[i].slot.LoadInto(&s, now, b.cfg.telemetryMaxAge)
	w, okW := s.Get(telemetry.Waiting)
	kv, okKV := s.Get(telemetry.KVCacheUsage)
	return okW && w == 0 && (!okKV || kv < 0.9)
}

// pickAffine routes req by its affinity key; -1 means "no opinion" (fall
// back to plain P2C). It walks the key's preference order at most once
// around the ring and never allocates.
func (b *Balancer) pickAffine(req *inferlb.Request, g *group, now time.Time, nowNs int64, panicking bool) int {
	if b.sticky == nil {
		return b.walkAffine(req, g, now, nowNs, panicking)
	}
	// StickyTTL: follow the key to where it last went while that endpoint
	// is usable and within bound; its KV cache is the warmest.
	if v, ok := b.sticky.Get(req.AffinityKey); ok {
		if i, ok := g.byHash[v]; ok && g.members[i].usable(nowNs, panicking) && b.withinBound(g, i, now) {
			return i
		}
	}
	i := b.walkAffine(req, g, now, nowNs, panicking)
	if i >= 0 {
		b.sticky.Put(req.AffinityKey, g.hashes[i])
	}
	return i
}

// walkAffine follows the key's preference order on the ring.
func (b *Balancer) walkAffine(req *inferlb.Request, g *group, now time.Time, nowNs int64, panicking bool) int {
	w := g.placement.Walk(req.AffinityKey)
	first := -1
	n := len(g.members)
	for steps := 0; steps < 2*n+8; steps++ {
		i, ok := w.Next()
		if !ok {
			break
		}
		if i == first || !g.members[i].usable(nowNs, panicking) || !b.withinBound(g, i, now) {
			continue
		}
		if steps == 0 || b.cfg.affinity == AffinityStrict {
			// The owner (or, when strict, the first acceptable endpoint).
			// A ramping endpoint takes its keys only in proportion to its
			// ramp, or slow start would be bypassed by affinity traffic.
			if f := g.members[i].rampFactor(b.cfg, nowNs); f < 1 && float64(b.rand()>>11)/(1<<53) >= f {
				continue
			}
			return i
		}
		if first < 0 {
			first = i
			continue
		}
		sc := b.scorer(req.Service)
		ci, cj := b.cost(sc, req, g, first, now), b.cost(sc, req, g, i, now)
		if cj < ci || (cj == ci && b.rand()&1 == 1) {
			return i
		}
		return first
	}
	return first
}
