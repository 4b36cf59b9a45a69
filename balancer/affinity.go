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
	// The bound is the one AffinityPrefer uses, telemetry's widening
	// included, and so is the reserve: an owner somewhat over it keeps its
	// keys when the endpoint they would spill to is queueing too (see
	// Options.LoadBound).
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
// traffic only while its load (its in-flight calls, or its server's report:
// see Options.LoadBound) stays within 1.25x the group's mean per unit of
// capacity (the factor Vimeo and HAProxy use with Mirrokni et
// al.'s scheme; it keeps the maximum load within 25% of the mean while
// moving few keys).
const DefaultLoadBound = 1.25

// Spill memory (Options.SpillMemory).
const (
	// DefaultSpillMemory is how long a spill target counts as warm for the
	// key: about how long an engine under load keeps an unused prefix of
	// a few thousand tokens cached before LRU eviction takes it. In the
	// fleet simulator's shared-prefix workload 30-60s did about equally
	// well; 15s forgot too soon and 90s remembered evicted prefixes.
	DefaultSpillMemory = 45 * time.Second
	// SpillEntries is the size of the spill memory: (key, endpoint) pairs,
	// 32 bytes each. A full table forgets its least recently used pairs,
	// which costs at most a cold spill each.
	SpillEntries = 4096
)

// spillKey names one (affinity key, endpoint) pair in the spill memory; key
// is the affinity key scoped to the call's model (memKey). The endpoint's
// serial is unique for the balancer's life, and the affinity key is a seeded
// hash, so the pair key is as unpredictable as the key itself.
func spillKey(key uint64, e *endpoint) uint64 {
	return key ^ (e.serial * 0x9e3779b97f4a7c15)
}

// memKey is the key under which the sticky table and the spill memory
// remember where an affinity key went for a call of model: the key itself
// for a call that names no model, and otherwise the key scoped to the
// model. A session key (Keyer.Session) names no model, and one session may
// call several (an agent asking a small router model and a large model
// under one session header). Each model has its own KV cache, so an
// endpoint that holds one model's prefix of the session is no warmer for
// another's; with one entry per key, each model's calls overwrote the
// other's sticky endpoint, or followed it. Prompt keys (Keyer.Chat,
// Keyer.Prompt) name their model already: scoping them again changes which
// entry they use, not what they share. The ring keeps the plain key, which
// independent callers agree on.
//
// The model's adapterID is its hash under the Balancer's seed, and key is
// a seeded hash too, so request data cannot aim the result at a set of
// either table (which mix their keys before choosing a set): two pairs
// collide only when the keys differ by what the seeded IDs do. Two model
// names whose (unseeded) modelIDs collide share their sessions' entries:
// only calls of those two names lose by it. The result is never 0, which
// the tables read as empty. It costs a hash of the model's name, once per
// pick that consults either table (memOf).
func (b *Balancer) memKey(key uint64, model string) uint64 {
	if model == "" {
		return key
	}
	return max(key^adapterID(model, b.adapters.seed), 1)
}

// memOf is c.mem, the pick's affinity key scoped to model (memKey),
// computed on first use: a pick whose key goes to its owner, the usual
// case, never consults the spill memory, and pays nothing for the model.
func (b *Balancer) memOf(c *cand, model string) uint64 {
	if c.mem == 0 {
		c.mem = b.memKey(c.key, model)
	}
	return c.mem
}

// spilled counts and remembers that the key (memKey) went to member i,
// which is not the key's owner, and returns i.
func (b *Balancer) spilled(key uint64, g *group, i int, nowNs int64) int {
	if i < 0 {
		return i
	}
	e := g.members[i]
	if b.warmFor(key, g, i, nowNs) {
		e.spillsWarm.Add(1)
	} else {
		e.spillsCold.Add(1)
	}
	if b.spills != nil {
		b.spills.Put(spillKey(key, e), uint64(nowNs))
	}
	return i
}

// warmFor reports whether member i took a spill of the key (memKey) within
// the spill memory, so it likely still holds the key's prefix.
func (b *Balancer) warmFor(key uint64, g *group, i int, nowNs int64) bool {
	if b.spills == nil {
		return false
	}
	k := spillKey(key, g.members[i])
	at, ok := b.spills.Get(k)
	if !ok {
		return false
	}
	if nowNs-int64(at) < int64(b.cfg.spillTTL) {
		return true
	}
	// Cold, and the Get just refreshed its slot: an entry read on every
	// pick of its key (stayAway reads the walk's next endpoints) would
	// hold the slot for good and, expiring last, push its set's warm
	// entries out first. A spill another pick stored since the Get stays.
	b.spills.CompareAndDelete(k, at)
	return false
}

