package balancer

import (
	"errors"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/inferlb/inferlb/telemetry"
)

// EventKind says what happened to an endpoint's standing.
type EventKind uint8

const (
	// EventTripped: the circuit breaker opened after consecutive failures
	// and the endpoint left rotation. Event.Detection is the time from the
	// first failure of the streak to the exclusion.
	EventTripped EventKind = iota + 1
	// EventProbeFailed: a half-open probe failed; the endpoint stays out for
	// a longer (doubled) period.
	EventProbeFailed
	// EventRecovered: half-open probes succeeded; the endpoint is back and
	// ramps up through slow start. Event.Downtime is exclusion to recovery.
	EventRecovered
	// EventEjected: outlier detection removed the endpoint because its
	// success rate fell well below the median of a pool it is in (see
	// Options.OutlierMargin).
	EventEjected
	// EventCooldown: the endpoint answered "overloaded" and rests for its
	// Retry-After.
	EventCooldown
	// EventCapped: the breaker tripped or outlier detection fired, but
	// MaxEjectedFraction was reached, so the endpoint stays in rotation.
	// It marks the change: once when the breaker, or outlier detection,
	// is first capped, not for each failure that opens the capped breaker
	// again or each evaluation that finds the endpoint an outlier still.
	// The breaker is capped anew after it has closed (its probes passed)
	// or tripped, outlier detection after an evaluation found the
	// endpoint no outlier or ejected it.
	EventCapped
	// EventNotServed: the endpoint answered that it does not serve
	// Event.Model (Outcome.NotServedModel), which it was not remembered
	// for: that model's picks pass it over until Until (NotServedMemory).
	EventNotServed
	// EventModelFailing: Event.Model failed BreakerFailures times in a
	// row on the endpoint while it served other calls, so the failures are
	// held against the model there (Outcome.Model): that model's picks
	// pass the endpoint over until Until; every other model's go on.
	EventModelFailing
	// EventTenantRefused: the endpoint refused a run of Event.Tenant's
	// calls (client errors that name their tenant, Outcome.Tenant) too
	// long to be the tenant's own bad calls (a replica its API key has not
	// reached): that tenant's picks pass the endpoint over until Until
	// (ErrorDecay), or until it serves one of the tenant's calls, unless
	// that would hold out more than MaxEjectedFraction of its pool or
	// leave no candidate; every other tenant's go on. One comes per
	// endpoint and tenant each time a pass-over begins: while the endpoint
	// goes on refusing the tenant, its refused probes start one per
	// ErrorDecay and caller. EndpointStats.RefusedTenants counts the
	// tenants passed over now.
	EventTenantRefused
)

var eventNames = [...]string{"", "tripped", "probe-failed", "recovered", "ejected", "cooldown", "capped", "not-served", "model-failing", "tenant-refused"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event reports a change in an endpoint's standing, through Options.OnEvent.
type Event struct {
	Kind     EventKind
	Endpoint string
	At       time.Time
	// Until is when the endpoint may be tried again (tripped, probe-failed,
	// ejected, cooldown), or tried again for Model's calls (not-served,
	// model-failing) or for Tenant's (tenant-refused). Zero for the other
	// kinds.
	Until time.Time
	// Detection is the first failure of the streak to exclusion (tripped).
	Detection time.Duration
	// Downtime is exclusion to recovery (recovered).
	Downtime time.Duration
	// Model is the model the endpoint does not serve (not-served), or
	// that fails there (model-failing). It is request data, as a caller
	// sent it: quote it (%q) when logging it. One not-served event comes
	// per endpoint and model newly remembered, so a client cycling
	// through made-up names makes one per 404.
	Model string
	// Tenant is the tenant whose calls the endpoint refuses
	// (tenant-refused): request data as well, to quote (%q) when logged.
	Tenant string
}

// endpoint.capped bits: the mechanism MaxEjectedFraction holds off.
const (
	cappedBreaker = 1 << iota
	cappedOutlier
)

// Sentinels the breaker classifies; they never reach callers.
var (
	errFailed   = errors.New("inferlb: call failed")
	errExcluded = errors.New("inferlb: outcome says nothing about health")
)

// newBreaker returns e's breaker, or nil when breaking is disabled.
//
// gobreaker counts outcomes and decides when to trip, probe and close; the
// balancer's clock decides how long the endpoint stays out. Outcomes are
// reported at Done (Pick never locks; the half-open probe budget is kept in
// an atomic, probeSlots). gobreaker reads the wall clock, so its own open timeout is set to a
// nanosecond (always elapsed) and the exclusion window is kept in
// excludedUntil instead, which keeps fake clocks and the simulator exact.
func (b *Balancer) newBreaker(e *endpoint) *gobreaker.CircuitBreaker[struct{}] {
	if b.cfg.breakerFailures <= 0 {
		return nil
	}
	return gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        e.id,
		MaxRequests: uint32(b.cfg.breakerProbes),
		Timeout:     time.Nanosecond,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(b.cfg.breakerFailures)
		},
		IsExcluded: func(err error) bool { return err == errExcluded },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			b.onBreakerChange(e, from, to)
		},
	})
}

