package balancer

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/decay"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// endpoint is the durable live state of one endpoint ID. It outlives picker
// snapshots: Update reconciles by ID and keeps it for endpoints that stay.
//
// Concurrency: id and serial are immutable. Every other field is atomic
// and read without locks by Pick; slot is written only under the
// Balancer's mu (see reconcile). mu serializes the read-modify-write
// of the error rate and its time in Done (failures are rare), and its
// reset as the breaker closes (forgiveErrors, under brMu); the latency
// EWMAs are single words updated by compare-and-swap, so the path of a
// success takes no lock.
type endpoint struct {
	// Hot: the fields Pick and Done touch come first, packed into the first
	// two cache lines, so a pick over thousands of endpoints misses as few
	// lines as possible (n=4096 versus n=8 in BenchmarkPick).
	readyMask      atomic.Uint64 // per Membership (bit Membership.bit): listed there and ready (gRPC subchannel READY)
	brOpen         atomic.Bool   // the breaker's exclusion is in force (open or probing)
	probeSlots     atomic.Int32  // half-open probes left to hand out
	brState        atomic.Int32  // mirror of gobreaker's state (closed = 0)
	brGen          atomic.Uint32 // bumped on every breaker exclusion and recovery
	excludedUntil  atomic.Int64  // unix ns; soft exclusion (cooldown, ejection, open breaker) until then
	rampFrom       atomic.Int64  // unix ns slow start began; 0 = not ramping
	inFlight       atomic.Int64
	inFlightTokens atomic.Int64
	busySince      atomic.Int64                     // unix ns of the last pick that took inFlight from 0 to 1 (see pending)
	lastDone       atomic.Int64                     // unix ns of the last Done that was not a cancellation (see pending)
	abandoned      atomic.Int64                     // generation calls given up on with nothing back since then (see noteAbandoned)
	histSec        atomic.Uint32                    // unix second + 1 of the last entry in hist (see recordInFlight)
	info           atomic.Pointer[inferlb.Endpoint] // latest description from Update
	slot           atomic.Pointer[telemetry.Slot]   // held in the Store; nil while the Store is full (see reconcile)
	joined         int64                            // unix ns the endpoint was first listed among a membership's first endpoints, 0 if it joined a serving pool; set before it is published (see firstReadingDue)
	lora           loraFlight                       // this process's calls per LoRA adapter in flight here (lora.go)
	windows        atomic.Pointer[[]window]         // context windows it refused calls for (window.go)
	groupLoads     atomic.Pointer[loadSet]          // in-flight counters of the groups it belongs to
	lat            [inferlb.NumServices]latencyMark // per Service: an embedding's latency is not a chat's
	ttftEWMA       atomic.Int64                     // ns
	tpotEWMA       atomic.Int64                     // ns per output token after the first (decode speed)
	errRate        atomic.Uint64                    // float64 bits
	errAt          atomic.Int64                     // unix ns of last counted outcome
	ceShare        atomic.Uint64                    // float64 bits: decaying share of answers that were client errors (clienterror.go)
	ceAt           atomic.Int64                     // unix ns of the last answer that moved ceShare
	ceShunnable    atomic.Bool                      // its share may pass it over: within MaxEjectedFraction of its pools (clienterror.go); written under Balancer.shunMu
	ceTried        atomic.Int64                     // unix ns it last found no room to be shunnable (see Balancer.markShunnable)
	failStreak     atomic.Int64                     // unix ns of the first failure of the current streak; 0 = none; written under brMu
	successes      atomic.Uint64
	mu             sync.Mutex // serializes error-rate and client-error-share updates; never taken by Pick
	brMu           sync.Mutex // makes report's generation check and the breaker's transition one step; never taken by Pick
	id             string     // immutable
	serial         uint64     // immutable; see Pick.Serial
	b              *Balancer  // immutable: whose state it is (Pick.Done reaches it through e)

	// Cold.
	wasReady atomic.Bool // it was ready and in use before: SetReady(true) turned it ready, or it served calls before SetReady(false)
	// The Balancer's own membership's (Update's) latest description of
	// it, kept after that membership drops it (a pick made just before
	// still reads it); nil if that membership never listed it. info is
	// the latest of any membership's.
	ownInfo atomic.Pointer[inferlb.Endpoint]
	// gone: no membership lists it any more (set by reconcile, never
	// cleared: an ID added back gets a new endpoint). Its calls still in
	// flight end on it, but what it would do by ID (events, expiring the
	// ID's telemetry) is left undone: the ID may be another endpoint's by
	// then.
	gone atomic.Bool
	// inRun: counted in Balancer.unanswering, its run of abandoned
	// calls long enough to be silent (see markUnanswering).
	inRun atomic.Bool
	// capped: what MaxEjectedFraction keeps from holding it out, one bit
	// per mechanism (cappedBreaker, cappedOutlier), so that EventCapped
	// comes once per episode, not per failure or evaluation.
	capped atomic.Uint32
	// firstTokenAt: unix ns of the latest first token of a generation
	// call its caller stopped after that token (a stream cut short): an
	// answer, as a generation's success is (see answeredSince). Written
	// on such a call's Done only, read on the Done of one abandoned.
	firstTokenAt atomic.Int64
	// latDialed is, per Service, a latency sample of a latency-scored
	// service that may include a new connection's setup (the endpoint's
	// first answer, or one marked inferlb.Outcome.Dialed), held aside
	// until the next sample (see pairDialed); 0 when none is. Cold: read
	// for latency-scored calls only.
	latDialed [inferlb.NumServices]atomic.Int64 // ns

	// The server's load reading (telemetry Running, else Waiting) as last
	// seen by a pick: when it was observed (unix ns), and this process's
	// in-flight count then (see readingDelta).
	readingAt   atomic.Int64
	readingBase atomic.Int64
	// The same for the KV-cache usage when its time is not the load
	// reading's (a load header carries it, and no Running): kvAt is its
	// time, kvBase the in-flight count then (see kvDelta).
	kvAt, kvBase atomic.Int64
	// The same for the queue (Waiting) when it is newer than Running (a
	// load header carries it, and no Running): waitAt is its time, waitBase
	// the in-flight count then (see queuedSince).
	waitAt, waitBase atomic.Int64
	// The in-flight count before the first pick of each of the last
	// inFlightHistory seconds with a pick, as (unix second + 1) << 32 |
	// count: a reading that arrives long after it was measured counts the
	// calls picked since its time from here (see readingDelta).
	hist [inFlightHistory]atomic.Uint64

	// Data-parallel attention (dp.go): the ranks of e's engine, e included
	// (nil when e is in none), and the prompt tokens sent to e recently.
	dpPeers atomic.Pointer[[]*endpoint]
	prefill prefillEstimate

	// Resilience (resilience.go). breaker is immutable (nil when disabled).
	breaker       *gobreaker.CircuitBreaker[struct{}]
	opens         atomic.Int32 // recent opens, for the doubling exclusion time (see tripCount)
	trippedAt     atomic.Int64
	recoveredAt   atomic.Int64 // unix ns of the last recovery; 0 before any
	ejectedUntil  atomic.Int64 // outlier ejection in force until
	ejections     atomic.Int32 // consecutive outlier ejections
	lastDetection atomic.Int64 // ns
	lastDowntime  atomic.Int64 // ns
	trips         atomic.Uint64
	recoveries    atomic.Uint64
	ejectCount    atomic.Uint64
	// Overload answers (see Balancer.cooldown): the refusals in a row of
	// calls sent to it after its latest cooldown had ended; when that
	// cooldown ends (unix ns), which tells such calls from those of the
	// same burst; and until when it is second choice after it (its
	// probation, unix ns; math.MinInt64 for none). Written by Done
	// without a lock: answers that race may miscount the row by one,
	// which moves one probation by a doubling. Pick reads only
	// probationUntil.
	shedStreak     atomic.Int32
	shedBack       atomic.Int64
	probationUntil atomic.Int64
	// When the half-open breaker's probes, all out, are overdue and let
	// one more through (unix ns; set as the last slot is taken, read only
	// while none is free), and the wait before the next (ns): see takeProbe.
	probeDue, probeLife atomic.Int64
	// When a capped breaker's probes are due (unix ns; 0 while it is not
	// capped): see armCappedProbes.
	capProbeAt atomic.Int64
	// The groups, in every membership listing it, that it counts against
	// MaxEjectedFraction (see mayEject); set by reconcile, immutable
	// groups.
	pools atomic.Pointer[[]*group]
	// Outlier detection's window, guarded by Balancer.outlierMu (see
	// maybeEvaluateOutliers): the counts at its start; the success rate in
	// it, valid when winRound is the current evaluation (the endpoint had
	// OutlierMinRequests calls); winPeered, the evaluation in which some
	// pool of its had enough judged members to judge it; winOutlier, that
	// it fell below the margin in one of them.
	winSucc, winFail    uint64
	winRate             float64
	winRound, winPeered uint64
	winOutlier          bool

	failures  atomic.Uint64
	overloads atomic.Uint64
	canceled  atomic.Uint64 // with the three above, notServed, tooLong, clientErrors, modelFailures and inFlight: the picks
	// Of canceled, those given up on with nothing back (Outcome.Unanswered).
	unanswered atomic.Uint64
	notServed  atomic.Uint64 // answers that it does not serve the call's model
	tooLong    atomic.Uint64 // answers that the call is longer than its context window
	// Answers that the call was bad or not allowed (Outcome.ClientError).
	clientErrors atomic.Uint64
	// Failures held against their model on this endpoint, not against the
	// endpoint (see modelfail.go); its latest successes and failures by
	// model (failed.at0: the time of its latest failure).
	modelFailures atomic.Uint64
	served        recent
	failed        recent
	picksSeen     atomic.Uint64 // the largest pick count reported; see pickCount

	// Affinity calls taken as a spill (not the key's owner), by whether the
	// spill memory knew the endpoint as warm for the key.
	spillsWarm, spillsCold atomic.Uint64
}