// stayAway is the hysteresis of spills. An owner above its fair share (but
// within its bound) takes its key back only when none of the next
// stayAwayLook endpoints in the key's order is warm for the key (it took a
// spill of it within the spill memory) and at or below its own fair share.
// If one is, the key stays there: it holds the prefix already, and sending
// the key home would make the owner, the busier of the two, pay for it
// while the warm copy goes to waste. Without it, a key whose owner hovers
// around its bound flaps between the two, and the fleet's KV caches hold
// two copies of many prefixes instead of one. w is the key's walk just past
// the owner; it is a copy, so the caller's walk does not advance. -1 means
// the key goes home. The key's order is walkAffine's: members outside the
// shard, or remembered not to serve the call's model, are not in it, so
// they take none of the stayAwayLook looks (nor of fasterSpill's).
func (b *Balancer) stayAway(req *inferlb.Request, g *group, w cache.Walk, c cand, sh *shard, now time.Time) int {
	if b.spills == nil {
		return -1
	}
	for k := 0; k < stayAwayLook; {
		i, ok := w.Next()
		if !ok {
			return -1
		}
		if sh != nil && !sh.has(i) || c.passOver(g.members[i]) {
			continue // not in the key's order, as in walkAffine
		}
		k++
		if !c.ok(g.members[i]) || b.shunnedOnWalk(g, i, &c, sh) || !b.warmFor(b.memOf(&c, req.Model), g, i, c.nowNs) {
			continue
		}
		if bd := b.withinBound(req, g, i, now, sh, &c); bd.in && !bd.over {
			return i
		}
	}
	return -1
}

// goHome returns the owner (home) for req's key, unless the hysteresis of
// spills keeps the key away from an owner above its fair share (see
// stayAway). afterOwner is the key's walk just past the owner. Only
// AffinityPrefer has the hysteresis: AffinityStrict is plain consistent
// hashing with bounded loads.
func (b *Balancer) goHome(req *inferlb.Request, g *group, home int, over bool, afterOwner cache.Walk, c cand, sh *shard, now time.Time) int {
	if over && b.cfg.affinity == AffinityPrefer {
		if j := b.stayAway(req, g, afterOwner, c, sh, now); j >= 0 {
			return b.spilled(b.memOf(&c, req.Model), g, j, c.nowNs)
		}
	}
	return home
}

// fasterSpill moves most of a slow owner's keys to a faster endpoint next
// in their order; -1 keeps the key home.
//
// A generation's decode runs at its endpoint's speed for as long as the
// answer takes, so an owner that decodes several times slower than its
// neighbours (a throttled or degraded GPU, a noisy neighbour) holds every
// conversation it owns to that speed, while the bound, which counts calls,
// sees nothing wrong until its slow calls pile up. With its time per output
// token t_o against t_j of the first of the next stayAwayLook endpoints in
// the key's order whose speed is known and which is within its bound,
// unqueued, not pressured and admitted by its slow start, the owner keeps
// the key when the key's own position in [0, 1) (a mix of its bits, so the
// keys kept are always the same ones, and every caller keeps the same) is
// below
// (slowOwnerTolerance * t_j / t_o)^2, and spills it to that endpoint
// otherwise: 14% of its keys at 4x slower, 56% at 2x. Its share of calls
// falls with its speed and each of its calls lasts longer by the same
// factor, hence the square. The keys it keeps go on measuring its speed, so
// it takes its keys back as it recovers. Only AffinityPrefer yields, and
// only keys of generation calls.
//
// In the fleet simulator's failures scenario (chat at 40 req/s; one of 8
// replicas decodes 4x slower for two minutes, besides a crash and a
// throttled replica) this cut e2e p99 from 32.7s to 25.9s (means of seeds
// 1-6), for p99 TTFT 0.276s -> 0.308s (more cold prefills); without the
// square (37.5% of the keys kept) 28.1s and 0.287s, with the cube 25.4s and
// 0.308s. The rest of the gap to the oracle (14.8s) is the time before the
// first slow call ends and shows the slowdown: removing the slowdown from
// the scenario brings inferlb to 14.4s. Chat, shared-prefix, multi-client
// and dp-chat did not move: their replicas' speeds stay within the
// tolerance.
func (b *Balancer) fasterSpill(req *inferlb.Request, g *group, owner int, w cache.Walk, c cand, sh *shard, now time.Time) int {
	to := g.members[owner].tpotEWMA.Load()
	if to <= 0 || b.cfg.affinity != AffinityPrefer || req.Service != inferlb.ServiceLLM {
		return -1
	}
	for k := 0; k < stayAwayLook; {
		j, ok := w.Next()
		if !ok {
			return -1
		}
		if sh != nil && !sh.has(j) || c.passOver(g.members[j]) {
			continue // not in the key's order, as in walkAffine
		}
		k++
		tj := g.members[j].tpotEWMA.Load()
		if tj <= 0 || !c.ok(g.members[j]) || b.shunnedOnWalk(g, j, &c, sh) {
			continue
		}
		keep := slowOwnerTolerance * float64(tj) / float64(to)
		keep *= keep
		if keep >= 1 || keyPosition(c.key) < keep {
			return -1
		}
		if bd := b.withinBound(req, g, j, now, sh, &c); bd.in && !bd.over && bd.waiting <= 0 && bd.pressure < pressureSpill && b.admitRamp(g.members[j], &c) {
			return j
		}
	}
	return -1
}