// onBreakerChange runs under the breaker's mutex: atomics, ejectMu, e.mu
// (forgiveErrors) and the telemetry slot's merge lock (forgetLoad) only.
func (b *Balancer) onBreakerChange(e *endpoint, from, to gobreaker.State) {
	e.brState.Store(int32(to))
	now := b.cfg.clock.Now()
	nowNs := now.UnixNano()
	switch to {
	case gobreaker.StateOpen:
		// A trip, not a failed probe: it needs room under MaxEjectedFraction,
		// checked and taken (brOpen) in one step under ejectMu.
		trip := !e.brOpen.Load()
		if trip {
			b.ejectMu.Lock()
			if !b.mayEject(e, nowNs) {
				b.ejectMu.Unlock()
				// gobreaker stays open, and every failure from now on
				// opens it again: one event for all of them.
				if e.capped.Or(cappedBreaker)&cappedBreaker == 0 {
					b.emit(e, Event{Kind: EventCapped, Endpoint: e.id, At: now})
				}
				b.armCappedProbes(e, nowNs)
				return
			}
			e.capped.And(^uint32(cappedBreaker))
			e.capProbeAt.Store(0)
		}
		n := b.tripCount(e, nowNs)
		hold := b.ejectionTime(n)
		until := later(nowNs, hold)
		exclude(&e.excludedUntil, until) // before the new generation: see acquire
		// The endpoint returns when its exclusion ends: an overload
		// cooldown in force may outlast the breaker's.
		until = max(until, e.excludedUntil.Load())
		e.probeDue.Store(0)
		e.probeLife.Store(int64(hold))
		e.probeSlots.Store(int32(b.cfg.breakerProbes))
		e.brGen.Add(1)
		ev := Event{Kind: EventTripped, Endpoint: e.id, At: now, Until: time.Unix(0, until)}
		if !trip {
			ev.Kind = EventProbeFailed
		} else {
			e.brOpen.Store(true)
			b.ejectMu.Unlock()
			b.forgetLoad(e, now)
			e.trips.Add(1)
			e.trippedAt.Store(nowNs)
			if s := e.failStreak.Load(); s != 0 { // 0: none (a reading before 1970 is below it)
				// Differences of clock readings: never negative, also
				// across a clock stepped back between them.
				ev.Detection = time.Duration(max(nowNs-s, 0))
				e.lastDetection.Store(int64(ev.Detection))
			}
		}
		b.epoch.Add(1)
		b.emit(e, ev)
	case gobreaker.StateClosed:
		e.capped.And(^uint32(cappedBreaker)) // the capped breaker's probes passed
		if at := e.capProbeAt.Swap(0); e.brOpen.Load() || at != 0 && at <= nowNs {
			// Probes passed: a tripped breaker's, or a capped one's once
			// due. A capped breaker in rotation also closes on its next
			// ordinary calls (gobreaker's open timeout is a nanosecond):
			// three successes right after the failures that capped it
			// are no verdict, and forgiven, an endpoint failing in
			// bursts had its rate wiped after each.
			e.forgiveErrors(nowNs)
		}
		if !e.brOpen.Swap(false) {
			return
		}
		e.recoveredAt.Store(nowNs) // opens decays from here: see tripCount
		e.brGen.Add(1)
		// Recovered: ramp up, as a new endpoint would, from when it is
		// eligible for traffic again. Probes that pass while it is held
		// out otherwise (an outlier ejection that fell while they were
		// out) must not start the ramp now: it ran out while the endpoint
		// was still out, which then came back at full weight. A ramp set
		// to start later (the ejection's, at its end) stays, as it does
		// for a reconnect (setReady); by compare-and-swap, as an ejection
		// may set it meanwhile.
		start := nonZero(max(nowNs, e.excludedUntil.Load()))
		for {
			from := e.rampFrom.Load()
			if from != 0 && from >= start || e.rampFrom.CompareAndSwap(from, start) {
				break
			}
		}
		down := time.Duration(max(nowNs-e.trippedAt.Load(), 0))
		e.lastDowntime.Store(int64(down))
		e.recoveries.Add(1)
		b.epoch.Add(1)
		b.emit(e, Event{Kind: EventRecovered, Endpoint: e.id, At: now, Downtime: down})
	}
}