// pickCount derives how many calls were routed to e from how they ended
// and how many are in flight, which spares Pick a counter of its own. It
// reads the ended counts before the in-flight count: Done decrements
// in-flight before it counts the ending, so a reading never counts a call
// twice and never exceeds the truth. It can miss a call that ends while it
// reads, so the result is clamped to the largest count reported before:
// exported as a Prometheus counter, it must never go down.
func (e *endpoint) pickCount() uint64 {
	n := e.successes.Load() + e.failures.Load() + e.overloads.Load() + e.canceled.Load() + e.notServed.Load() + e.tooLong.Load() + e.modelFailures.Load() + e.clientErrors.Load()
	n += uint64(max(e.inFlight.Load(), 0))
	for {
		seen := e.picksSeen.Load()
		if n <= seen {
			return seen
		}
		if e.picksSeen.CompareAndSwap(seen, n) {
			return n
		}
	}
}

// newEndpoint returns fresh state for id, ready nowhere: the Membership that
// lists it sets its own bit.
func newEndpoint(b *Balancer, id string, slot *telemetry.Slot) *endpoint {
	e := &endpoint{id: id, b: b}
	// Never excluded or ejected: before every reading. Not 0, which a
	// clock that reads before 1970 (a fake one from the zero Time) reads
	// as ahead of it: the endpoint was out of rotation, and counted as
	// ejected against MaxEjectedFraction, until a pick's standing count
	// (see afterStepBack) happened to mend it.
	e.excludedUntil.Store(math.MinInt64)
	e.ejectedUntil.Store(math.MinInt64)
	e.shedBack.Store(math.MinInt64)
	e.probationUntil.Store(math.MinInt64)
	e.slot.Store(slot)
	e.groupLoads.Store(new(loadSet)) // in no group until reconcile
	return e
}

