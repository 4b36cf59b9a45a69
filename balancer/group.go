package balancer

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/telemetry"
)

// group is an immutable set of endpoints that can serve one kind of request:
// the whole fleet, or the endpoints serving one model. It belongs to one
// snapshot; the durable load counter it points to does not.
type group struct {
	members []*endpoint
	weights []float64 // capacity weight per member
	total   float64   // sum of weights

	// alias is Vose's alias table for O(1) sampling by weight; nil when all
	// weights are equal (sampling is then a plain uniform draw).
	aliasProb []uint32 // acceptance threshold scaled to 2^32
	aliasIdx  []int32

	load    *atomic.Int64 // durable: in-flight calls on the group's members; nil for a small model group (inFlight)
	bit     uint64        // its membership's readiness bit
	horizon int64         // config.horizon; 0 in a membership's empty group

	bySerial map[uint64]int32 // member index by endpoint serial, for PickAt

	placement *cache.Placement // consistent placement of affinity keys and tenant shards; nil when affinity and tenant sharding are off
	// With StickyTTL: member ID hashes (as stored in the sticky table) and
	// their index. nil otherwise.
	byHash map[uint64]int
	hashes []uint64

	standing atomic.Pointer[standing] // cached eligibility counts, see eligibility
	fleet    fleetView                // cached reported load, see fleetLoad
	fitTags  [fitSlots]atomic.Uint64  // each fits slot's filter's fitTag, to find it (see fitLoad)
	fits     [fitSlots]fitCache       // cached views of filtered calls, see fitLoad
	// The last outlier evaluation that listed the group among the pools to
	// judge; guarded by Balancer.outlierMu (see maybeEvaluateOutliers).
	outlierRound uint64
}

// standing caches how many members are ready and how many are in good
// standing, so the panic decision costs O(1) per pick. It is recomputed when
// the balancer's epoch moves (a readiness or exclusion change, a breaker's
// transition, a half-open breaker's last probe slot taken or given back),
// when the earliest exclusion it saw expires, or when the earliest ramp it
// saw ends.
type standing struct {
	epoch uint64
	at    int64 // unix ns it was computed at
	until int64 // earliest excludedUntil or ramp end in the future at compute time
	ready int
	good  int
	// settled: of the good, those not on probation after an overload
	// cooldown (onProbation). While some are and some are not, picks
	// pass the former over for the latter (cand.steer).
	settled int
	// Capacity weight of the good members, and of the ready ones: the
	// affinity load bound shares the group's load among the members that
	// can take it, not among all.
	goodWeight, readyWeight float64
	// ramping: a ready member is ramping up through slow start, so it
	// takes calls at less than its weight, and the bound shares the load
	// at the weights the fleet view sums (see fleetView).
	ramping bool
	// leadFrom is, when every member taking calls (in good standing, or
	// ready in panic routing) is ramping (a whole new set in a serving pool,
	// every connection back after an outage), the ramp start of the one
	// furthest along; 0 otherwise. Slow start is relative
	// to it (lead): ramping together, members take calls and keys at their
	// weights, as a fleet at full weight does. Absolute, an owner at 0.1
	// kept a tenth of its keys, scattering the rest to caches that had
	// none of them, while no member had more room to offer.
	leadFrom int64
}

// lead is the slow-start factor at nowNs of the member furthest along the
// ramp when every ready member ramps, or 1: slow start admits a member at
// its factor over this (see admitRamp).
func (s *standing) lead(c *config, nowNs int64) float64 {
	if s.leadFrom == 0 {
		return 1
	}
	return c.rampAt(s.leadFrom, nowNs)
}

// usableWeight is the weight the group's load is shared among: its members
// in good standing, or, when none is (panic routing), its ready ones.
func (s *standing) usableWeight() float64 {
	if s.goodWeight > 0 {
		return s.goodWeight
	}
	return s.readyWeight
}

// usable is how many members usableWeight counts.
func (s *standing) usable() int {
	if s.goodWeight > 0 {
		return s.good
	}
	return s.ready
}