// slowOwnerTolerance is the decode-speed ratio below which an owner keeps
// all its keys (see fasterSpill): on a homogeneous fleet speeds differ by
// batch size and noise, which must not move keys off their caches. In the
// failures scenario (seeds 1-6, with the square) 1.0 reached the same e2e
// p99 (25.9s) for a worse p99 TTFT (0.334s).
const slowOwnerTolerance = 1.5

// keyPosition maps an affinity key to [0, 1) through a finalizer (splitmix64's),
// so the position does not follow the key's place on the ring.
func keyPosition(k uint64) float64 {
	k ^= k >> 30
	k *= 0xbf58476d1ce4e5b9
	k ^= k >> 27
	k *= 0x94d049bb133111eb
	k ^= k >> 31
	return float64(k>>11) / (1 << 53)
}

// placementMembers describes a group's members to the cache package.
func placementMembers(ms []*endpoint, weights []float64) []cache.Member {
	out := make([]cache.Member, len(ms))
	for i, e := range ms {
		out[i] = cache.Member{ID: e.id, Weight: weights[i]}
	}
	return out
}

// bound is what withinBound found out about one member.
type bound struct {
	// in: the member can take one more call within its bounded-load
	// capacity, counting the new call:
	//
	//	load_i + 1 <= ceil(c * w_i / W * (L + 1))
	//
	// (Mirrokni et al.'s bound, weighted by capacity). The ceiling lets an
	// idle group's owners take their keys: without it the bound is below one
	// call. Fresh telemetry widens c (see withinBound).
	in bool
	// crowded: over the bound but within unqueuedSlack times it, with a
	// queue (or no telemetry). An owner in this band keeps its keys when
	// the endpoint they would spill to is busy too (see walkAffine).
	crowded bool
	// pressure is the fresh KV-cache usage, or for a server that reports
	// none and is not marked as pre-allocating one its GPU memory usage
	// (see telemetry.Sample.MemoryPressure), or -1 when neither is known.
	pressure float64
	// waiting and kv are the fresh Waiting and KVCacheUsage, or -1.
	waiting, kv float64
	// over: the member's load, counting the new call, is above its fair
	// share of the group's (rounded up, so an idle group is never over).
	over bool
}

// noRelief reports whether spilling from a crowded owner to t would only
// trade one queue for another: t's fresh telemetry shows requests waiting or
// a nearly full KV cache (where admitting the spill evicts or preempts). The
// spill would also pay a cold prefill of the prefix, so the key is better
// kept home. Without telemetry from t, the spill goes ahead.
func noRelief(t bound) bool {
	return t.waiting > 0 || t.kv >= 0.9
}