// armCappedProbes readies probes for e, whose breaker opened but stays in
// rotation because MaxEjectedFraction is reached (capped), from
// EjectionTime after this failure on: each failure opens the capped
// breaker again and puts them off again. Probes win their comparisons
// (see prefer), as a tripped breaker's do, and BreakerProbes successes in
// a row close the breaker.
//
// Without them a capped endpoint had no way back but time. In rotation
// while its peers were out, it took the pool's calls and failed them all
// with the pool; its error rate neared 1 (a cost a thousand times its
// peers'), and once the pool recovered it lost every comparison, so no
// call came to answer: in a test it got none of 9,000 calls in the 90s
// after the pool recovered, while its tripped peers, probed, took calls
// from the first seconds. Probed, it closes its breaker within
// EjectionTime of its last failure, and the close forgives the outage's
// error rate (see forgiveErrors). A capped endpoint that still fails (its
// pool's failure was partial) gets a probe or so per EjectionTime, as a
// tripped one gets one per exclusion.
func (b *Balancer) armCappedProbes(e *endpoint, nowNs int64) {
	hold := b.cfg.ejectionTime
	e.probeDue.Store(0)
	e.probeLife.Store(int64(hold))
	e.probeSlots.Store(int32(b.cfg.breakerProbes))
	e.capProbeAt.Store(nonZero(later(nowNs, hold))) // last: the slots are set when it is read
}

// cappedProbing reports whether a pick of e at nowNs would be a probe of
// its capped breaker (see armCappedProbes): its probes are due, it is not
// cooling down, and a slot is free, or those out are overdue. A healthy
// endpoint's breaker is closed: one load.
//
// Not while it cools down (an overload answer's Retry-After), as a
// tripped breaker is probed only once its exclusion ends: panic routing,
// and a tenant's shard that is all cooling down, offer such an endpoint
// as a candidate, and a pick of it is no probe (acquire finds it out of
// standing), so no slot ran out: probing, it won every comparison it was
// in, and drew half the calls of a pool of four while it said it was busy.
func cappedProbing(e *endpoint, nowNs int64) bool {
	if e.brState.Load() == int32(gobreaker.StateClosed) || e.brOpen.Load() {
		return false
	}
	at := e.capProbeAt.Load()
	return at != 0 && at <= nowNs && e.excludedUntil.Load() <= nowNs &&
		(e.probeSlots.Load() > 0 || probesOverdue(e, nowNs))
}

// forgiveErrors starts e's error rate over as its breaker closes after
// its probes: BreakerProbes calls in a row succeeded, which is the
// verdict the breaker waits for (a capped breaker's only once its probes
// were due: see onBreakerChange). Left, the rate the outage built priced the endpoint
// out of every comparison with a peer that had none (at 0.2, three times
// as dear; at 0.99, a thousand times) until it faded with ErrorDecay,
// slow start and all: an idle fleet sent it nothing for a minute or more,
// and no call came to pull it down.
func (e *endpoint) forgiveErrors(nowNs int64) {
	e.mu.Lock()
	e.errRate.Store(0)
	e.errAt.Store(nowNs)
	e.mu.Unlock()
}

// forgetLoad expires e's load readings (telemetry.ProcessLoad) observed before now,
// as a failure exclusion of e begins: a breaker's trip (not a failed
// probe, which extends the same exclusion) or an outlier ejection. Not an
// overload cooldown: the server said it is busy, and its reading says how
// busy.
//
// A replica that fails its calls has often crashed, and what comes back is
// a new, idle process. Kept, the old process's last report (a full KV
// cache, 30 waiting) priced it as full when it returned: it lost every
// comparison, so no call went there to bring a fresh report (a load header
// or ORCA trailer comes with a response), and it sat idle until the
// reading aged out (TelemetryMaxAge) while its peers queued. Without the
// reading its factors are neutral and slow start paces its return.
// Readings observed from now on (a Poller scraping the new process, the
// answer to a half-open probe) are kept: the end of the exclusion is when
// it would matter, and the readings taken since describe the process that
// returns. Exclusions are rare, so this costs a pick nothing.
//
// Not for an endpoint that has left the Balancer: the readings are the
// ID's, and the ID added back is a new endpoint, reporting for a new
// process; the old endpoint's calls still in flight must not expire them.
func (b *Balancer) forgetLoad(e *endpoint, now time.Time) {
	if e.gone.Load() {
		return
	}
	b.cfg.store.Expire(e.id, telemetry.ProcessLoad, now)
}