// loadSet is the in-flight counters of the groups an endpoint belongs to,
// with how many of the endpoint's calls are counted on them. setGroupLoads
// replaces it when the endpoint's groups change, moving the calls to the
// new set; counters is immutable.
type loadSet struct {
	counters []*atomic.Int64
	// Twice the calls counted on counters; the low bit is set (sealed)
	// once setGroupLoads has moved them to the next set.
	calls atomic.Int64
}

// usable reports whether a pick from the Membership with readiness bit may
// consider e: ready there, and in good standing unless the group is in panic.
func (e *endpoint) usable(bit uint64, nowNs int64, panicking bool) bool {
	if e.readyMask.Load()&bit == 0 {
		return false
	}
	if panicking {
		return true
	}
	if e.excludedUntil.Load() > nowNs {
		return false
	}
	// A breaker past its exclusion is half-open: only probeSlots calls,
	// or one more when those out are overdue.
	return inGoodStanding(e, nowNs)
}

// rampFactor is the slow-start fraction of weight at now, in (0, 1].
func (e *endpoint) rampFactor(c *config, nowNs int64) float64 {
	return c.rampAt(e.rampFrom.Load(), nowNs)
}

// rampAt is the slow-start factor at nowNs of a ramp that started at from
// (0: none).
func (c *config) rampAt(from, nowNs int64) float64 {
	if from == 0 || c.slowStart <= 0 {
		return 1
	}
	elapsed := nowNs - from
	if elapsed >= int64(c.slowStart) {
		return 1
	}
	if elapsed <= 0 {
		return c.slowStartMin
	}
	f := float64(elapsed) / float64(c.slowStart)
	if c.slowStartAggr != 1 {
		f = math.Pow(f, 1/c.slowStartAggr)
	}
	return max(f, c.slowStartMin)
}

// rampEnd returns when e's slow-start ramp ends, and false when it is not
// ramping at now.
func (e *endpoint) rampEnd(c *config, nowNs int64) (int64, bool) {
	from := e.rampFrom.Load()
	if from == 0 || c.slowStart <= 0 {
		return 0, false
	}
	end := later(from, c.slowStart) // a window of centuries would wrap
	return end, end > nowNs
}

// state fills a scoring.State for e at now, for a call of service svc.
func (e *endpoint) state(c *config, now time.Time, svc inferlb.Service, weight float64, st *scoring.State) {
	nowNs := now.UnixNano()
	st.Endpoint = e.info.Load()
	st.Now = now
	st.Weight = weight
	st.InFlight = e.inFlight.Load()
	st.InFlightTokens = e.inFlightTokens.Load()
	lat := &e.lat[svcIndex(svc)]
	st.LatencyEWMA = time.Duration(lat.ewma.Load())
	at := lat.at.Load()
	if at-nowNs > int64(stepTolerance) {
		// The clock stepped back past the last sample: the EWMA decays from
		// now on, as the error rate does (see rawErrorRate). Left ahead,
		// the scorer saw no time elapsed for the length of the step, and
		// an endpoint avoided for its latency (so no sample moves the mark)
		// stayed avoided as long.
		lat.at.CompareAndSwap(at, nowNs)
		at = nowNs
	}
	st.LastLatency = time.Unix(0, at)
	st.LatencyDecay = c.latencyDecay
	st.TTFTEWMA = time.Duration(e.ttftEWMA.Load())
	st.ErrorRate = e.errorRate(c, nowNs)
	st.Pending = e.pending(st.InFlight, nowNs)
	st.Abandoned = e.abandoned.Load()
	slot := e.slot.Load()
	slot.LoadInto(&st.Telemetry, now, c.telemetryMaxAge)
	st.InFlightSinceReading, st.InFlightSinceKV = 0, 0 // st may hold another candidate's
	tel := &st.Telemetry
	loadAt := int64(0) // the load reading's time; 0 without one
	if tel.Has.Has(telemetry.Running) || tel.Has.Has(telemetry.Waiting) {
		loadAt = readingTime(slot, tel.Has)
		since := e.sinceBase(&e.readingAt, &e.readingBase, loadAt, st.InFlight, nowNs)
		st.InFlightSinceReading = e.queuedSince(slot, tel, loadAt, since, st.InFlight, nowNs)
	}
	if tel.Has.Has(telemetry.KVCacheUsage) {
		st.InFlightSinceKV = e.kvDelta(slot.Observed(telemetry.KVCacheUsage), loadAt, st.InFlightSinceReading, st.InFlight, nowNs)
	}
}

// inFlightHistory is how many seconds of in-flight counts an endpoint
// keeps for readingDelta: past DefaultTelemetryMaxAge, after which a
// reading is stale anyway.
const inFlightHistory = 32

// lateReading is the age past which a reading's base comes from the
// history rather than from when a pick first sees it: a scrape polled
// directly arrives within a poll's time, one read from Prometheus up to a
// scrape interval (15-30 s) after it was measured.
const lateReading = 2 * time.Second

// recordInFlight keeps the in-flight count before the first pick of the
// second sec (unix, plus 1 so that a zero entry is none). acquire calls it
// when histSec says the second has no entry yet: once a second per
// endpoint at most.
func (e *endpoint) recordInFlight(sec uint32) {
	old := e.histSec.Load()
	if old == sec || !e.histSec.CompareAndSwap(old, sec) {
		return // another pick of this second records it
	}
	n := uint32(min(max(e.inFlight.Load(), 0), math.MaxUint32))
	e.hist[sec%inFlightHistory].Store(uint64(sec)<<32 | uint64(n))
}

// histSecond is the second recordInFlight files a time under.
func histSecond(nowNs int64) uint32 { return uint32(nowNs/int64(time.Second)) + 1 }

// inFlightAfter returns the in-flight count before the first pick after
// the second of atNs, from the history, and false when no pick has been
// recorded since (or the history does not reach back to atNs).
func (e *endpoint) inFlightAfter(atNs, nowNs int64) (int64, bool) {
	at, now := histSecond(atNs), histSecond(nowNs)
	if at >= now || now-at >= inFlightHistory {
		return 0, false
	}
	var best uint32
	var n int64
	for i := range e.hist {
		v := e.hist[i].Load()
		if s := uint32(v >> 32); s > at && s <= now && (best == 0 || s < best) {
			best, n = s, int64(uint32(v))
		}
	}
	return n, best != 0
}