// withinBound prices member i against the group's bounded load.
//
// Past the bound, an LLM server whose fresh telemetry shows an empty queue is
// not saturated: continuous batching absorbs the extra call, while a spill
// costs a cold prefill of the whole prefix elsewhere, so it keeps its keys up
// to unqueuedSlack times the bound. In that band an owner with a queue is
// crowded: it keeps its keys only if the spill target is busy too.
//
// A bound in calls is tight where calls are few: at light load an owner's
// share is a handful, and a burst of its keys' follow-ups passes it by
// chance while its batch and KV cache are nearly empty. An owner whose
// fresh telemetry shows no queue and a KV cache under roomyKV is that far
// from saturation, so it keeps its keys up to roomyExtra calls past the
// hard cap: few enough that a flood of one key between two scrapes still
// meets the bound, on a fleet of any size.
//
// A single waiting call is no queue while the KV cache has room: it is a
// call that arrived since the server's last step, and the scheduler admits
// it at the next one. So one waiting call counts as none for an owner whose
// KV cache is under arrivalKV (up to the hard cap) or under roomyKV (up to
// roomyExtra past it); two or more are a queue.
//
// Near a full KV cache the next long prompt preempts or evicts others, so the
// caller moves a key off a pressured owner, but only to an endpoint nearby in
// the key's order that is clearly less pressured and has no queue in fresh
// telemetry: when the whole fleet is that full or queueing (saturation), a
// warm prefix is worth more than the spill, and keys stay home.
//
// Other callers' calls count as the servers report them. Every process that
// imports the library routes on its own and sees only its own calls: with
// eight callers, each sees an eighth of an owner's load, with the noise of
// small counts, and each would spill a key at its own moments, so the
// fleet's caches would hold several copies of many prefixes. When every
// member the load is shared among reports Running and Waiting in fresh
// telemetry (the shared telemetry plane all callers read), a member's load
// is what its server reports, brought up to now with this caller's calls
// there since the report (readingDelta: the report lags by up to a scrape,
// and without the correction a single caller would see its own calls that
// ended since as load), or this caller's own calls there if more; the
// group's total is the sum of those (cached for fleetViewTTL). When a
// minority of the members (by weight) has no reading, the total takes each
// of them at the reporters' mean load (see fleetView), and a member that
// reports is bounded by its reading as above; one without a reading, and
// every member when more than that lacks one (or a member without one may
// not have been scraped yet at start-up), is bounded by the caller's own calls against
// the caller's own total, as before. In the fleet
// simulator's shared-prefix workload through eight
// callers this took the cache hit rate from 90.0% to 91.8% and p90 TTFT
// from 13.4s to 6.7s at 16 req/s, and from 0.39s to 0.10s at 8 req/s, with
// one caller unchanged at the simulator's 1 s scrapes (see
// benchmarks/results/multi-client.md); with 15 s scrapes one caller gained
// 2.3% of throughput at 16 req/s (benchmarks/results/SUMMARY.md).
//
// A ramping member takes calls at its weight times its slow-start factor
// (admitRamp), so the load is shared at those weights: counted at full
// weight, one member joining a fleet of three lowered every other's fair
// share by almost a quarter, and owners at the mean load spilled their
// keys for the whole ramp. A ramping member's own bound stays at its full
// weight's share: admission already scales what it is offered.
//
// With a tenant's shard (sh not nil) the shard is the group: the load and
// weight shared are its members', so a tenant busier than the rest of the
// fleet keeps its keys on their owners in its shard instead of finding
// every member over a fair share of the whole group's load. A shard counts
// the caller's own calls only: a server's report does not say whose calls
// it runs.
//
// A member whose LoRA adapter slots are all taken by adapters other than
// the one req names is out of bound for req (see lora.go), and so is one
// whose fresh reading says it sleeps (see sleep.go), or whose callers gave
// up on a run of its generation calls with nothing back while calls are
// out to it (endpoint.silent): a hung engine behind a live API server. A
// sleeping member, which takes no call, is also left out of the load and
// weight the others share, as a member out of rotation is, and so are one
// that calls pass over for its client errors (see fleetView.shunned) and
// one in such a run of abandoned calls, whether or not a call is out to
// it (see fleetView.silent). For a call that cannot go to some members,
// those remembered not to serve its model, too small for its tokens or
// refusing its tenant's calls (c's filter, cand.passOver), they are left
// out of the load and weight its owner's bound shares too (see fitView).
func (b *Balancer) withinBound(req *inferlb.Request, g *group, i int, now time.Time, sh *shard, c *cand) bound {
	var s telemetry.Sample
	slot := g.members[i].slot.Load()
	slot.LoadInto(&s, now, b.cfg.telemetryMaxAge)
	if a, _ := s.Get(telemetry.Asleep); a == 1 {
		return bound{pressure: -1, waiting: -1, kv: -1, over: true} // it serves nothing until woken (sleep.go)
	}
	if g.members[i].silent() {
		return bound{pressure: -1, waiting: -1, kv: -1, over: true} // it answers nothing (endpoint.silent)
	}
	if s.Adapters != nil && req.Model != "" && b.slotAware(req.Service) &&
		g.members[i].slotFull(req.Model, adapterID(req.Model, b.adapters.seed), b.adapters.seed, now.UnixNano(), b.cfg.telemetryMaxAge) {
		return bound{pressure: -1, waiting: -1, kv: -1, over: true} // see lora.go
	}
	own := max(g.members[i].inFlight.Load(), 0)
	gl := g.inFlight()
	total := float64(max(gl, 0)) + 1
	load := float64(own + 1)
	// The load is shared among the members that can take calls: with part
	// of the group down or excluded, the others' fair share is larger, and
	// the calls still in flight on those out of rotation are not theirs.
	var weight float64
	if sh != nil {
		var l int64
		st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
		l, weight = sh.share(b.cfg, g, now.UnixNano(), st.lead(b.cfg, now.UnixNano()), b.shunnable.Load() != 0, c)
		total = float64(l) + 1
	} else {
		st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
		weight = st.usableWeight()
		// Other callers' calls count too, as the servers report them; this
		// caller's calls on members out of rotation do not, as the members
		// in rotation do not share them; and a ramping member shares the
		// load at the weight it takes calls at.
		rep, okRep := reportedLoad(&s)
		fit := c != nil && c.fit != nil
		if okRep || fit || st.ramping || st.usable() < len(g.members) || b.sleepLive(now.UnixNano()) || b.shunnable.Load() != 0 || b.unanswering.Load() != 0 {
			var v fleetSum
			if fit {
				v = c.fit.of(b, g, st, now, c)
			} else {
				v = g.fleetLoad(b.cfg, st, now)
			}
			total = float64(max(gl-v.aside, own)) + 1
			if st.ramping {
				weight = v.weight
			} else {
				// Sleeping members share none of it, nor do those
				// passed over for their client errors or their silence
				// (see fleetView). At least this member's own weight
				// stays: a view cached while it slept (it woke within
				// fleetViewTTL) would otherwise leave a weight near 0,
				// and a share without bound.
				weight = max(weight-v.asleep-v.shunned-v.silent-v.passed, g.weights[i])
			}
			if okRep && v.ok {
				load = max(rep+float64(g.members[i].readingDelta(slot, &s, own, now.UnixNano())), float64(own)) + 1
				total = max(v.total, total-1) + 1
			}
		}
		if weight <= 0 {
			weight = g.total
		}
	}
	share := g.weights[i] / weight * total
	r := bound{pressure: -1, waiting: -1, kv: -1, over: load > ceilBound(share)}
	hard := ceilBound(b.cfg.loadBoundHard * share)
	if load > hard+roomyExtra {
		return r
	}
	kv, okKV := s.Get(telemetry.KVCacheUsage)
	if okKV {
		r.pressure, r.kv = kv, kv
	}
	if mem, ok := s.MemoryPressure(); ok { // none when KV usage is reported
		r.pressure = mem
	}
	w, okW := s.Get(telemetry.Waiting)
	if okW {
		r.waiting = w
	}
	unqueued := okW && w == 0
	// One waiting call with room in the KV cache is a call that arrived
	// since the server's last step, not a queue (see arrivalKV).
	arrival := okW && w <= 1 && okKV
	switch {
	case load <= ceilBound(b.cfg.loadBound*share):
		r.in = true
	case arrival && kv < roomyKV: // within hard+roomyExtra, checked above
		r.in = true
	case load <= hard && (unqueued && (!okKV || kv < 0.9) || arrival && kv < arrivalKV):
		r.in = true
	default:
		r.crowded = load <= hard
	}
	return r
}