// afterStepBack mends e's deadlines after the clock stepped back: an
// exclusion, outlier ejection, probation or ramp start further than horizon ahead of
// now was set before the step, and would otherwise hold for the length of
// the step on top of its own (a one-second cooldown for an hour, after an
// hour's NTP step). How much of it was left is unknown: the exclusion ends
// now (a breaker then probes, and a failed probe excludes again; probes
// out are overdue) and the ramp starts again.
//
// A ramp's start, a probe deadline and a recovery of 0 are none, not a
// time: on a clock that reads before 1970 (a fake one from the zero Time)
// 0 is far ahead of every reading, and taken for a time set before a step,
// every endpoint began a ramp (the initial set too) at its first pick.
// (No exclusion or ejection is 0: "none" is math.MinInt64, see newEndpoint.)
func (e *endpoint) afterStepBack(nowNs, horizon int64) {
	for _, v := range [...]*atomic.Int64{&e.excludedUntil, &e.ejectedUntil, &e.rampFrom, &e.probeDue, &e.capProbeAt, &e.shedBack, &e.probationUntil} {
		if t := v.Load(); t != 0 && t > nowNs && t-nowNs > horizon {
			v.CompareAndSwap(t, nowNs)
		}
	}
	// The last recovery, a time past, is ahead too: good standing counts
	// from now (see tripCount), not from when the clock catches up with it.
	if r := e.recoveredAt.Load(); r != 0 && r > nowNs {
		e.recoveredAt.CompareAndSwap(r, nowNs)
	}
}

// setBeforeStep reports whether a deadline of e that afterStepBack mends
// (an exclusion, and so an ejection within it, a ramp's start, a probe
// deadline) is further than horizon ahead of nowNs: none is ever set that
// far ahead, so it was set before the clock stepped back.
func (e *endpoint) setBeforeStep(nowNs, horizon int64) bool {
	for _, v := range [...]*atomic.Int64{&e.excludedUntil, &e.rampFrom, &e.probeDue, &e.capProbeAt, &e.probationUntil} {
		if t := v.Load(); t != 0 && t > nowNs && t-nowNs > horizon {
			return true
		}
	}
	return false
}

// nonZero is a clock reading stored where 0 means none (a ramp's start):
// nowNs, or 1 for a reading of exactly 0. Not max(nowNs, 1): a clock that
// reads before 1970 reads below 0, and its ramps all began in 1970.
func nonZero(nowNs int64) int64 {
	if nowNs == 0 {
		return 1
	}
	return nowNs
}

// tripCount counts an open of e's breaker and returns how many count
// towards its exclusion time: a failed probe adds one to the opens before
// it; a trip after a recovery adds one to what is left of them after one
// is forgiven for every EjectionTime of good standing since. An endpoint
// that passes its probes and fails again at once (a flapping one) is held
// out twice as long each time, as consecutive failed probes are, instead
// of starting over at EjectionTime; one that stayed healthy for a while
// starts over (Envoy's outlier detection decays its ejection multiplier
// the same way). Opens past the first held out for MaxEjectionTime
// lengthen nothing and are not kept: each failed probe of a long outage
// counted one, and after an hour of them, two good minutes forgave 12 of
// 31 and the next trip held the endpoint out for the cap. Called under
// the breaker's mutex.
func (b *Balancer) tripCount(e *endpoint, nowNs int64) int32 {
	n := min(e.opens.Load(), b.ejectionsToCap())
	if r := e.recoveredAt.Load(); r != 0 && n > 0 {
		healthy := max(nowNs-r, 0) / int64(max(b.cfg.ejectionTime, 1))
		n = int32(max(int64(n)-healthy, 0))
		e.recoveredAt.Store(0) // forgiven once per recovery
	}
	n++
	e.opens.Store(n)
	return n
}

