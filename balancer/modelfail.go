package balancer

import (
	"sync"
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
// no other call failed there since the run began, and the endpoint's
// latest success was another model's, within ErrorDecay before the run
// began or since. Such a failure leaves the endpoint's error rate, breaker
// and outlier statistics alone and is counted in EndpointStats.
// ModelFailures instead of Failures. Everything else counts against the
// endpoint as before: the first two failures of every run; a server that
// serves one model, or that fails whatever it is sent (its other models'
// calls fail too), or that has served nothing of late; and nearly all the
// failures of a flaky server, whose runs of one model's failures seldom
// pass two before another call fails there.
//
// After BreakerFailures consecutive failures of a model on an endpoint,
// the last of them held against the model, the model's picks pass the
// endpoint over (as for a model it does not serve, see notserved.go) for
// EjectionTime, doubled for each further failure after that (the next
// call that goes there is a probe), up to MaxEjectionTime; a success of
// the model there ends it. A model failing everywhere is then picked as
// if nothing were remembered, and no retry goes on to another endpoint
// for it. With the breaker disabled (BreakerFailures negative), every
// failure counts against the endpoint, as before.
//
// The runs are kept in a bounded table (runSlots entries, 4-way set
// associative, 40 KiB allocated at the first failure with a model) keyed
// by the seeded hash of (endpoint, model): model names are request data,
// and a name cannot be aimed at another model's run. A run that saw no
// failure for runLife is over. A success pays a hash of its model name and
// an atomic load, plus the table's lock when its endpoint had a failure
// with a model within runLife.

const (
	runSlots = 1024
	runWays  = 4
	// ownFrom is the first failure of a run that can be held against the
	// model: the two before it count against the endpoint whatever else
	// it serves. A server that fails calls at random (30% of them, in
	// TestFlakyServerKeepsItsFailures' 16 runs) puts a third of its
	// failures at the second place of a run or later, a tenth at the
	// third: from the first, its failures were held against the models
	// and it kept 4,124 calls (1,284 failed) against 114 when no failure
	// names a model; from the second 106 (36 failed); from the third 114
	// (26), and a server failing every call tripped about one failure
	// later than when none names a model (TestServerFailingEverythingStillTrips).
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
// the probe after the longest pass-over continues the run.
func (c *config) runLife() int64 {
	return int64(c.maxEjectionTime + c.errorDecay)
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
	for {
		cur := e.modelFailAt.Load()
		if cur >= nowNs || e.modelFailAt.CompareAndSwap(cur, nowNs) {
			break
		}
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
	ok := e.okModel.Load()
	own := r.n >= ownFrom && others == 0 && ok != 0 && ok != okModelKey(model) &&
		e.okAt.Load() > r.start-int64(b.cfg.errorDecay)
	var hold time.Duration
	if own && r.n >= uint32(b.cfg.breakerFailures) {
		r.holds++
		hold = b.ejectionTime(int32(min(r.holds, 1<<20)))
	}
	t.mu.Unlock()
	if hold > 0 {
		b.passOverFor(e, mk, nowNs, hold)
		b.emit(Event{Kind: EventModelFailing, Endpoint: e.id, Model: model, At: time.Unix(0, nowNs), Until: time.Unix(0, later(nowNs, hold))})
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

// okModelKey identifies the model of a success (endpoint.okModel): an
// unseeded hash, as it picks no table slot; two models it confuses only
// make a failure count against the endpoint, as without Outcome.Model.
func okModelKey(model string) uint64 {
	if model == "" {
		return 0
	}
	return max(xxhash.Sum64String(model), 1)
}