// ceilBound is the ceiling of a bound computed in floating point. Where
// the exact bound is a whole number the computed one may lie a rounding
// error above it (1/5 x 12 x 1.25 is 3.0000000000000004), and a plain
// ceiling then allowed one call more: with 5 or 10 equal replicas at the
// default LoadBound, an owner took a 4th call where the bound is 3. Such
// errors are a few ulps; the relative 1e-9 taken off covers them and
// moves no bound that is not whole by more than that.
func ceilBound(x float64) float64 {
	return math.Ceil(x - math.Abs(x)*1e-9)
}

// Affinity under pressure (see withinBound).
const (
	// unqueuedSlack times LoadBound is the hard cap up to which an owner
	// whose telemetry shows an empty queue, or whose spill target is busy
	// too, keeps its keys. Chosen in the fleet simulator: see
	// Options.LoadBound.
	unqueuedSlack = 1.2
	// roomyExtra is how many calls past the hard cap an owner far from
	// saturation keeps its keys: fresh telemetry shows no queue (or one
	// arrival, see arrivalKV) and a KV cache under roomyKV. In the fleet
	// simulator's chat workload at 10, 20 and 30 req/s (before arrivals
	// counted as no queue) this cut p99 TTFT from 0.18s, 0.13s and 0.10s to
	// 0.06s, 0.08s and 0.09s (means of seeds 1-6; e2e p99 +1%): owners of
	// many light keys passed the bound by chance and spilled conversations
	// to cold caches. 8 calls did no better than 4; a cap of 4x the fair
	// share did as well but is no cap at all on a fleet of 4. KV thresholds
	// of 50% and 70% (tried with that 4x cap) let the shared-prefix
	// workload's heavy keys (6k-token contexts) crowd their owners at
	// 4 req/s: e2e p99 17.4s -> 20.7s, against 17.7s at 30% (seeds 1-3).
	roomyExtra = 4
	roomyKV    = 0.3
	// arrivalKV is the KV-cache usage under which one waiting call is an
	// arrival between two of the server's steps rather than a queue (see
	// withinBound). Counted as a queue, it spilled keys from owners a
	// little past their bound with a batch and cache far from full, to
	// cold replicas that prefilled the whole history: in the fleet
	// simulator's dp-chat workload (16 data-parallel ranks) at 20, 40 and
	// 60 req/s counting it as none cut p99 TTFT from 0.171s, 0.202s and
	// 0.220s to 0.087s, 0.120s and 0.166s, and at 80 req/s raised
	// throughput from 21.06k to 21.17k tokens/s; chat's p99 TTFT at 10-40
	// req/s fell by a quarter to two fifths, its e2e p99 rose up to 1.5%
	// (means of seeds 1-6). At any KV usage (up to the hard cap) it cost
	// the shared-prefix workload 1% of its throughput at 20 req/s, where
	// 6k-token contexts crowded their owners; under 50% it cost none. 60%
	// and 70% did about as well; 40% left dp-chat's p99 at 60 req/s at
	// 0.202s.
	arrivalKV = 0.5
	// pressureSpill is the KV-cache (or, without one, GPU memory) usage from which an
	// owner looks for relief.
	pressureSpill = 0.95
	// pressureMargin is how much less pressured the relief must be.
	pressureMargin = 0.2
	// stayAwayLook is how far past the owner, in the key's order, a warm
	// spill target may be for the key to stay there (see stayAway): spills
	// go to the first two endpoints after the owner.
	stayAwayLook = 2
	// pressureLook is how far along the key's order a pressured owner looks
	// for relief before keeping the key after all.
	pressureLook = 4
)