// ejectionCount returns the count of consecutive outlier ejections an
// ejection of e makes, judged by the window that began at goodUntil: one
// more than before, less one for each span of good standing between its
// return from the last ejection and goodUntil (the window it failed in is
// no good standing) as long as that ejection, and at least two
// OutlierIntervals. Computed at the decision, from the count and the last
// return, and stored only with the ejection it makes: stored at a decision
// that MaxEjectedFraction capped, the next decision would forgive the same
// good standing again.
//
// The count starts over as well when an evaluation judges e no outlier;
// but one with fewer than OutlierMinRequests calls in an interval is never
// judged, and an endpoint ejected once and then given light traffic for a
// day was held out twice as long at its next ejection, as if it had just
// flapped. The breaker's rule (one doubling forgiven per EjectionTime, see
// tripCount) does not fit here: the first evaluation that can judge a
// returned endpoint comes an OutlierInterval after it returned, which is
// EjectionTime by default, and a flapping endpoint would start over each
// time. With spans of at least two intervals, one that fails again in
// either of the two intervals after its return is held out twice as long;
// one that stays in good standing is forgiven a doubling per span, step
// by step. Counts past the first held out for MaxEjectionTime lengthen
// nothing and are not kept: forgiveness starts from the cap.
//
// Envoy decrements its ejection multiplier (base_ejection_time times it,
// linear, up to max_ejection_time) at every interval tick at which the
// host is not ejected, whatever its traffic, before that tick's
// success-rate ejections: a host ejected by success rate again, which
// takes an interval's calls after its return, is forgiven the step first
// and held out base_ejection_time each time; only inline (consecutive
// failure) ejections within an interval of a return make it grow. Here a
// flap of an interval or two doubles the ejection, and forgiveness takes
// longer after a long ejection (a span is as long as the ejection).
//
// The return is a clock reading. A step back puts it ahead of the clock:
// afterStepBack mends it to the step (and one still ahead of goodUntil
// forgives nothing), so good standing counts from the step, as a
// breaker's does. A step forward counts as good standing: it cannot be
// told from time passing.
func (b *Balancer) ejectionCount(e *endpoint, goodUntil int64) int32 {
	n := e.ejections.Load()
	if n == 0 {
		return 1
	}
	n = min(n, b.ejectionsToCap())
	if back := e.ejectedUntil.Load(); goodUntil > back {
		span := max(b.ejectionTime(n), 2*min(b.cfg.outlierInterval, maxHold))
		// Unsigned: the difference of two readings, positive, need not
		// fit an int64 on a clock that stepped across the range.
		forgiven := (uint64(goodUntil) - uint64(back)) / uint64(span)
		n -= int32(min(forgiven, uint64(n)))
	}
	return n + 1
}

// ejectionsToCap is the first count of consecutive ejections held out for
// MaxEjectionTime: a count past it lengthens no ejection.
func (b *Balancer) ejectionsToCap() int32 {
	n := int32(1)
	for b.ejectionTime(n) < b.cfg.maxEjectionTime {
		n++
	}
	return n
}

// ejectionTime is the exclusion for the n-th consecutive ejection:
// EjectionTime doubled each time, capped at MaxEjectionTime.
func (b *Balancer) ejectionTime(n int32) time.Duration {
	d := b.cfg.ejectionTime
	for i := int32(1); i < n && d < b.cfg.maxEjectionTime; i++ {
		if d > b.cfg.maxEjectionTime/2 {
			return b.cfg.maxEjectionTime // doubling would pass it, or overflow
		}
		d *= 2
	}
	return min(d, b.cfg.maxEjectionTime)
}

// maxHold bounds how long one cooldown or ejection lasts: about 73 years,
// for ever in practice. A MaxCooldown or MaxEjectionTime meant as "for ever"
// (the largest Duration) would otherwise wrap now + d to a time in the past,
// and the exclusion would never apply; the clock-step horizon (twice the
// longest exclusion) is bounded by the same figure.
const maxHold = time.Duration(1 << 61)

// later is nowNs + d, with d at most maxHold, saturating. Only a time
// after 1970 can overflow: for one before (a fake clock from the zero
// Time reads far below zero), MaxInt64 - nowNs itself would overflow, and
// every exclusion saturated to the end of time.
func later(nowNs int64, d time.Duration) int64 {
	d = min(d, maxHold)
	if nowNs > 0 && int64(d) > math.MaxInt64-nowNs {
		return math.MaxInt64
	}
	return nowNs + int64(d)
}

// mayEject reports whether self may be held out without passing
// MaxEjectedFraction of any pool it is in (one is always allowed): in
// each, the endpoints held out besides self, plus self, within the cap.
//
// A pool is a group calls are routed over: the endpoints of one model
// (with the unlabelled ones, which serve every model), or the unlabelled
// ones for models nobody lists, or, in a fleet with no model labels, the
// whole fleet; each membership's own. The cap is there to leave a pool
// enough endpoints to carry its calls, and one model's endpoints cannot
// carry another's: counted over the whole fleet (as Envoy counts over a
// cluster, which is one pool), every endpoint of a small model could go
// while the fleet stayed under the cap, a big model lost more than the
// fraction of its own, and a small model's one ejection was refused when
// another model's endpoint was out. Requests that name no model route
// over the whole membership, which keeps about the fraction as each model
// does.
//
// Counting self among the held out, an endpoint already ejected as an
// outlier could not trip its breaker on the failures of its calls still
// in flight, and came back from the ejection with no probes. It scans the
// pools: ejections are rare, picks are not. Called with ejectMu held,
// which the caller keeps until it has marked self out (brOpen or
// ejectedUntil): breakers trip under their own endpoint's mutex, and when
// a whole fleet fails at once, trips that each checked before any marked
// held out more than the cap allows.
func (b *Balancer) mayEject(self *endpoint, nowNs int64) bool {
	pools := self.pools.Load()
	if pools == nil {
		return true // in no membership now: it holds no pool's endpoint out
	}
	for _, g := range *pools {
		ejected := 0
		for _, e := range g.members {
			if e != self && e.heldOut(nowNs) {
				ejected++
			}
		}
		// Rounded down, but not by the product's float error: 0.29 *
		// 100 is 28.999999999999996, and allowed 28 of 100.
		if ejected+1 > max(int(b.cfg.maxEjected*float64(len(g.members))+1e-9), 1) {
			return false
		}
	}
	return true
}