// readingDelta returns how this process's in-flight count has changed since
// the server's current load reading (in slot, e's) was measured, given the
// reading's fresh fields (tel, as Slot.LoadInto cut them: Running, else
// Waiting, is the reading), the count now (inFlight) and the time (nowNs).
//
// A scrape is a second or more old, and between scrapes it does not move,
// whatever this process sends. Scored on the reading alone, the endpoint
// that looked emptiest at the last scrape would win every comparison until
// the next one and take a burst it cannot serve (at saturation the fleet
// then herds from replica to replica, scrape by scrape). The calls picked
// since (and, when negative, those ended since) are the part of its load the
// reading cannot know yet, so the scorer adds them to it.
//
// The base is the in-flight count when a pick first sees a new reading, for
// a reading measured less than lateReading before; for an older one (read
// from Prometheus, up to a scrape interval after the scrape), the count
// before the first pick after the reading's second, from the history, so
// that the calls picked between the scrape and its arrival count too (they
// were lost, and an endpoint that took many of them looked as empty as at
// the scrape). Either way the calls picked within the reading's own second
// are not counted, which errs towards the reading. Racing picks may both
// store a base; either is a count from the same moment.
//
// A queue newer than the running count (vLLM's load header carries the
// queue, not Running, and comes with each response, while Running is as
// old as the last scrape) holds some of the calls sent since the scrape
// already: queuedSince takes them out.
func (e *endpoint) readingDelta(slot *telemetry.Slot, tel *telemetry.Sample, inFlight, nowNs int64) int64 {
	at := readingTime(slot, tel.Has)
	return e.queuedSince(slot, tel, at, e.sinceBase(&e.readingAt, &e.readingBase, at, inFlight, nowNs), inFlight, nowNs)
}

// queuedSince returns the calls sent since a load reading, since (counted
// from at, Running's time), less those of them that a newer queue reading
// in tel (Waiting, observed after at) already counts.
//
// Running and Waiting of different times are added as one reading: a
// scrape's Running (up to a poll interval old, 15 s by default) and a load
// header's Waiting (from the last response). The calls this process sent
// between the two that the server queued are in that Waiting; counted
// again as sent since the scrape, a saturated server's queue counted
// twice, and a replica scraped 14 s ago looked busier than one scraped a
// moment ago by every call sent to it in between (and the affinity bound
// spilled its keys). The calls sent since the queue reading are in
// neither count, nor are those sent between the two that run; and at most
// Waiting of those can be in the queue. So the count is the calls sent
// since the queue reading, but at least the calls sent since the scrape
// less Waiting; with nothing waiting, the calls sent since the scrape.
//
// What the reading can know, as a model: a server runs up to some limit
// and queues the rest, and starts a queued call as soon as a running one
// ends (vLLM at max_num_seqs, or out of KV blocks). This process knows the
// scrape's Running R0, the header's Waiting W1, and its own in-flight
// count when a pick first saw each (readingBase, waitBase) and now: its
// net change between the two readings, D (calls sent less calls ended;
// which came first changes nothing, the server's counts at the header
// are the same either way), and since the header. It does not know the
// limit, other callers' calls, nor the scrape's Waiting W0 (the header's
// replaced it in the slot). The truth is R1 + W1 and the reading
// R0 + W1 + (R1 - R0) estimated, plus the calls since the header:
//
//   - W1 >= 1: the server is at its limit, so R1 >= R0 whatever anyone
//     sent or ended. The count takes the calls of D that the queue cannot
//     hold as run, max(0, D - W1): exact with this process's calls alone
//     (R1 - R0 = W0 + D - W1: 0 when W0 >= 1, the server full at both;
//     D - W1 >= 0 when W0 = 0), off by other callers' calls otherwise.
//     Calls of this process that ended between the two (D < 0) are not
//     taken off: the queue filled their places, and Waiting is shorter
//     by them already. Taken off as well, a server with 8 running and 10
//     waiting at the scrape, 4 of whose calls ended, read 8 + 6 - 4 = 10
//     for the 8 + 6 it held (TestCallsEndedBetweenTheReadingsCountOnce).
//   - W1 = 0: R1 - R0 = W0 + D with this process's calls alone, and the
//     count is D: exact when nothing waited at the scrape. When W0 calls
//     did, they started in the places of calls that ended, and the
//     reading is low by them (8 running and 2 waiting, 5 of this
//     process's calls ended: it reads 3 for 5). That server and one with
//     8 running and none show this process the same readings (R0, no
//     queue, D), so the gap stays: closing it takes W0, which the
//     header's Waiting replaced (a pick saw it only if one came between
//     the two), and other callers' calls that ended drain a queue too,
//     for which W0 + D would read high.
//
// Beyond the model, three errors stay. Calls of other callers that ended
// between the two on a server with room left R0 higher than R1, as calls
// that end after any scrape do: they count until the next scrape. A
// server that queues with room to run (calls waiting for a LoRA adapter,
// a step's token budget, preempted calls) can run fewer than R0 with a
// queue: there the count is high by at most this process's calls that
// ended between the two. And the bases are counts from when a pick first
// saw each reading: a call that ended after the header and before that
// pick counts as ended before it (with a queue, it may not be taken off)
// until the next header, which comes with the next response.
func (e *endpoint) queuedSince(slot *telemetry.Slot, tel *telemetry.Sample, at, since, inFlight, nowNs int64) int64 {
	if !tel.Has.Has(telemetry.Running) || !tel.Has.Has(telemetry.Waiting) {
		return since // at is Running's time only with both (readingTime)
	}
	waitAt := slot.Observed(telemetry.Waiting)
	if waitAt <= at {
		return since // one reading, or the queue is the older
	}
	sinceQueue := e.sinceBase(&e.waitAt, &e.waitBase, waitAt, inFlight, nowNs)
	w := tel.Values[telemetry.Waiting]
	if !(w >= 1) {
		return since // nothing waits (a NaN neither)
	}
	// since - sinceQueue is D; the calls the queue can hold are Waiting, whole.
	return max(sinceQueue, since-int64(min(w, telemetry.MaxRequests)))
}