func newGroup(members []*endpoint, weights []float64, load *atomic.Int64, bit uint64) *group {
	g := &group{members: members, weights: weights, load: load, bit: bit, bySerial: make(map[uint64]int32, len(members))}
	for i, e := range members {
		g.bySerial[e.serial] = int32(i)
	}
	uniform := true
	for _, w := range weights {
		g.total += w
		if w != weights[0] {
			uniform = false
		}
	}
	if !uniform {
		g.buildAlias()
	}
	return g
}

// countedGroup is the size past which a model's group keeps a load
// counter. A smaller one sums its members' in-flight counts when the
// affinity bound reads its load (inFlight): each call counts on every
// counter of the groups its endpoint is in, and a fleet whose LoRA
// adapters are each on a few replicas puts every endpoint in a group per
// adapter set it holds (160 with 2,000 adapters on 2 or 3 of 32). A
// variable so that tests can give every group a counter.
var countedGroup = 16

// inFlight returns the calls in flight on g's members: its counter, or
// their sum when it keeps none (countedGroup).
func (g *group) inFlight() int64 {
	if g.load != nil {
		return g.load.Load()
	}
	var n int64
	for _, e := range g.members {
		n += e.inFlight.Load()
	}
	return n
}

// indexHashes fills byHash and hashes, for the sticky table.
func (g *group) indexHashes() {
	g.byHash = make(map[uint64]int, len(g.members))
	g.hashes = make([]uint64, len(g.members))
	for i, e := range g.members {
		h := xxhash.Sum64String(e.id) | 1 // never 0: the table's "empty"
		g.byHash[h] = i
		g.hashes[i] = h
	}
}

