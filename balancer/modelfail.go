package balancer

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// A model failing on an endpoint that serves others.
//
// One server often serves several models: Triton with a model repository,
// vLLM with LoRA adapters on one base model, Ollama. One of them can fail
// while the others serve well: a Triton model whose backend crashed or
// ran out of memory answers INTERNAL to its own calls only; a LoRA adapter
// whose weights are corrupt fails its calls and nobody else's. Counted
// against the endpoint, that model's failures raised the endpoint's error
// rate, opened its breaker and had outlier detection eject it, so every
// model lost the endpoint: in a fleet of 4 serving two models, one model
// broken on one replica left the other model 6 to 24 of its 500 calls
// there instead of 190 to 212, and a model broken on every replica (a bad
// version rolled out) had half the fleet tripped (MaxEjectedFraction) and
// the healthy model's calls crowded onto the rest (modelfail_test.go).
//
// So a failure the server answered for a model (Outcome.Model set: an HTTP
// 5xx, an error event in a stream, a gRPC status the server sent; never a
// refused dial or a broken connection, which are the endpoint's) can be
// held against that model on that endpoint instead of the endpoint. It is
// when it is the third or a later failure of the model's current run of
// consecutive failures there (a success of the model there ends the run),
// no other call failed there since the run began, and another model's
// latest success there came after any other call's latest failure there
// and within ErrorDecay before the run began or since. (Another model's,
// not the endpoint's latest: when a model's backend crashes, its calls
// under way fail together, and the latest success is as likely the
// model's own; TestModelBreakingMidCall.) Such a failure leaves the endpoint's error rate, breaker
// and outlier statistics alone and is counted in EndpointStats.
// ModelFailures instead of Failures. Everything else counts against the
// endpoint as before: the first two failures of every run; a server that
// serves one model, or that fails whatever it is sent (its other models'
// calls fail too, before or after: TestServerCrashTripsWhicheverModelFailsFirst),
// or that has served nothing of late; and nearly all the failures of a
// flaky server, whose runs of one model's failures seldom pass two before
// another call fails there.
//
// After BreakerFailures consecutive failures of a model on an endpoint,
// the last of them held against the model, the model's picks pass the
// endpoint over (as for a model it does not serve, see notserved.go) for
// EjectionTime, doubled for each further failure after that (the next
// call that goes there is a probe), up to MaxEjectionTime; a success of
// the model there ends it. A model failing everywhere is then picked as
// if nothing were remembered, and no retry goes on to another endpoint
// for it, and its failures extend the pass-overs (one EventModelFailing
// per pass-over begun, not per failure). With the breaker disabled
// (BreakerFailures negative), every failure counts against the endpoint,
// as before.
//
// The runs are kept in a bounded table (runSlots entries, 4-way set
// associative, 40 KiB allocated at the first failure with a model) keyed
// by the seeded hash of (endpoint, model): model names are request data,
// and a name cannot be aimed at another model's run. A run that saw no
// failure for runLife is over. A success pays a hash of its model name
// (modelID), a few atomic loads and a store, plus the table's lock when
// its endpoint had a failure within runLife (its latest failure's time is
// the endpoint's failed.at0).

const (
	runSlots = 1024
	runWays  = 4
	// ownFrom is the first failure of a run that can be held against the
	// model: the two before it count against the endpoint whatever else
	// it serves. A server that fails calls at random (30% of them, in
	// TestFlakyServerKeepsItsFailures' 16 runs) puts a third of its
	// failures at the second place of a run or later, a tenth at the
	// third. Held against the models from the first failure of a run, it
	// kept 2,188 calls (711 failed) against 114 (28) when no failure names
	// a model; from the second, 99 (34); from the third, 115 (26), and a
	// server failing every call tripped after 187 failed calls in 16 runs
	// against 180 (249 from the first, 197 from the second).
	ownFrom = 3
)

// run is one (endpoint, model) pair's current run of consecutive
// failures.
type run struct {
	key   uint64 // pairKey; 0: free
	start int64  // unix ns of the run's first failure
	last  int64  // unix ns of its latest failure
	n     uint32 // failures in the run
	holds uint32 // times the model's picks were made to pass the endpoint over in this run
	// The endpoint's failures (failures and modelFailures) before the
	// run's first: those since, less the run's own, are other calls'.
	fails0 uint64
}

// runTable holds the runs.
type runTable struct {
	mu   sync.Mutex
	runs [runSlots]run
}

// runLife is how long a run lasts without a failure: the longest pass-over
// (MaxEjectionTime) and one ErrorDecay after it, so that the failure of
// the probe after the longest pass-over continues the run. Each is
// bounded by maxHold, as exclusions are: a MaxEjectionTime or ErrorDecay
// meant as "for ever" (the largest Duration) wrapped the sum to a time
// below zero, and every failure then began a run of its own.
func (c *config) runLife() int64 {
	return int64(min(c.maxEjectionTime, maxHold) + min(c.errorDecay, maxHold))
}