// pickAffine routes req by its affinity key; -1 means "no opinion" (fall
// back to plain P2C). It walks the key's preference order at most once
// around the ring and never allocates.
// sh, when not nil, confines the pick to a tenant's shard. pastShunned
// reports that the key's sticky endpoint or walk passed over a member for
// its client errors on the way to i (shunnedOnWalk): a client error in
// answer is then the key's (pickPastShunned), and the key is not stuck
// to i, whose later answers to it would be counted as i's own.
func (b *Balancer) pickAffine(req *inferlb.Request, g *group, now time.Time, c cand, sh *shard) (i int, pastShunned bool) {
	if b.sticky == nil {
		i = b.walkAffine(req, g, now, c, sh, &pastShunned)
		return i, pastShunned
	}
	// StickyTTL: follow the key, for this model (memKey), to where it last
	// went while that endpoint is usable and within bound; its KV cache is
	// the warmest. A ramping endpoint takes its sticky keys, as its own,
	// only in proportion to its ramp: back from an outage, it would take
	// every idle session stuck to it at once, and slow start would be
	// bypassed by affinity traffic. (A key it also owns gets a second draw
	// in the walk: at a ramp of f it comes back with probability 2f - f^2.)
	mem := b.memOf(&c, req.Model)
	if v, ok := b.sticky.Get(mem); ok {
		if i, ok := g.byHash[v]; ok && (sh == nil || sh.has(i)) && c.ok(g.members[i]) && !c.steerOff(g.members[i]) {
			if b.shunnedOnWalk(g, i, &c, sh) {
				pastShunned = true
			} else if b.admitRamp(g.members[i], &c) {
				if bd := b.withinBound(req, g, i, now, sh, &c); bd.in && bd.pressure < pressureSpill {
					return i, false
				}
			}
		}
	}
	i = b.walkAffine(req, g, now, c, sh, &pastShunned)
	if i >= 0 && !pastShunned {
		b.sticky.Put(mem, g.hashes[i])
	}
	return i, pastShunned
}