// buildAlias builds Vose's alias table (Vose 1991, "A linear algorithm for
// generating random numbers with a given distribution").
func (g *group) buildAlias() {
	n := len(g.weights)
	g.aliasProb = make([]uint32, n)
	g.aliasIdx = make([]int32, n)
	scaled := make([]float64, n)
	small := make([]int, 0, n)
	large := make([]int, 0, n)
	for i, w := range g.weights {
		scaled[i] = w * float64(n) / g.total
		if scaled[i] < 1 {
			small = append(small, i)
		} else {
			large = append(large, i)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		g.aliasProb[s] = uint32(scaled[s] * math.MaxUint32)
		g.aliasIdx[s] = int32(l)
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range large {
		g.aliasProb[i] = math.MaxUint32
		g.aliasIdx[i] = int32(i)
	}
	for _, i := range small { // rounding leftovers
		g.aliasProb[i] = math.MaxUint32
		g.aliasIdx[i] = int32(i)
	}
}

// sample draws a member index with probability proportional to its weight
// from one 64-bit random value.
func (g *group) sample(r uint64) int {
	n := uint64(len(g.members))
	// Lemire's multiply-shift maps the high 32 bits onto [0, n).
	hi, _ := bits.Mul64(r>>32, n<<32)
	i := int(hi)
	if g.aliasProb == nil || uint32(r) <= g.aliasProb[i] {
		return i
	}
	return int(g.aliasIdx[i])
}

// eligibility returns the group's cached standing at now, recomputing it
// when stale: the epoch moved, an exclusion it saw has ended, or the clock
// has stepped back by more than the horizon since it was computed. After
// such a step the members' deadlines are mended (see afterStepBack).
func (g *group) eligibility(c *config, epoch uint64, nowNs int64) *standing {
	s := g.standing.Load()
	if s != nil && s.epoch == epoch && nowNs < s.until && nowNs >= s.at-g.horizon {
		return s
	}
	stepped := s != nil && nowNs < s.at-g.horizon
	next := &standing{epoch: epoch, at: nowNs, until: math.MaxInt64}
	// The lead among the members that take calls: those in good standing
	// or, in panic routing, the ready ones. A member at full
	// weight that is excluded takes none, so it does not end the relative
	// ramp of the rest; its return (until) recomputes this.
	var good, ready leadOf
	for i, e := range g.members {
		if stepped {
			e.afterStepBack(nowNs, g.horizon)
		}
		if e.readyMask.Load()&g.bit == 0 {
			continue
		}
		if !stepped && e.setBeforeStep(nowNs, g.horizon) {
			// A group built after the step did not see it (an Update
			// right after it), nor one whose standing was computed
			// before the deadline was set: a ramp an hour ahead held
			// its endpoint at the minimum weight for the hour.
			e.afterStepBack(nowNs, g.horizon)
		}
		end, ramps := e.rampEnd(c, nowNs)
		if ramps {
			next.ramping = true
			next.until = min(next.until, end) // the lead's ends first
		}
		ready.add(ramps, e)
		next.ready++
		next.readyWeight += g.weights[i]
		u := e.excludedUntil.Load()
		if u > nowNs {
			next.until = min(next.until, u)
		} else if inGoodStanding(e, nowNs) {
			next.good++
			if pu := e.probationUntil.Load(); pu > nowNs {
				next.until = min(next.until, pu)
			} else {
				next.settled++
			}
			next.goodWeight += g.weights[i]
			good.add(ramps, e)
		} else if d := e.probeDue.Load(); d > nowNs {
			next.until = min(next.until, d) // its probes are overdue then
		}
	}
	// Panic routing (fewer in good standing than PanicThreshold of the
	// ready, as pick decides it) sends calls to every ready member, those
	// at full weight too: then they count.
	panicking := c.panicThreshold > 0 && float64(next.good) < c.panicThreshold*float64(next.ready)
	if next.good > 0 && !panicking {
		next.leadFrom = good.from()
	} else {
		next.leadFrom = ready.from()
	}
	g.standing.CompareAndSwap(s, next)
	return next
}

// leadOf finds standing.leadFrom over a set of members: the earliest ramp
// start when every one of them ramps.
type leadOf struct {
	start  int64 // earliest ramp start so far; 0 for none (rampFrom is never 0 while ramping)
	atFull bool  // a member is not ramping
}

func (l *leadOf) add(ramps bool, e *endpoint) {
	if !ramps {
		l.atFull = true
		return
	}
	if from := e.rampFrom.Load(); l.start == 0 || from < l.start {
		l.start = from
	}
}

// from is standing.leadFrom for the set: 0 unless every member ramps.
func (l *leadOf) from() int64 {
	if l.atFull {
		return 0
	}
	return l.start
}

// inGoodStanding reports whether a member that is ready and not excluded
// can take calls at nowNs: its breaker is closed, or half-open with a probe
// slot free or its probes out overdue (a half-open breaker with its probes
// out is still breaker-open: as usable says, it takes no call). The probe
// deadline is read only for a breaker with every probe out, so a healthy
// endpoint costs one load, as before.
func inGoodStanding(e *endpoint, nowNs int64) bool {
	return !e.brOpen.Load() || e.probeSlots.Load() > 0 || probesOverdue(e, nowNs)
}

// probing reports whether a pick of e at nowNs would be a half-open
// probe: its breaker is open, its exclusion has ended and a probe slot is
// free (or those out are overdue); or its breaker is capped and its
// probes are due (cappedProbing).
func probing(e *endpoint, nowNs int64) bool {
	if e.brOpen.Load() {
		return e.excludedUntil.Load() <= nowNs && inGoodStanding(e, nowNs)
	}
	return cappedProbing(e, nowNs)
}

// probesOverdue reports whether e's half-open probes, all out, have been
// out past their deadline at nowNs (see takeProbe).
func probesOverdue(e *endpoint, nowNs int64) bool {
	d := e.probeDue.Load()
	return d != 0 && d <= nowNs
}

// fleetView caches, for fleetViewTTL, what the affinity bound needs to
// know about a group beyond its load counter and standing, summed over the
// members the group's load is shared among (those usableWeight counts):
//
//   - total: each one's reported requests (Running plus Waiting in fresh
//     telemetry, brought up to now with the caller's calls there since the
//     report, see readingDelta) or the caller's own calls on it, whichever
//     is more. A member with no fresh Running and Waiting (its scrape
//     fails, its exporter has none) is taken at the reporters' mean per
//     unit of weight, or at the caller's own calls on it if more, while
//     the members that report carry more than half the weight: one
//     silent replica of 8 made the bound count each caller's own calls
//     for the whole group, and independent callers spilled keys at their
//     own moments (fleet simulator, partial-telemetry: p99 TTFT 0.321s,
//     0.141s with the estimate, 0.154s with every replica scraped; seed 1,
//     40 req/s). NaN with fewer reporters, or while a member without a
//     reading may not have been scraped yet at start-up (firstReadingDue):
//     the bound then counts the caller's own calls.
//   - weight: each one's capacity weight times its slow-start factor
//     (relative to the lead's when every member ramps, standing.lead),
//     the weight it takes calls at (see admitRamp).
//   - aside: the caller's calls in flight on the other members (out of
//     rotation), which the group's load counter includes but the members
//     in rotation do not share.
//   - asleep: the capacity weight of the members usableWeight counts
//     whose fresh reading says they sleep (sleep.go). They take no
//     affinity calls until woken, so the load is not theirs to share:
//     counted, 6 sleepers of 8 made the 2 awake members' fair share a
//     quarter of what they carry, and every key spilled off its owner.
//     They are left out of total and weight, and their calls are aside.
//   - shunned: the capacity weight of the members usableWeight counts
//     (and awake) that calls pass over for their client errors: marked
//     shunnable, with a share of client-error answers more than
//     clientErrorGap above the lowest among those members (clienterror.go,
//     shunnedFloor). They take none of the group's calls but a trickle,
//     neither affinity's (shunnedOnWalk) nor P2C's (prefer, scan), so the
//     load is not theirs to share either (a mark, or a share fading
//     below the floor, shows within fleetViewTTL, as a new reading
//     does): counted, one refusing replica of 4 left the other 3
//     a fair share of a quarter of the load they carry each, and owners
//     spilled keys at 4 calls of 12 where their bound is 5
//     (TestAffinityBoundLeavesOutShunnedMembers). As asleep, they are
//     left out of total and weight, and their calls are aside. The walk
//     compares a member with the lowest share among the first members of
//     the key's order, which is at least the group's lowest: a member
//     counted here is passed over by the walk of every key whose first
//     members include one at the group's lowest share (every key, unless
//     as many refusing members as shunLook follow each other in its
//     order).
//   - silent: the capacity weight of the members usableWeight counts
//     (and awake, and not shunned) whose callers gave up on a run of
//     their generation calls with nothing back (endpoint.unanswering): a
//     hung engine behind a live API server. Affinity passes such a member
//     over as a key's owner or spill while a call is out to it
//     (endpoint.silent) and P2C prices it up, so it takes one call at a
//     time, each to hang until its caller gives up: counted, its weight
//     left its peers a fair share a member short, and its hung calls
//     (and frozen gauges) added to the load they share. With one of 8
//     replicas hung and a steady keyed load its peers' keys had 3,280 of
//     their 5,298 calls on their owner, against 3,873 with it not ready
//     and 3,944 left out (TestSilentMemberLeavesOwnersTheirKeys): with
//     one hung call out, the bound was too low, and with many (those out
//     at the hang) too high (TestAffinityBoundLeavesOutSilentMembers). As
//     asleep, such members are
//     left out of total and weight, and their calls are aside. The run,
//     not silent: with no call out it takes its keys' next call, and is
//     silent again as soon as it does (a replica whose engine is back is,
//     until its first answer ends the run); following silent, its
//     weight came back each time its callers had given up on every call
//     out to it, for as long as a fleet view computed then is reused. A
//     run is counted (Balancer.unanswering, markUnanswering): with none,
//     a pick pays one load for it.
//
// Concurrency: all fields are atomic and written by whoever wins
// computing, until last; a reader racing a rewrite may pair one
// computation's fields with another's, a tenth of a second apart, which
// the bound tolerates. It never allocates (Pick does not).
type fleetView struct {
	computing   atomic.Bool
	epoch       atomic.Uint64
	from, until atomic.Int64 // valid for now in [from, until)
	sums        sumCells
}

// sumCells holds a fleetSum in atomics, for fleetView and fitCache: the
// floats as math.Float64bits. Each field is read and written whole; the
// caches say how a reader avoids pairing two writes' fields.
type sumCells struct {
	total, weight, asleep, shunned, silent, passed atomic.Uint64
	aside                                          atomic.Int64
}

func (c *sumCells) load() fleetSum {
	t := math.Float64frombits(c.total.Load())
	return fleetSum{total: t, weight: math.Float64frombits(c.weight.Load()), asleep: math.Float64frombits(c.asleep.Load()),
		shunned: math.Float64frombits(c.shunned.Load()), silent: math.Float64frombits(c.silent.Load()),
		passed: math.Float64frombits(c.passed.Load()), aside: c.aside.Load(), ok: !math.IsNaN(t)}
}

func (c *sumCells) store(v fleetSum) {
	c.total.Store(math.Float64bits(v.total))
	c.weight.Store(math.Float64bits(v.weight))
	c.asleep.Store(math.Float64bits(v.asleep))
	c.shunned.Store(math.Float64bits(v.shunned))
	c.silent.Store(math.Float64bits(v.silent))
	c.passed.Store(math.Float64bits(v.passed))
	c.aside.Store(v.aside)
}

// fleetSum is what fleetView caches; ok is false when total is NaN.
// passed is fitView's: the capacity weight of the members a pick's
// filter passes over (see fitView); 0 in the cached view.
type fleetSum struct {
	total, weight, asleep, shunned, silent, passed float64
	aside                                          int64
	ok                                             bool
}

// fitView is the fleet view (see fleetView) of one pick whose filter
// passes members over: those remembered not to serve the call's model
// (notserved.go), too small for its tokens (window.go) or refusing its
// tenant's calls (tenantrefusal.go). The call cannot go to them, so the
// load its affinity bound shares is not theirs either: counted, the
// weight and calls of the members it cannot fit left each of those it
// fits a fair share of the whole group's load, as if the others took
// some of it. With long chats that fit only 2 of 4 replicas, 783 of the
// 1,500 calls of their keys went to the key's owner, against 1,319 with
// the 2 alone (4 of 8: 1,239 of 3,000 against 1,705), and the owners'
// bound was too high where the others were busy with other models' calls
// (TestSmallWindowMembersLeaveOwnersTheirKeys,
// TestAffinityBoundLeavesOutMembersPassedOver); now 1,319 and 1,771. They
// are left out as asleep members are, in passed. The group's view
// cannot hold it (the members passed over differ from call to call): the
// pick reads it at its first bound from the group's views of filtered
// calls (fitCache), summing it there when none holds for its filter, and
// keeps it on its stack. A pick with no such filter (the usual case, and
// every call that fits every member) pays nothing for it.
type fitView struct {
	done bool
	v    fleetSum
}

// of returns the view, reading it on first use (fitLoad).
func (f *fitView) of(b *Balancer, g *group, st *standing, now time.Time, c *cand) fleetSum {
	if !f.done {
		var summed bool
		f.v, summed = g.fitLoad(b.cfg, st, now, c)
		f.done = true
		if n := b.fitCounts.Load(); n != nil {
			n.Reads.Add(1)
			if summed {
				n.Sums.Add(1)
			}
		}
	}
	return f.v
}

// fitSlots is how many fit views a group caches (fitCache): a filtered
// pick looks for its filter's among all of them, so up to fitSlots
// filters at once (models, tenants, window ranges) each keep theirs.
const fitSlots = 8

// needRange is the tokens a fit view holds for: a call of windowNeed and
// promptNeed tokens passes the same members over when lo < windowNeed <=
// hi and plo < promptNeed <= phi (0: no filter, below every window).
type needRange struct{ lo, hi, plo, phi int64 }

// fitCache caches one fit view of a group (see fitView) for fleetViewTTL,
// as fleetView does the group's: summed anew on every filtered pick, it
// took a keyed pick on 512 endpoints, half of which a long call does not
// fit, from 0.36 us to 5.3 us (BenchmarkFilteredAffinePick/n=512/long,
// medians of 3); read from here, 0.41 us. The members passed
// over are the same for calls of the view's model (lack), tenant
// (refused) and filters whose needs lie in its needRange: between the
// windows of the members they pass over and those they do not. A
// window, "not served" answer or refusal learnt since shows when the view
// lapses, as a new reading does in fleetView. So do the calls this caller
// started or ended on the members passed over: aside holds those in
// flight there when the view was summed, and the bound takes it from the
// group's live count (withinBound), so each such call since moves the
// load the owner's bound shares by one, for up to fleetViewTTL. fleetView's
// aside is on members out of rotation, which take no new calls; the
// members passed over here go on taking other calls (other models',
// tenants', shorter ones).
//
// A group holds fitSlots, and a pick looks at each slot whose tag
// (group.fitTags, one cache line) is its filter's. A view summed anew
// takes a slot that holds none for now (lapsed, or of an older epoch),
// else the one summed longest ago. With 4 slots chosen by a hash of the
// model and tenant, calls of one model whose tokens passed different
// members over (two window ranges) took the same slot, as did models
// whose hashes shared their top bits, and each such call summed the group
// again: keyed picks on 512 endpoints rotating over 2 window ranges of a
// model read no view from here and cost 4.6 us, over 4 models' 5.0 us
// (none read); with 8 slots looked through, all but the lapsed ones are
// read, at 0.40 and 0.38 us, and 8 ranges at 0.47 us against 5.3 us
// (BenchmarkFitViewRotation, medians of 3: go test -run '^$' -bench
// FitViewRotation -benchtime 20000x -cpu 1 ./balancer/;
// TestFitCacheKeepsAViewPerFilterUpToItsSlots). More filters at once than
// fitSlots still take each other's slots, oldest first: 16 in turn find
// none of theirs (7.1 us a pick on 512). The slots cost 1,152 bytes a group
// (576 with 4).
//
// Concurrency: all fields are atomic; seq is odd while one writer, the
// one that made it odd, writes them, and a reader that saw it odd or
// changed misses, so it never pairs one filter's view with another's. A
// tag is a hint, written under seq: a reader checks the slot's whole
// filter. Two picks summing the same filter at once may each take a
// slot; the second lapses with the first.
type fitCache struct {
	seq              atomic.Uint64
	epoch            atomic.Uint64
	from             atomic.Int64 // valid for now in [from, from+fleetViewTTL)
	model, tenant    atomic.Uint64
	flags            atomic.Uint32 // fitLack, fitRefused
	lo, hi, plo, phi atomic.Int64  // needRange
	sums             sumCells
}

// fitCache.flags: which of the pick's filters were set.
const (
	fitLack uint32 = 1 << iota
	fitRefused
)

// live reports whether f holds a view summed at epoch that holds at nowNs.
func (f *fitCache) live(epoch uint64, nowNs int64) bool {
	from := f.from.Load()
	return f.epoch.Load() == epoch && from <= nowNs && nowNs-from < int64(fleetViewTTL)
}

// fitTag is what group.fitTags holds for a slot whose filter has these
// model, tenant and flags: a hint (two filters may share it), never 0,
// which no slot written yet holds.
func fitTag(model, tenant uint64, flags uint32) uint64 {
	return (model ^ bits.RotateLeft64(tenant, 32) ^ uint64(flags)<<60) | 1
}

// fitLoad returns the group's view at now for c's filter (see fitView),
// with st its current eligibility, and whether it summed the members anew
// (no cached view held for the filter).
func (g *group) fitLoad(cfg *config, st *standing, now time.Time, c *cand) (fleetSum, bool) {
	nowNs := now.UnixNano()
	var flags uint32
	var tenant uint64
	if c.lack != nil {
		flags |= fitLack
	}
	if c.refused != nil {
		flags, tenant = flags|fitRefused, c.tenant
	}
	need, needP := int64(c.windowNeed), int64(c.promptNeed)
	tag := fitTag(c.model, tenant, flags)
	for i := range g.fitTags {
		if g.fitTags[i].Load() != tag {
			continue
		}
		f := &g.fits[i]
		if s := f.seq.Load(); s&1 == 0 && f.live(st.epoch, nowNs) &&
			f.model.Load() == c.model && f.tenant.Load() == tenant && f.flags.Load() == flags &&
			f.lo.Load() < need && need <= f.hi.Load() && f.plo.Load() < needP && needP <= f.phi.Load() {
			v := f.sums.load()
			if f.seq.Load() == s {
				return v, false
			}
		}
	}
	r := needRange{lo: -1, hi: math.MaxInt64, plo: -1, phi: math.MaxInt64}
	v := g.sumReported(cfg, st, now, c, &r)
	i := g.fitVictim(st.epoch, nowNs)
	f := &g.fits[i]
	if s := f.seq.Load(); s&1 == 0 && f.seq.CompareAndSwap(s, s+1) {
		g.fitTags[i].Store(tag)
		f.epoch.Store(st.epoch)
		f.from.Store(nowNs)
		f.model.Store(c.model)
		f.tenant.Store(tenant)
		f.flags.Store(flags)
		f.lo.Store(r.lo)
		f.hi.Store(r.hi)
		f.plo.Store(r.plo)
		f.phi.Store(r.phi)
		f.sums.store(v)
		f.seq.Store(s + 2)
	}
	return v, true
}

// fitVictim is the slot a view summed at now takes (see fitCache): the
// first that holds none live, else the one summed longest ago. Its reads
// race writers; a slot written meanwhile is overwritten, no worse than a
// miss.
func (g *group) fitVictim(epoch uint64, nowNs int64) int {
	victim, oldest := 0, int64(math.MaxInt64)
	for i := range g.fits {
		f := &g.fits[i]
		if !f.live(epoch, nowNs) {
			return i
		}
		if from := f.from.Load(); from < oldest {
			victim, oldest = i, from
		}
	}
	return victim
}

// fleetViewTTL is how long a group's reported load is reused: well under
// a scrape interval, so a new scrape shows within a tenth of a second, and
// long enough that summing the members costs nothing per pick.
const fleetViewTTL = 100 * time.Millisecond

// reportedLoad is the requests a server reports running or queued, from a
// sample already cut to fresh fields. A count below zero or above
// maxReportedLoad is a broken reading (an exporter's bug, a counter read as
// a gauge, a hostile server), not a load: counted, one server's 1e12 made
// every other member's fair share of the group's load as large, and
// switched the affinity bound off for the whole fleet.
func reportedLoad(s *telemetry.Sample) (float64, bool) {
	r, ok1 := s.Get(telemetry.Running)
	w, ok2 := s.Get(telemetry.Waiting)
	if !ok1 || !ok2 || !(r >= 0 && w >= 0 && r+w <= maxReportedLoad) {
		return 0, false
	}
	return r + w, true
}

// maxReportedLoad bounds the requests one server can plausibly report
// running and queued: engines run a few hundred at once (vLLM's
// max_num_seqs is 256 to 1,024) and queue thousands at most. Each count
// alone is already at most telemetry.MaxRequests (Sample.Set).
const maxReportedLoad = telemetry.MaxRequests

// fleetLoad returns the group's fleet view at now (see fleetView), with st
// its current eligibility.
func (g *group) fleetLoad(c *config, st *standing, now time.Time) fleetSum {
	nowNs := now.UnixNano()
	f := &g.fleet
	if f.epoch.Load() == st.epoch && f.from.Load() <= nowNs && nowNs < f.until.Load() {
		return f.sums.load()
	}
	v := g.sumReported(c, st, now, nil, nil)
	if f.computing.CompareAndSwap(false, true) {
		f.until.Store(math.MinInt64) // readers recompute while it is written
		f.sums.store(v)
		f.epoch.Store(st.epoch)
		f.from.Store(nowNs)
		f.until.Store(nowNs + int64(fleetViewTTL))
		f.computing.Store(false)
	}
	return v
}

// sumReported computes what fleetView caches or, with pass not nil, the
// view of a pick whose filter passes some members over (see fitView), and
// narrows r (not nil then) to the needs that pass the same members over.
func (g *group) sumReported(c *config, st *standing, now time.Time, pass *cand, r *needRange) fleetSum {
	nowNs := now.UnixNano()
	onlyGood := st.goodWeight > 0
	lead := st.lead(c, nowNs) // the factors are relative to it, as admitted
	var s telemetry.Sample
	v := fleetSum{ok: true}
	var unWeight, unOwn float64             // the weight of the members without a reading, and this caller's calls on them
	pending := false                        // one of them may not have been scraped yet
	sleepy := c.store.AsleepObserved() != 0 // a sleeping server was seen (sleep.go)
	floor := g.shunnedFloor(c, onlyGood, sleepy, nowNs)
	for i, e := range g.members {
		if !g.sharing(e, onlyGood, nowNs) {
			v.aside += max(e.inFlight.Load(), 0)
			continue
		}
		if sleepy && e.asleep(nowNs, c.telemetryMaxAge) {
			v.aside += max(e.inFlight.Load(), 0)
			v.asleep += g.weights[i]
			continue
		}
		if e.ceShunnable.Load() && e.clientErrorShare(c, nowNs) > floor {
			v.aside += max(e.inFlight.Load(), 0)
			v.shunned += g.weights[i]
			continue
		}
		if e.unanswering() {
			v.aside += max(e.inFlight.Load(), 0)
			v.silent += g.weights[i]
			continue
		}
		if pass != nil && pass.passedOver(e, r) {
			v.aside += max(e.inFlight.Load(), 0)
			v.passed += g.weights[i]
			continue
		}
		w := g.weights[i] * min(e.rampFactor(c, nowNs)/lead, 1)
		v.weight += w
		slot := e.slot.Load()
		slot.LoadInto(&s, now, c.telemetryMaxAge)
		own := e.inFlight.Load()
		l, ok := reportedLoad(&s)
		if !ok {
			unWeight += w
			unOwn += float64(max(own, 0))
			pending = pending || firstReadingDue(c, e, nowNs)
			continue
		}
		v.total += max(l+float64(e.readingDelta(slot, &s, own, nowNs)), float64(own))
	}
	if unWeight > 0 {
		// Some members have no reading (see fleetView).
		if rep := v.weight - unWeight; rep > unWeight && !pending {
			v.total += max(v.total/rep*unWeight, unOwn)
		} else {
			v.ok, v.total = false, math.NaN()
		}
	}
	return v
}

// markUnanswering counts e in Balancer.unanswering (on: its run of
// abandoned calls reached scoring.MinAbandoned) or not (its run ended, or
// it left every membership). A mark and a run's end racing may leave e
// counted with no run until its next answer, or a departed endpoint
// counted for good: the affinity bound then reads the group's fleet view
// on every pick, which finds no run and changes no bound.
func (b *Balancer) markUnanswering(e *endpoint, on bool) {
	if on {
		if !e.gone.Load() && !e.inRun.Load() && e.inRun.CompareAndSwap(false, true) {
			b.unanswering.Add(1)
		}
		return
	}
	if e.inRun.Load() && e.inRun.CompareAndSwap(true, false) {
		b.unanswering.Add(-1)
	}
}

// sharing reports whether member e is among those the group's load is
// shared among (usableWeight): ready and, with onlyGood (some member is in
// good standing), in good standing.
func (g *group) sharing(e *endpoint, onlyGood bool, nowNs int64) bool {
	return e.readyMask.Load()&g.bit != 0 && !(onlyGood && (e.excludedUntil.Load() > nowNs || !inGoodStanding(e, nowNs)))
}

// shunnedFloor is the client-error share above which a member the load is
// shared among (sharing, and awake when sleepy) is passed over for its
// client errors, if it is marked shunnable: clientErrorGap above the
// lowest share among those members (see fleetView.shunned). +Inf when
// none of them is marked, at one load per member: sumReported reads no
// share then.
func (g *group) shunnedFloor(c *config, onlyGood, sleepy bool, nowNs int64) float64 {
	marked := false
	for _, e := range g.members {
		if e.ceShunnable.Load() {
			marked = true
			break
		}
	}
	if !marked {
		return math.Inf(1)
	}
	least := math.Inf(1)
	for _, e := range g.members {
		if !g.sharing(e, onlyGood, nowNs) || sleepy && e.asleep(nowNs, c.telemetryMaxAge) {
			continue
		}
		if e.ceShare.Load() == 0 {
			least = 0
			break
		}
		least = min(least, e.clientErrorShare(c, nowNs))
	}
	return least + clientErrorGap
}

// firstReadingDue reports whether e, which has no fresh reading, may just
// not have been scraped yet while the other members' scrapes are phased in
// too: it was among a membership's first endpoints (as every member is when
// the balancer starts and scrapes are phased over the interval) and was
// listed less than a telemetry max-age ago (DefaultTelemetryMaxAge when
// readings never go stale). One listed longer ago lacks its reading. One
// added to a serving pool (a scale-out, a replacement) is estimated at once
// like a member without a reading: waiting for its first scrape put the
// whole group back on each caller's own calls for a max-age after every
// scale-out, and an owner whose server reported the fleet's mean load shed
// its keys whenever this caller's calls happened to be on it.
func firstReadingDue(c *config, e *endpoint, nowNs int64) bool {
	if e.joined == 0 {
		return false // joined a serving pool
	}
	wait := c.telemetryMaxAge
	if wait <= 0 {
		wait = DefaultTelemetryMaxAge
	}
	return nowNs >= e.joined && nowNs-e.joined < int64(wait)
}