// emit reports ev, an event of e. An endpoint that has left the Balancer
// has no standing to report: its calls still in flight may trip its
// breaker or cool it down, but told under its ID, that read as a change of
// the endpoint added back under the ID since (or to be added back), which
// is in rotation.
func (b *Balancer) emit(e *endpoint, ev Event) {
	if b.cfg.onEvent != nil && !e.gone.Load() {
		b.cfg.onEvent(ev)
	}
}

// report feeds one outcome to e's breaker. Calls picked before the breaker's
// last transition (gen differs) are ignored, as gobreaker ignores stale
// generations: a straggler must not close a breaker its failures opened.
//
// The common case, a success on a closed breaker with no failure streak to
// reset, changes nothing gobreaker acts on, so it is not reported: that keeps
// the breaker's mutex and clock reads off the path of healthy endpoints.
// That skip is sound only while the streak and gobreaker's count agree: a
// streak is noted exactly when gobreaker counts a failure and ended exactly
// when it counts a success. So the streak is noted under brMu with the
// report itself, after the generation check. Noted before it, a success
// could overtake a failure between the two: it ended the streak and
// reported, the failure then reached gobreaker, which held a failure no
// streak noted, and every later success skipped its report: the next trip
// came after BreakerFailures-1 failures, whatever successes came between.
// (A stale success that ended the streak before its generation check
// failed did the same.)
func (b *Balancer) report(e *endpoint, gen uint32, err error, nowNs int64) {
	if e.breaker == nil || e.brGen.Load() != gen {
		return
	}
	if closed := e.brState.Load() == int32(gobreaker.StateClosed); closed && (err == errExcluded || err == nil && e.failStreak.Load() == 0) {
		// Read unlocked: a failure that notes its streak after this
		// read reaches gobreaker after this success would have, so
		// skipping the success loses nothing. An excluded outcome (a
		// cancellation, an overload, a client error, ...) changes no
		// count a closed breaker trips on (gobreaker counts it as a
		// request and an exclusion); were the breaker tripped since the
		// read, the next report makes the move to half-open this one
		// would have made. So the calls that end so on a healthy
		// endpoint take no lock.
		return
	}
	// The generation is checked again under brMu, with the report itself:
	// between an unlocked check and Execute, a concurrent report could trip
	// the breaker, and this straggler of the old generation would then meet
	// a half-open breaker (its open timeout is 1ns) and count as a failed
	// probe. A burst of concurrent failures, as when a replica dies with
	// calls in flight, escalated the exclusion that way, doubling it per
	// straggler.
	if b.beforeBrMu != nil {
		b.beforeBrMu()
	}
	e.brMu.Lock()
	defer e.brMu.Unlock()
	if e.brGen.Load() != gen {
		return
	}
	if err != errExcluded {
		noteStreak(e, nowNs, err != nil) // before a trip reads it (Detection)
	}
	// Execute is gobreaker's allow-then-report in one call; the call itself
	// already happened, so the function only hands over its result. This
	// closure does not escape, so reporting does not allocate (the two-step
	// API's Allow returns a heap closure per call).
	_, _ = e.breaker.Execute(func() (struct{}, error) { return struct{}{}, err })
}