// readingTime is the time (unix ns) of the load reading readingDelta
// counts from: a Running gone stale (its source stopped) while a Waiting
// stays fresh (a load header carries the queue only) is still in the slot,
// and measured from its time the calls sent since a fresh queue were those
// since the old scrape.
func readingTime(slot *telemetry.Slot, fresh telemetry.FieldSet) int64 {
	at := int64(0)
	if fresh.Has(telemetry.Running) {
		at = slot.Observed(telemetry.Running)
	}
	if at == 0 {
		at = slot.Observed(telemetry.Waiting)
	}
	return at
}

// kvDelta is readingDelta for the slot's KV-cache usage, from its own time:
// a load header (vLLM's carries the KV usage and the queue, not Running)
// is measured after every response, while Running is as old as the last
// scrape, and the calls sent between the two are in the header's usage
// already. Counted from the scrape, they moved a header's 90% with 10
// running to a full cache. at is the usage's time, loadAt the load
// reading's (0 without one) and sinceReading readingDelta's result, which
// holds when the usage came with the load reading: less the calls a newer
// queue holds (queuedSince), which hold no KV blocks either (vLLM
// allocates a request's blocks when it schedules it).
func (e *endpoint) kvDelta(at, loadAt, sinceReading, inFlight, nowNs int64) int64 {
	if at == loadAt {
		return sinceReading
	}
	return e.sinceBase(&e.kvAt, &e.kvBase, at, inFlight, nowNs)
}

// sinceBase returns how the in-flight count has changed since the reading
// measured at atNs, whose time and base the pair (readAt, base) keeps: a
// new time takes a new base (see readingDelta).
func (e *endpoint) sinceBase(readAt, base *atomic.Int64, atNs, inFlight, nowNs int64) int64 {
	if readAt.Load() != atNs {
		b := inFlight
		if nowNs-atNs > int64(lateReading) {
			if n, ok := e.inFlightAfter(atNs, nowNs); ok {
				b = n
			}
		}
		base.Store(b)
		readAt.Store(atNs)
		return inFlight - b
	}
	return inFlight - base.Load()
}

// pending returns how long a call still out to e has been out: the time
// since the later of the last Done that was not a cancellation (an answer
// or a failure) and the pick that started the current busy period (took
// inFlight from 0 to 1). Calls out when that Done left some are still out,
// none having been answered since, and so is the call that started a busy
// period after it, unless its caller gave up on it: a cancelled call does
// not restart the wait (an endpoint whose hung calls are abandoned one by
// one would look fresh at each), so when the call that started the period
// was the one abandoned, the wait may count from before the oldest call
// still out, by at most the time between them. 0 with nothing in flight. A pick that starts a busy
// period raises the count before it stores busySince, so a reading in
// between measures from the last Done, just before it. A clock stepped
// back reads 0.
func (e *endpoint) pending(inFlight, nowNs int64) time.Duration {
	if inFlight <= 0 {
		return 0
	}
	since := max(e.busySince.Load(), e.lastDone.Load())
	if since == 0 || nowNs <= since {
		return 0
	}
	return time.Duration(nowNs - since)
}

// stepTolerance is how far a time an endpoint stamped may be ahead of a
// clock reading before it counts as a clock stepped back rather than a
// race between goroutines' readings: a decay measured from a time further
// ahead starts again from the reading (elapsed time zero), or it would
// stop for the length of the step.
const stepTolerance = time.Second

// errorRateFloor is the error rate below which an endpoint counts as clean.
const errorRateFloor = 0.01

func (e *endpoint) errorRate(c *config, nowNs int64) float64 {
	r := e.rawErrorRate(c, nowNs)
	if r < errorRateFloor {
		// A residue of an old failure is noise; left in, it would make an
		// otherwise idle endpoint lose every tie for ever.
		return 0
	}
	return r
}

// rawErrorRate is the decayed error rate without errorRate's floor.
func (e *endpoint) rawErrorRate(c *config, nowNs int64) float64 {
	return decayedRate(&e.errRate, &e.errAt, c.errorDecay, nowNs)
}

// decayedRate is the rate in v (float64 bits), last moved at *at, faded
// towards 0 over decayBy to nowNs: the error rate and the client-error
// share. A clock stepped back past *at makes the rate decay from now on:
// left at a time ahead, it held for the length of the step, and an
// endpoint avoided for its rate (so no new outcome moves the mark) stayed
// avoided as long.
func decayedRate(v *atomic.Uint64, at *atomic.Int64, decayBy time.Duration, nowNs int64) float64 {
	r := math.Float64frombits(v.Load())
	if r == 0 {
		return 0
	}
	t := at.Load()
	dt := nowNs - t
	if -dt > int64(stepTolerance) {
		at.CompareAndSwap(t, nowNs)
	}
	if dt > 0 && decayBy > 0 {
		r *= decay.Weight(float64(dt) / float64(decayBy))
	}
	return r
}

// maxObserved bounds a reported latency or time to first token: anything
// longer (13 days) is a bad report, and near the largest Duration the
// EWMAs' float arithmetic wrapped negative, so the endpoint read as the
// fastest there is.
const maxObserved = time.Duration(1) << 50