// find returns key's run in t, or a free, lapsed or the oldest slot of
// its set, emptied, when it has none (fresh). Called with t.mu held.
func (t *runTable) find(key uint64, nowNs, life int64, create bool) (r *run, fresh bool) {
	i := int(key%(runSlots/runWays)) * runWays
	set := t.runs[i : i+runWays]
	lapsed := func(s *run) bool { return s.key == 0 || nowNs-s.last >= life }
	var victim *run
	for j := range set {
		s := &set[j]
		if s.key == key {
			if !lapsed(s) {
				return s, false
			}
			victim = s
			break
		}
		if victim == nil || lapsed(s) && !lapsed(victim) || !lapsed(victim) && !lapsed(s) && s.last < victim.last {
			victim = s
		}
	}
	if !create {
		return nil, false
	}
	*victim = run{key: key, start: nowNs}
	return victim, true
}

// modelFailed records a failure of a call for model that e answered, at
// nowNs, and reports whether it is held against model on e only (see
// above).
func (b *Balancer) modelFailed(e *endpoint, model string, nowNs int64) bool {
	if b.cfg.breakerFailures <= 0 || model == "" {
		return false
	}
	t := b.runs.Load()
	if t == nil {
		b.runs.CompareAndSwap(nil, new(runTable))
		t = b.runs.Load()
	}
	mk := b.modelKey(model)
	t.mu.Lock()
	fails := e.failures.Load() + e.modelFailures.Load()
	r, fresh := t.find(pairKey(e.serial, mk), nowNs, b.cfg.runLife(), true)
	if fresh {
		r.fails0 = fails
	}
	others := fails - r.fails0 - uint64(r.n) // r.n: the run's failures before this one
	r.n = min(r.n+1, 1<<30)
	r.last = nowNs
	id := modelID(model)
	own := r.n >= ownFrom && others == 0 &&
		e.served.other(id) > max(e.failed.other(id), r.start-int64(b.cfg.errorDecay))
	var hold time.Duration
	if own && r.n >= uint32(b.cfg.breakerFailures) {
		r.holds++
		hold = b.ejectionTime(int32(min(r.holds, 1<<20)))
	}
	t.mu.Unlock()
	if hold > 0 && b.passOverFor(e, mk, nowNs, hold) {
		// One event per pass-over begun: a model failing on every
		// endpoint is picked anyway, and its failures extend the
		// pass-overs in force.
		b.emit(e, Event{Kind: EventModelFailing, Endpoint: e.id, Model: model, At: time.Unix(0, nowNs), Until: time.Unix(0, later(nowNs, hold))})
	}
	return own
}

// modelServed ends model's run of failures on e, if it has one, after a
// success of model's call there at nowNs; and the pass-over a run put in
// place (a call that went there anyway, with nowhere else to go, was
// served).
func (b *Balancer) modelServed(e *endpoint, model string, nowNs int64) {
	t := b.runs.Load()
	if t == nil {
		return
	}
	mk := b.modelKey(model)
	t.mu.Lock()
	r, _ := t.find(pairKey(e.serial, mk), nowNs, b.cfg.runLife(), false)
	held := false
	if r != nil {
		held = r.holds > 0
		*r = run{}
	}
	t.mu.Unlock()
	if lt := b.lack.Load(); held && lt != nil {
		lt.forget(e, mk)
	}
}

// modelID identifies a model in an endpoint's recent outcomes (recent):
// an unseeded hash, as it picks no table slot; two models it confuses
// only make a failure count against the endpoint, as without
// Outcome.Model. 0 is no model.
func modelID(model string) uint64 {
	if model == "" {
		return 0
	}
	return max(xxhash.Sum64String(model), 1)
}

// recent holds an endpoint's latest outcome of one kind (success or
// failure) and its model, and the latest of another model than that one:
// together, for any model, the latest outcome of another model. Its words
// are updated apart, without a lock: a race between two outcomes can leave
// a pairing that never was, which only errs for one decision of modelFailed.
type recent struct {
	id0, id1 atomic.Uint64 // modelID; id1 != id0
	at0, at1 atomic.Int64  // unix ns; 0: none
}

// note records an outcome of model id at nowNs.
func (r *recent) note(id uint64, nowNs int64) {
	if r.id0.Load() == id && r.at0.Load() != 0 {
		r.at0.Store(nowNs)
		return
	}
	r.id1.Store(r.id0.Load())
	r.at1.Store(r.at0.Load())
	r.id0.Store(id)
	r.at0.Store(nowNs)
}

// other is the unix ns of the latest outcome of another model than id
// (math.MinInt64: none).
func (r *recent) other(id uint64) int64 {
	switch {
	case r.at0.Load() != 0 && r.id0.Load() != id:
		return r.at0.Load()
	case r.at1.Load() != 0 && r.id1.Load() != id:
		return r.at1.Load()
	}
	return math.MinInt64
}