// takeProbe takes a half-open probe for a pick at nowNs on e, whose
// breaker is open and which usable let through: a free slot, or, when
// every probe is out and overdue, the place of one of them. It reports
// false when a racing pick took the last of either first.
//
// gobreaker closes a half-open breaker only when all BreakerProbes probes
// have succeeded, and a probe holds its slot until its call ends. A probe
// that never ends (a server that accepts calls and never answers them, or
// loses one while it serves the rest, and a caller with no deadline) held
// the endpoint out for good. So once every probe is out, they are overdue
// after probeLife, the exclusion the breaker just served: one more call is
// let through as a probe, and the next wait is twice as long, up to
// MaxEjectionTime, as a failing endpoint's exclusions grow. A wedged server
// so gets about as many calls as one whose probes fail, and a server that
// recovered, or only ran one long generation, is probed again. The probes
// out still count when they end: each is a call of this breaker
// generation.
//
// Only a pick on a breaker-open endpoint gets here, and the deadline is a
// reading of the pick's own clock: picks of healthy endpoints do nothing
// more.
func (b *Balancer) takeProbe(e *endpoint, nowNs int64) bool {
	if n := e.probeSlots.Add(-1); n >= 0 {
		if n == 0 {
			e.probeDue.Store(later(nowNs, time.Duration(e.probeLife.Load())))
			b.epoch.Add(1) // its last probe is out: no longer in good standing
		}
		return true
	}
	e.probeSlots.Add(1)
	due := e.probeDue.Load()
	if due == 0 || due > nowNs {
		return false
	}
	life := b.cfg.maxEjectionTime
	if l := time.Duration(e.probeLife.Load()); l < life/2 {
		life = 2 * l // doubling cannot pass the cap, nor overflow
	}
	if !e.probeDue.CompareAndSwap(due, later(nowNs, life)) {
		return false
	}
	e.probeLife.Store(int64(life))
	b.epoch.Add(1) // its probes are out again, until the new deadline
	return true
}

// returnProbe gives back the half-open probe slot p took when its outcome
// says nothing about health (a cancellation, a call never sent, an
// overload answer): gobreaker does not count such a probe either, so
// without this the slots run out while the breaker still waits for its
// probes, and the endpoint would stay out of rotation for good. A slot of
// an older breaker generation is not returned: a trip or recovery since has
// set the slots anew. Nor is one past BreakerProbes: a probe let through
// in the place of an overdue one took no slot of its own (see takeProbe).
func (b *Balancer) returnProbe(p *Pick) {
	if atomic.LoadUint32(&p.flags)&pickProbe == 0 || p.e.brGen.Load() != p.gen {
		return
	}
	for {
		n := p.e.probeSlots.Load()
		if n >= int32(b.cfg.breakerProbes) {
			return
		}
		if n <= 0 {
			// The deadline is that of probes all out; with a slot free
			// again there is none until the last is taken again. Left
			// in place, past once a probe outlived it, a pick that lost
			// the race for the freed slot found it overdue and went as
			// a second probe. Cleared before the slot is given back:
			// cleared after, it could erase the deadline the pick taking
			// the slot sets, and a probe that then hung held the
			// endpoint out for good.
			p.e.probeDue.Store(0)
		}
		if p.e.probeSlots.CompareAndSwap(n, n+1) {
			if n <= 0 { // below 0 while a racing takeProbe gives one back
				b.epoch.Add(1) // a probe slot again: back in good standing
			}
			return
		}
	}
}

// noteStreak tracks when the current run of failures began, for detection
// time and for report's skip of successes. Called under e.brMu, with the
// outcome's report to the breaker (see report).
func noteStreak(e *endpoint, nowNs int64, failed bool) {
	if !failed {
		if e.failStreak.Load() != 0 {
			e.failStreak.Store(0)
		}
		return
	}
	if e.failStreak.Load() == 0 {
		e.failStreak.Store(nonZero(nowNs))
	}
}