// observe folds one finished call into the EWMAs. counted is false for an
// outcome that says nothing about health (overload, cancellation).
// outTokens is the call's output token count (0 when unknown). dialed
// says the latency may include a new connection's setup
// (inferlb.Outcome.Dialed).
func (e *endpoint) observe(c *config, nowNs int64, svc inferlb.Service, latency, ttft time.Duration, outTokens int, counted, failed, dialed bool) {
	latency, ttft = min(latency, maxObserved), min(ttft, maxObserved)
	if counted && (failed || e.errRate.Load() != 0) {
		// A success on a clean endpoint leaves the rate at 0: no writes.
		e.mu.Lock()
		x := 0.0
		if failed {
			x = 1
		}
		// From the raw rate: read through the floor, failures that each
		// add less than it (a small ErrorAlpha) would never add up.
		r := e.rawErrorRate(c, nowNs)
		r += c.errorAlpha * (x - r)
		if r < errorRateFloor && !failed {
			r = 0 // errorRate reads it as 0 anyway; keep the fast path
		}
		e.errRate.Store(math.Float64bits(r))
		e.errAt.Store(nowNs)
		e.mu.Unlock()
	}
	// Only successes feed latency: a fast failure (refused connection, a 500
	// in a millisecond) must not make a broken endpoint look fast.
	// Each service has its own: on an endpoint that serves chats and
	// embeddings alike (Ollama, a gateway), a chat's seconds would price
	// its next embedding, as if it took as long.
	if counted && !failed && latency > 0 {
		lat := &e.lat[svcIndex(svc)]
		sample := latency
		if latencyScored(svc) {
			switch {
			case lat.ewma.Load() == 0:
				// The endpoint's first answer paid for its connection
				// (TCP, TLS), which the calls after it do not: held
				// aside as a dialed one (see pairDialed), the EWMA
				// starts at the smaller of the first two. As the
				// EWMA's first peak, one slow handshake priced an
				// endpoint at that latency, and as sequential calls
				// never put one in flight elsewhere, it lost every
				// comparison until its EWMA had decayed below its
				// peers': 58 ms of handshake before a 2 ms embedding
				// kept an endpoint of three out of rotation for 32 s,
				// whatever the rate (TestSlowFirstSampleDoesNotShunEndpoint).
				// A slow endpoint pays one more slow call for it.
				if sample = e.pairDialed(svc, latency, true); sample == 0 {
					lat.at.Store(nowNs) // its time, for observeUnanswered
				}
			case dialed || e.latDialed[svcIndex(svc)].Load() != 0:
				sample = e.pairDialed(svc, latency, dialed) // 0: held aside
			}
		}
		if sample > 0 {
			at := lat.at.Load()
			w := decay.Weight(float64(nowNs-at) / float64(c.latencyDecay))
			update(&lat.ewma, func(cur int64) int64 {
				if cur == 0 || int64(sample) > cur {
					return int64(sample) // peak: jump up at once
				}
				return int64(float64(cur)*w + float64(sample)*(1-w))
			})
			lat.at.Store(nowNs)
		}
	}
	if counted && !failed && ttft > 0 && outTokens >= minTPOTTokens && latency > ttft {
		// Time per output token after the first: the endpoint's decode
		// speed, which its completion latency hides behind output length.
		x := int64(latency-ttft) / int64(outTokens-1)
		update(&e.tpotEWMA, func(cur int64) int64 {
			if cur == 0 {
				return x
			}
			return cur + int64(c.errorAlpha*float64(x-cur))
		})
	}
	if ttft > 0 && !failed {
		update(&e.ttftEWMA, func(cur int64) int64 {
			if cur == 0 {
				return int64(ttft)
			}
			return cur + int64(c.errorAlpha*float64(int64(ttft)-cur))
		})
	}
}

// waitBounds reports whether a call of svc that its caller abandoned
// with no answer (Outcome.Unanswered) bounds the endpoint's latency from
// below: for embeddings and rerankers, short and uniform calls priced by
// their latency, a wait with nothing back says the endpoint is at least
// that slow now. A generation call's wait says nothing of the kind (a
// non-streamed one sends nothing until it is done, and users stop long
// ones), nor does an unclassified call's, which may be one.
func waitBounds(svc inferlb.Service) bool {
	return svc == inferlb.ServiceEmbedding || svc == inferlb.ServiceRerank
}

// observeUnanswered folds the wait of a call of svc that its caller
// abandoned with nothing back from e into svc's latency as a censored
// sample: the endpoint takes at least wait. It only raises what the scorer
// sees, never lowers it. A wait longer than the peak-EWMA becomes the
// EWMA, as a sample above it would; a wait within the EWMA but above what
// is left of it after its decay since the last sample (scoring.State.
// Latency) moves the sample's time forward until the decayed value is the
// wait, the EWMA itself unchanged. Without a latency yet it does nothing:
// the scorer prices such an endpoint at its prior, which a shorter wait
// would lower, and the prior is the scorer's setting, unknown here. With
// the first answer's latency held aside (see observe), that answer starts
// the EWMA, as it did before it was held aside, and the wait bounds it as
// above, also when it is shorter than that answer: left at none, the
// endpoint was priced as an idle probe, and a replica that answered once
// slowly (a cold start) and then hung, its callers giving up sooner than
// that answer took, drew 194 of 200 calls sent one at a time
// (TestHungAfterOneSlowAnswerStopsDrawingCalls).
// Without it a hung endpoint whose callers give up
// on its calls kept the latency of its last answer while every call out
// was abandoned, and drew calls at that price (see
// TestStuckEndpointStopsDrawingCallsItsCallersCancel).
func (e *endpoint) observeUnanswered(c *config, nowNs int64, svc inferlb.Service, wait time.Duration) {
	wait = min(wait, maxObserved)
	if !waitBounds(svc) || wait <= 0 {
		return
	}
	lat := &e.lat[svcIndex(svc)]
	for {
		cur, at := lat.ewma.Load(), lat.at.Load()
		switch {
		case cur <= 0:
			held := &e.latDialed[svcIndex(svc)]
			first := held.Load()
			if first == 0 {
				return // no answer yet: the scorer's prior
			}
			// The answer held aside starts the EWMA, as of its time
			// (observe stored it), and the wait bounds it below.
			if held.CompareAndSwap(first, 0) {
				lat.ewma.CompareAndSwap(0, first)
			}
			continue
		case int64(wait) > cur:
			if lat.ewma.CompareAndSwap(cur, int64(wait)) {
				lat.at.Store(nowNs)
				return
			}
			continue
		case c.latencyDecay <= 0 || nowNs <= at:
			return // not decayed: the EWMA is what the scorer sees
		}
		if float64(wait) <= float64(cur)*decay.Weight(float64(nowNs-at)/float64(c.latencyDecay)) {
			return
		}
		// decay.Weight(x) is (1 - x/32)^32: the age x at which it is
		// wait/cur.
		x := 32 * (1 - math.Pow(float64(wait)/float64(cur), 1.0/32))
		from := nowNs - int64(x*float64(c.latencyDecay))
		if from <= at || lat.at.CompareAndSwap(at, from) {
			return
		}
	}
}