// pickSteered is pickAffine while some member is on probation
// (cand.steer), out of line so that a call steering nothing carries none
// of its code.
//
//go:noinline
func (b *Balancer) pickSteered(req *inferlb.Request, g *group, now time.Time, c cand, sh *shard) (i int, pastShunned bool) {
	if !b.settledFor(g, &c, sh) {
		// Every member the key may go to is on probation (the group's
		// settled members are outside the tenant's shard, or passed
		// over by the call's filters): passed over, all of them, the
		// key fell to P2C and scattered over them, cold prefills of its
		// prefix, until a probation ended. As without steering, it goes
		// to its own (TestProbationShardKeysStayWithoutSettledMember).
		c.steer = false
	}
	return b.pickAffine(req, g, now, c, sh)
}

// steerOff reports whether an affinity key passes e over, with c.steer,
// for its probation after an overload cooldown: one that is not a
// half-open breaker's probe, which wins over every peer as in prefer.
// Passed over, the key's owner, half-open and on probation, was probed by
// none of its keys' calls (TestProbationKeyedProbeWins).
func (c *cand) steerOff(e *endpoint) bool {
	return c.steer && steerPast(e, c.nowNs) // inlined: one test of steer when no member is on probation
}

// steerPast is steerOff's test of e, out of line: a member on probation
// and not probing.
//
//go:noinline
func steerPast(e *endpoint, nowNs int64) bool {
	return onProbation(e, nowNs) && !probing(e, nowNs)
}

// settledFor reports whether a member c admits, in sh when not nil, is not
// on probation (onProbation): with cand.steer, somewhere to steer a key
// to. Asked only while steering (some member of the group is on
// probation), and it stops at the first it finds.
func (b *Balancer) settledFor(g *group, c *cand, sh *shard) bool {
	n := len(g.members)
	if sh != nil {
		n = sh.n
	}
	for k := range n {
		i := k
		if sh != nil {
			i = int(sh.members[k])
		}
		if e := g.members[i]; !onProbation(e, c.nowNs) && c.ok(e) {
			return true
		}
	}
	return false
}