// maybeEvaluateOutliers runs outlier detection when its interval is due.
// Only one caller at a time evaluates; others skip.
//
// Each endpoint's success rate over the interval (if it had
// OutlierMinRequests calls) is compared with the median of its pools',
// the pools MaxEjectedFraction caps (see mayEject): one model's endpoints,
// in one Membership. Models differ in how often their calls fail by
// nature (a harder task; bad input some of their callers send), and
// against one median over the whole fleet the model with most endpoints
// set the bar for all: a model failing more often than that one lost
// healthy endpoints for it, and a bad endpoint of a small model went
// unseen while a big model's failures pulled the median down.
//
// A pool judges its endpoints only when at least 3 of them were judged,
// itself among them. An endpoint in several pools (one serving several
// models, or listed by several Memberships) is an outlier when it is one
// in any pool that judges it; when it is one in none, its consecutive
// ejections start over. This is Envoy's per-cluster detection, a detector
// per cluster, read for a client whose clusters share one endpoint state,
// so the ejection of one cluster's detector holds it out of all (each
// within its cap). Its success rate is one figure over all its calls, whichever
// pool they were routed in: counting per pool would cost every call.
//
// An outlier cooling down (an overload answer's Retry-After) is judged
// and ejected all the same: the overload says the server is busy, not
// that its failures are over. Passed over, its interval's counts were
// dropped with the rest, and it came back from the cooldown in good
// standing (one overloaded again by every evaluation was never ejected).
// One held out for failing already (its breaker open, or an ejection in
// force) is not ejected again.
//
// It reads each endpoint's pools, not the memberships, so it takes no
// lock but outlierMu (and ejectMu to eject); its work is the sum of the
// pools' sizes, and its scratch is kept, so it allocates only when the
// fleet has grown since the last evaluation.
func (b *Balancer) maybeEvaluateOutliers(nowNs int64) {
	if b.cfg.outlierInterval <= 0 || !b.outliersDue(nowNs) || !b.outlierMu.TryLock() {
		return
	}
	defer b.outlierMu.Unlock()
	if !b.outliersDue(nowNs) {
		return
	}
	// Saturating: an interval meant as "never" wrapped to a time past.
	b.nextOutlier.Store(later(nowNs, b.cfg.outlierInterval))
	// The window judged now began at the last evaluation: an outlier's
	// good standing ended there at the latest (see ejectionCount). Not
	// after now, when the clock stepped back since.
	from := min(b.outlierFrom, nowNs)
	b.outlierFrom = nowNs
	all := b.all.Load()
	if all == nil {
		return
	}
	b.outlierRound++
	round := b.outlierRound
	pools := b.outlierPools[:0]
	for _, e := range *all {
		s, f := e.successes.Load(), e.failures.Load()
		ds, df := s-e.winSucc, f-e.winFail
		e.winSucc, e.winFail = s, f
		n := ds + df
		if n < uint64(b.cfg.outlierMinRequests) {
			continue
		}
		e.winRate, e.winRound, e.winOutlier = float64(ds)/float64(n), round, false
		if ps := e.pools.Load(); ps != nil {
			for _, g := range *ps {
				if g.outlierRound != round {
					g.outlierRound = round
					pools = append(pools, g)
				}
			}
		}
	}
	for _, g := range pools {
		// Members judged this round; a member that left the Balancer
		// since the pool was built is not in all and was not.
		rates := b.outlierRates[:0]
		for _, e := range g.members {
			if e.winRound == round {
				rates = append(rates, e.winRate)
			}
		}
		b.outlierRates = rates
		if len(rates) < 3 {
			continue // too few peers to call anyone an outlier
		}
		slices.Sort(rates)
		median := rates[len(rates)/2]
		if len(rates)%2 == 0 {
			median = (rates[len(rates)/2-1] + median) / 2
		}
		for _, e := range g.members {
			if e.winRound == round {
				e.winPeered = round
				if e.winRate < median-b.cfg.outlierMargin {
					e.winOutlier = true
				}
			}
		}
	}
	clear(pools) // keeps no snapshot's groups alive until the next round
	b.outlierPools = pools[:0]
	for _, e := range *all {
		if e.winPeered != round {
			continue // no pool judged it
		}
		if !e.winOutlier {
			e.ejections.Store(0)
			e.capped.And(^uint32(cappedOutlier))
			continue
		}
		if e.excludedUntil.Load() > nowNs && e.heldOut(nowNs) {
			continue // out for failing already: its breaker or an ejection holds it
		}
		now := time.Unix(0, nowNs)
		b.ejectMu.Lock()
		if !b.mayEject(e, nowNs) {
			b.ejectMu.Unlock()
			if e.capped.Or(cappedOutlier)&cappedOutlier == 0 {
				b.emit(e, Event{Kind: EventCapped, Endpoint: e.id, At: now})
			}
			continue
		}
		e.capped.And(^uint32(cappedOutlier))
		n := b.ejectionCount(e, from)
		e.ejections.Store(n)
		until := later(nowNs, b.ejectionTime(n))
		e.ejectedUntil.Store(until)
		b.ejectMu.Unlock()
		exclude(&e.excludedUntil, until)
		// It returns when its exclusion ends: a cooldown in force may
		// outlast the ejection.
		back := max(until, e.excludedUntil.Load())
		e.rampFrom.Store(nonZero(back)) // ramp up when it returns
		e.ejectCount.Add(1)
		b.forgetLoad(e, now)
		b.epoch.Add(1)
		b.emit(e, Event{Kind: EventEjected, Endpoint: e.id, At: now, Until: time.Unix(0, back)})
	}
}

// outliersDue reports whether an outlier evaluation is due at now. The next
// one is never more than an interval ahead, unless the clock stepped back
// since the last: it is then due at once, or detection would stop for as
// long as the step.
func (b *Balancer) outliersDue(nowNs int64) bool {
	next := b.nextOutlier.Load()
	return nowNs >= next || next-nowNs > int64(b.cfg.outlierInterval)
}