// noteAbandoned counts a generation call its caller gave up on with
// nothing back from e (Outcome.Unanswered) after wait, picked at
// pickedNs, when the wait was at least the peak-EWMA of e's generation
// answers (as of its last sample) and e answered no generation call from
// then on (answeredSince: the call overdue, nothing came back from e
// at all): the count since e last answered or failed a call is
// scoring.State.Abandoned, which the LLM scorer prices. A vLLM replica
// whose engine hangs (an NCCL deadlock, a stuck kernel) while its API
// server stays up answers nothing and keeps reading fresh, frozen
// gauges; its callers giving up (context.Canceled) fed no signal, and it
// kept drawing about half its share of calls, each to hang until its
// caller gave up (TestHungLLMReplicaStopsDrawingCalls). A wait shorter
// than e's answers take says nothing (a user's early stop), and a user
// stopping a stream after its tokens began is not Unanswered.
//
// Nor does a wait past that time while e answers other calls: e works,
// and the stopped call was a long one. A busy fleet serving generations
// of 30 s to 5 minutes, whose users stop a third of them at 20-95% of
// their length, has many longer than a replica's recent answers: two
// such stops in a row with no answer between made a run, and its
// healthy replicas were silent at 82 of the picks from the run's tenth
// minute to its sixtieth (53 with 1,000 session keys), one drawing 880
// calls in the hour where it drew 920 with the stops not marked
// unanswered; they are silent at none now, and draw the same
// (TestBusyFleetsLateStopsOfLongGenerationsKeepTheirShare). A
// hung engine answers nothing from its hang, so every call overdue after
// it counts: the hung-LLM tests' figures are what they were. From the
// call's pick instead, a call out at the hang counted only if nothing
// was answered since its pick, and a hung replica drew 25 and 21 calls
// in 60 s where it draws 17 and 6. A stream's first token is an answer
// (firstTokenAt): a hung engine sends none, its API server the headers.
// A replica with one call at a time answers none while a call is out,
// and its users' stops of long calls still make a run; it prices the
// replica only while a call is out, which its next answer ends.
//
// Before e has answered a generation call its own answers say nothing
// of how long they take (a fresh replica's first calls may all be long
// generations), and its peers' answers do: the wait counts when it is
// at least the longest of their generation peak-EWMAs (peerAnswerTime),
// and such a replica has answered nothing since. Waiting for e's own
// first answer, a replica hung from the start never counted one and
// drew 64 of 480 calls (0.53 of its share) in the run's second minute;
// it draws 4 now (TestHungLLMReplicaHungFromTheStart).
//
// It reports whether e's run is scoring.MinAbandoned or more with this
// call (see unanswering).
func (e *endpoint) noteAbandoned(svc inferlb.Service, pickedNs, nowNs int64, wait time.Duration) bool {
	if svc != inferlb.ServiceLLM || wait <= 0 {
		return false
	}
	took := e.lat[svcIndex(svc)].ewma.Load()
	if took <= 0 {
		took = e.peerAnswerTime(svc)
	}
	if took <= 0 || int64(wait) < took || e.answeredSince(svc, pickedNs+took, nowNs) {
		return false
	}
	return e.abandoned.Add(1) >= scoring.MinAbandoned
}

// answeredSince reports whether e answered a call of svc after ns, as of
// nowNs: a success, whose time is its latency sample's (latencyMark.at,
// which nothing else moves for a generation: observeUnanswered leaves
// them alone), or, for a generation, the first token of a stream its
// caller stopped after it (firstTokenAt). A time further ahead of nowNs
// than stepTolerance was stamped before the clock stepped back and is no
// answer: taken as one, it cleared every call abandoned until the clock
// caught up.
func (e *endpoint) answeredSince(svc inferlb.Service, ns, nowNs int64) bool {
	ahead := nowNs + int64(stepTolerance)
	if at := e.lat[svcIndex(svc)].at.Load(); at > ns && at <= ahead {
		return true
	}
	at := e.firstTokenAt.Load()
	return svc == inferlb.ServiceLLM && at > ns && at <= ahead
}

// noteFirstToken records, at nowNs, that a generation call of e picked at
// pickedNs had its first token ttft later, and its caller stopped it
// after that: e answered then (see answeredSince). The latest such time
// is kept, unless it is further ahead of nowNs than stepTolerance (the
// clock stepped back since it was stamped).
func (e *endpoint) noteFirstToken(svc inferlb.Service, pickedNs, nowNs int64, ttft time.Duration) {
	if svc != inferlb.ServiceLLM || ttft <= 0 || ttft > maxObserved {
		return
	}
	at := pickedNs + int64(ttft)
	for {
		cur := e.firstTokenAt.Load()
		if cur >= at && cur-nowNs <= int64(stepTolerance) || e.firstTokenAt.CompareAndSwap(cur, at) {
			return
		}
	}
}

// minAnswerPeers is how many of an endpoint's peers in one pool must have
// answered calls of a service for their answers to stand for its own
// (see peerAnswerTime): one peer's few answers may all have been short.
const minAnswerPeers = 2