// walkAffine follows the key's preference order on the ring.
//
// A crowded owner (over its bound, within unqueuedSlack times it) is kept in
// reserve: if the first endpoint the key could spill to is busy in fresh
// telemetry (requests waiting, or KV cache at 90% or more), the spill would
// trade a queue for a queue plus a cold prefill of the prefix, so the key
// stays home. Without telemetry, or when that endpoint has room, the key
// spills as usual.
//
// With a shard (sh not nil), members outside it are skipped: the owner is
// the key's first endpoint in the shard, and rank counts only the shard's.
// So are members remembered not to serve the call's model (c.lack): the
// key's owner is its first endpoint that has the model, and a key whose
// ring owner lacks it is placed among those that have it as any key is,
// not spilled past a missing owner (which made every such key a spill
// between its model's replicas, moving by load and cold each time).
//
// *pastShunned is set when the walk passes over a member for its client
// errors (see pickAffine).
func (b *Balancer) walkAffine(req *inferlb.Request, g *group, now time.Time, c cand, sh *shard, pastShunned *bool) int {
	w := g.placement.Walk(c.key)
	first := -1
	home := -1        // a pressured owner, kept in reserve
	crowd := -1       // a crowded owner, kept in reserve
	homeOver := false // the pressured owner is above its fair share
	var afterOwner cache.Walk
	relief := 0.0
	n := len(g.members)
	if sh != nil {
		n = sh.n
	}
	rank := -1 // of i among the members offered so far (in the shard)
	for steps := 0; steps < 2*n+8; {
		i, ok := w.Next()
		if !ok {
			break
		}
		if sh != nil && !sh.has(i) || c.passOver(g.members[i]) {
			// Not a step: in a large group a small shard's members can
			// lie far along the key's walk (about n/k offers), and a key
			// that gave up before its owner would lose its endpoint.
			continue
		}
		steps++
		rank++
		if rank == 0 {
			afterOwner = w // a copy: stayAway walks on from the owner
		}
		if home >= 0 && rank > pressureLook && first < 0 {
			return b.goHome(req, g, home, homeOver, afterOwner, c, sh, now) // nothing nearby is better off
		}
		if i == first || i == home || i == crowd || !c.ok(g.members[i]) || c.steerOff(g.members[i]) {
			continue // on probation: as if cooling down still (see Balancer.cooldown)
		}
		if b.shunnedOnWalk(g, i, &c, sh) {
			*pastShunned = true
			continue
		}
		bd := b.withinBound(req, g, i, now, sh, &c)
		if rank == 0 && bd.crowded {
			if b.admitRamp(g.members[i], &c) {
				crowd = i
			}
			continue
		}
		if !bd.in {
			continue
		}
		if home >= 0 && !(bd.pressure >= 0 && bd.pressure <= relief && bd.waiting <= 0) {
			// Not clearly better off than the pressured owner: fuller, or
			// unknown, or queueing (relief there would trade a full cache
			// for a queue plus a cold prefill of the prefix).
			continue
		}
		if crowd >= 0 && first < 0 && noRelief(bd) && !b.warmFor(b.memOf(&c, req.Model), g, i, c.nowNs) {
			return crowd // the spill would queue too: stay warm
		}
		if rank == 0 || b.cfg.affinity == AffinityStrict {
			// The owner (or, when strict, the first acceptable endpoint).
			// A ramping endpoint takes its keys only in proportion to its
			// ramp, or slow start would be bypassed by affinity traffic.
			if !b.admitRamp(g.members[i], &c) {
				continue
			}
			if bd.pressure >= pressureSpill && home < 0 {
				home, relief, homeOver = i, bd.pressure-pressureMargin, bd.over
				continue
			}
			if rank > 0 {
				return b.spilled(b.memOf(&c, req.Model), g, i, c.nowNs) // strict: past the owner
			}
			if j := b.fasterSpill(req, g, i, afterOwner, c, sh, now); j >= 0 {
				return b.spilled(b.memOf(&c, req.Model), g, j, c.nowNs)
			}
			return b.goHome(req, g, i, bd.over, afterOwner, c, sh, now) // i is the owner: rank 0
		}
		if !b.admitRamp(g.members[i], &c) {
			// A ramping endpoint takes spills, as its own keys and P2C's
			// draws, only in proportion to its ramp: idle, it would win
			// every spill it was a candidate for.
			continue
		}
		if first < 0 {
			first = i
			if home >= 0 {
				// The nearest unpressured endpoint relieves the owner.
				return b.spilled(b.memOf(&c, req.Model), g, first, c.nowNs)
			}
			continue
		}
		mem := b.memOf(&c, req.Model)
		if wf, wi := b.warmFor(mem, g, first, c.nowNs), b.warmFor(mem, g, i, c.nowNs); wf != wi {
			if wi {
				return b.spilled(mem, g, i, c.nowNs)
			}
			return b.spilled(mem, g, first, c.nowNs)
		}
		if b.prefer(req, g, first, i, now, c.steer) {
			return b.spilled(mem, g, i, c.nowNs)
		}
		return b.spilled(mem, g, first, c.nowNs)
	}
	if first >= 0 {
		return b.spilled(b.memOf(&c, req.Model), g, first, c.nowNs)
	}
	if home >= 0 {
		return b.goHome(req, g, home, homeOver, afterOwner, c, sh, now)
	}
	return crowd
}