// peerAnswerTime is how long e's peers' answers of svc take, for an
// endpoint that has answered none (noteAbandoned): the longest
// peak-EWMA of svc (as of its last sample) among the other members of
// e's pools (the endpoints serving its models, in each Membership
// listing it: a small model's quick answers say nothing of a large
// one's; all of them, whatever the call's model, as the longest is the
// safer), or 0 when no pool has minAnswerPeers peers with one.
//
// The longest, not the median: a healthy replica's early stops count
// only when they outwait every peer's recent peak, not half of them. The
// two found the hang alike in TestHungLLMReplicaHungFromTheStart (4
// calls in its second minute either way), and neither counted a healthy
// joiner's early stops in the fleets tried. As of each peer's last
// sample, not decayed to now as the scorer sees it: a minute after a
// peer's last answer its minutes-long EWMA reads as a fraction of a
// second (LatencyDecay 10 s), and a joiner whose users stopped its first
// 2-5 minute generations after 30-120 s was taken for a hung one
// (TestFreshReplicaJoiningLongGenerationsKeepsItsShare). A peer's stale
// EWMA (it answered long ago) only makes the measure the longer. It
// reads every member of e's pools, on the Done of a call abandoned
// unanswered, never on a pick.
func (e *endpoint) peerAnswerTime(svc inferlb.Service) int64 {
	pools := e.pools.Load()
	if pools == nil {
		return 0 // no membership lists it any more
	}
	i := svcIndex(svc)
	longest, enough := int64(0), false
	for _, g := range *pools {
		n := 0
		for _, m := range g.members {
			if m == e {
				continue
			}
			if took := m.lat[i].ewma.Load(); took > 0 {
				n++
				longest = max(longest, took)
			}
		}
		enough = enough || n >= minAnswerPeers
	}
	if !enough {
		return 0
	}
	return longest
}

// silent reports whether e's callers gave up on a run of its generation
// calls with nothing back (noteAbandoned: scoring.MinAbandoned or more,
// each waiting as long as its answers take and none answered from then
// on, no answer since) while calls are out to it. The LLM scorer prices such
// an endpoint up; affinity passes it over as a key's owner or spill, or
// its keys' calls (most of a chat fleet's) kept going to it: with 1,000
// session keys a hung replica drew 80 and 110 of 477 calls in 60 s
// without and with frozen telemetry, most of its share. With nothing
// out it is not, so a replica that recovered takes its keys' next call,
// whose answer ends the run.
func (e *endpoint) silent() bool {
	return e.unanswering() && e.inFlight.Load() > 0
}

// unanswering reports whether e is in a run of scoring.MinAbandoned or
// more generation calls abandoned with nothing back: silent whenever a
// call is out to it. The affinity bound leaves such a member out of the
// load its peers share (see fleetView.silent).
func (e *endpoint) unanswering() bool {
	return e.abandoned.Load() >= scoring.MinAbandoned
}

// latencyMark is the peak-EWMA of one service's successful calls on an
// endpoint, raised by the waits of its calls abandoned with no answer
// (observeUnanswered).
type latencyMark struct {
	ewma atomic.Int64 // ns
	at   atomic.Int64 // unix ns of the last sample
}

// latencyScored reports whether calls of svc are priced by their latency
// (scoring.Latency, the default for embeddings and rerankers), where one
// sample decides which endpoint the next calls go to.
func latencyScored(svc inferlb.Service) bool {
	return svc == inferlb.ServiceEmbedding || svc == inferlb.ServiceRerank
}

// pairDialed takes a sample of a latency-scored service when the sample
// may include a new connection's setup (dialed: the endpoint's first
// answer too, see observe) or such a sample is held aside: it holds a dialed sample aside and returns 0 (none
// to fold in) when none is held, and otherwise returns the smaller of the
// held one and this one, which is folded in, and lets the held one go.
//
// An endpoint that drew no call for longer than the caller's idle timeout
// (4 s for httpbalancer's default Base, below the servers' keep-alive
// timeout) lost its connection, and its next call, the probe that its
// EWMA's decay below its peers' brings, paid for a new one (TCP, TLS).
// Folded in, that sample was a new peak, and it took the endpoint out of
// rotation again for about LatencyDecay x ln(sample / peers' latency),
// long enough to lose its connection again: 20 ms embeddings, one a
// second, with a 30 ms handshake on one endpoint of three, one 40 ms call
// on it, and it drew 11 calls in two minutes against 55 and 54 for its
// peers, each of the 11 over a new connection (httpbalancer's
// TestReconnectingEndpointKeepsItsShare; 37 against 42 and 41 now). Held
// aside, the probe leaves the decayed EWMA as it is, and the endpoint's
// next call, on the new connection, is what counts. The smaller of two of
// the endpoint's calls' latencies is never below what its calls take, and
// an endpoint whose every call dials (a server that closes each
// connection) still counts every second call, with its handshake, as its
// callers pay it.
// A held sample is not aged: one the endpoint's next call comes long
// after may hide that call's slowness once, as the first answer's may;
// the endpoint's calls after it count in full.
func (e *endpoint) pairDialed(svc inferlb.Service, latency time.Duration, dialed bool) time.Duration {
	held := &e.latDialed[svcIndex(svc)]
	for {
		h := held.Load()
		switch {
		case h != 0:
			if held.CompareAndSwap(h, 0) {
				return min(latency, time.Duration(h))
			}
		case !dialed:
			return latency
		case held.CompareAndSwap(0, int64(latency)):
			return 0
		}
	}
}

// svcIndex is svc's entry in per-service tables: ServiceUnknown's for a
// value past the known ones (scorer sends such a call to its scorer too).
func svcIndex(svc inferlb.Service) int {
	if int(svc) < inferlb.NumServices {
		return int(svc)
	}
	return int(inferlb.ServiceUnknown)
}

// update applies f to v atomically by compare-and-swap, retrying when
// another outcome got there first.
func update(v *atomic.Int64, f func(int64) int64) {
	for {
		cur := v.Load()
		if v.CompareAndSwap(cur, f(cur)) {
			return
		}
	}
}

// heldOut reports whether e is out of rotation by its breaker (open or
// probing) or an outlier ejection at nowNs: out for failing, not merely
// cooling down after overload answers.
func (e *endpoint) heldOut(nowNs int64) bool {
	return e.brOpen.Load() || e.ejectedUntil.Load() > nowNs
}
