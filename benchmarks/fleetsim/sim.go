package fleetsim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// Epoch is the wall-clock instant the virtual clock starts at.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Errors a simulated call can end with.
var (
	errCrashed   = errors.New("fleetsim: replica crashed")
	errRefused   = errors.New("fleetsim: connection refused")
	errNotServed = errors.New("fleetsim: 404 the model does not exist")
	// errModelFailed is a failure the replica answered (a 500, or an
	// error event in a stream) for a model that fails there (ModelFail).
	errModelFailed = errors.New("fleetsim: 500 the model failed")
	// errTooLong is a replica's 400 to a call longer than its context
	// window (ServerParams.MaxModelLen).
	errTooLong = errors.New("fleetsim: 400 the call is longer than the context window")
	// errUnauthorized is the 401 of a replica with the wrong API key
	// (ReplicaSpec.Unauthorized).
	errUnauthorized = errors.New("fleetsim: 401 unauthorized")
)

// unauthorizedDelay is how long a replica with the wrong API key takes to
// answer 401: the API server checks the key before it reads the body, so
// the answer costs a round trip on the cluster network and nothing else.
const unauthorizedDelay = time.Millisecond

// windowRefusalDelay is how long a replica takes to refuse a call longer
// than its context window: vLLM's API server tokenizes the prompt (a fast
// tokenizer does some 10-30k tokens in a few ms) and compares its length
// and max_tokens with max_model_len before the engine sees the call, so
// the 400 costs a round trip and the tokenizing, and no GPU work.
const windowRefusalDelay = 5 * time.Millisecond

// modelFailedDelay is how long a replica takes to answer 500 to a call
// for a model that fails there (ModelFail): the API server hands the call
// to the model's backend, which fails it before any GPU work (a Triton
// model whose backend crashed, a LoRA adapter whose weights do not load).
const modelFailedDelay = 5 * time.Millisecond

// notServedDelay is how long a replica takes to answer that it does not
// serve a call's model: vLLM's API server looks the name up before the
// engine sees the call (serving_engine's _check_model), so the 404 costs a
// round trip and no GPU work.
const notServedDelay = 3 * time.Millisecond

// transportNotServedHops is how many times the HTTP transport sends a call
// on to another endpoint after answers that the endpoint does not serve its
// model, in a fleet of 9 endpoints or fewer as in every scenario that meets
// such answers (httpbalancer's notServedHops: its endpoints less one, at
// least minNotServedHops, 8).
const transportNotServedHops = 8

// Clock is the simulator's virtual clock; it implements balancer.Clock, so
// the real Balancer sees simulated time.
type Clock struct{ now *time.Duration }

// Now returns the simulated instant.
func (c Clock) Now() time.Time { return Epoch.Add(*c.now) }

// Request is one call a workload sends. Workloads fill every field but
// Client, which the run assigns.
type Request struct {
	Service inferlb.Service
	Model   string
	Prompt  *Prompt
	// OutputTokens is how many tokens the server generates (0 for embeddings).
	OutputTokens int
	// MaxOutputTokens is what the client declares (max_tokens), the router's
	// estimate of the work.
	MaxOutputTokens int
	// AnswerID is the content ID of the answer, so a follow-up turn that
	// quotes it hits the blocks the server cached while generating it.
	AnswerID uint64
	// AffinityKey is the key a client derives from the request content with
	// the cache package (0 = none).
	AffinityKey uint64
	// Client is the index of the client process that sends the request.
	Client int
	// Class labels the request for per-class reporting ("heavy", "rerank").
	Class string
	// Tenant names the tenant that sends it ("" = none), as a client's
	// tenant header would.
	Tenant string
	// session lets closed-loop workloads find their state on completion.
	session any
}

// job is one request's life across attempts.
type job struct {
	req        *Request
	arrive     time.Duration
	firstToken time.Duration // -1 until the current attempt's first token
	attempts   int
	hops       int // attempts that met a replica without the call's model, or too small for it, and went on
	measured   bool
	over       bool // ended for good, or counted unfinished at the end of the run (censor)
	done       func(inferlb.Outcome)
	rep        *replica
	start      time.Duration // of the current attempt
	// slotWait is how long the call waited for a LoRA adapter slot, over
	// its attempts; slotWaited says it did at all (MaxLoRAs).
	slotWait   time.Duration
	slotWaited bool
	// Live servers only: onToken sees each token as it is produced, and
	// onEnd the end of the call.
	onToken func(n int)
	onEnd   func(err error)
	// sq is the current attempt's sequence on its replica, once queued
	// (Scenario.ClientTimeout cancels it there).
	sq *seq
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq // FIFO among equal times: determinism
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return e
}

// run is one simulation: one scenario, one policy, one offered load.
// Everything happens on one goroutine in virtual time.
type run struct {
	sc      *Scenario
	cfg     RunConfig
	now     time.Duration
	seq     uint64
	events  eventQueue
	reps    []*replica
	routers []Router // one per client; shared policies repeat one router
	uniq    []Router // each router once, in client order
	members []int    // replicas in service discovery, ascending
	wl      Workload
	stopped bool // no new arrivals

	outstanding int    // measured jobs not yet finished
	live        []*job // measured jobs, in arrival order; censor counts those not over
	itl         histogram
	ttft, e2e   []float64
	classE2E    map[string][]float64 // keyed by class; read in sorted key order
	tokens      int64                // output tokens produced (input tokens for pooling calls)
	wasted      int64                // of those, produced in the window by attempts that failed
	failed      int
	abandoned   int // of failed, calls their callers gave up on (ClientTimeout)
	retries     int
	notServed   int // measured calls' attempts answered "model not served"
	tooLong     int // measured calls' attempts refused as longer than the window
	// measured calls' attempts answered 401 (ReplicaSpec.Unauthorized,
	// RefusesTenants)
	unauthorized int
	requests     int
	marks        [2]counters
	split        *modelSplit  // Result.Healthy and Broken; nil without a ModelFail event
	lora         *loraStats   // Result.LoRA; nil when no replica limits adapters
	tenants      *tenantStats // Result.Tenants; nil when no replica refuses a tenant
}

// counters are snapshots taken at the start and end of the measurement window.
type counters struct {
	at       time.Duration
	tokens   int64
	busy     []time.Duration
	hits     int64
	queries  int64
	assigned []int
	loads    []int
}

func (s *run) after(d time.Duration, fn func()) { s.at(s.now+d, fn) }

func (s *run) at(t time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, event{at: t, seq: s.seq, fn: fn})
}

func (s *run) inWindow() bool { return s.now >= s.cfg.Warmup && s.now < s.cfg.Duration }

// Submit sends a request now. Workloads call it from their events.
func (s *run) Submit(req *Request) {
	if s.stopped {
		return
	}
	req.Client = s.clientOf(req)
	j := &job{req: req, arrive: s.now, firstToken: -1}
	j.measured = s.now >= s.cfg.Warmup && s.now < s.cfg.Duration
	if j.measured {
		s.outstanding++
		s.requests++
		s.live = append(s.live, j)
		if g := s.split.group(req); g != nil {
			g.requests++
		}
		s.tenants.arrived(s, req)
	}
	s.dispatch(j)
}

// clientOf is the client process that sends req: a hash of the run's seed
// and the call (its session's ID for every turn of a chat session, else
// its answer's content ID, else its prompt's), so that every policy's run
// of a seed maps the same calls to the same clients. Drawn in the order
// calls are submitted, as it was, it mapped them differently per policy
// in closed-loop workloads, whose turns follow completions that routing
// decides; and it moved a session from client to client between turns.
func (s *run) clientOf(req *Request) int {
	n := len(s.routers)
	if n <= 1 {
		return 0
	}
	var id uint64
	switch cs, _ := req.session.(*chatSession); {
	case cs != nil:
		id = contentID(15, cs.id, 0)
	case req.AnswerID != 0:
		id = req.AnswerID
	case req.Prompt != nil:
		id = promptID(req.Prompt)
	}
	return int(mix64(id^mix64(s.cfg.Seed^0xc11e)) % uint64(n))
}

// Now is the simulated time since the start of the run.
func (s *run) Now() time.Duration { return s.now }

// After schedules fn on the simulator after d; workloads use it for arrivals.
func (s *run) After(d time.Duration, fn func()) { s.after(d, fn) }

// Rand returns a random source for workloads, seeded from the run's seed.
func (s *run) Rand(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(s.cfg.Seed, stream))
}

// Stopped reports whether the arrival window has closed.
func (s *run) Stopped() bool { return s.stopped }

func (s *run) dispatch(j *job) {
	j.attempts++
	rt := s.routers[j.req.Client]
	var (
		idx  int
		done func(inferlb.Outcome)
		err  error
	)
	if rp, ok := rt.(retryPicker); ok && j.attempts > 1 {
		idx, done, err = rp.PickRetry(j.req, j.rep.idx)
	} else {
		idx, done, err = rt.Pick(j.req)
	}
	if err != nil {
		s.finish(j, s.now, err)
		return
	}
	if j.attempts > 1 && j.measured {
		s.retries++ // a retry sent, not one refused by PickRetry
	}
	s.send(j, idx, done)
}

// send starts an attempt of j on replica idx.
func (s *run) send(j *job, idx int, done func(inferlb.Outcome)) {
	r := s.reps[idx]
	j.rep, j.done, j.start = r, done, s.now
	if g := s.split.group(j.req); g != nil && j.measured {
		g.attempts[idx]++
	}
	if j.measured {
		s.tenants.sent(s, j.req, idx)
	}
	if !r.up {
		s.finish(j, s.now, errRefused)
		return
	}
	if r.unauthorized || r.refusesTenant(j.req) {
		s.after(unauthorizedDelay, func() { s.finish(j, s.now, errUnauthorized) })
		return
	}
	if !r.serves(j.req.Model) {
		s.after(notServedDelay, func() { s.finish(j, s.now, errNotServed) })
		return
	}
	if r.failsModel(j.req.Model) {
		s.after(modelFailedDelay, func() { s.finish(j, s.now, errModelFailed) })
		return
	}
	if r.tooLong(j.req) {
		s.after(windowRefusalDelay, func() { s.finish(j, s.now, errTooLong) })
		return
	}
	if !r.enqueue(j) {
		s.finish(j, s.now, errThrottled)
		return
	}
	if t := s.sc.ClientTimeout; t > 0 && j.onEnd == nil {
		sq := j.sq
		s.at(max(j.arrive+t, s.now), func() { s.giveUp(j, r, sq) })
	}
}

// giveUp is the caller of j giving up on its attempt sq on r at its
// deadline (Scenario.ClientTimeout), if the attempt is still on r: r
// drops it, the tokens it streamed are thrown away, the router hears
// context.Canceled (Unanswered when no token came back, as the adapters
// report a cancel before a stream's first token), and the call fails for
// good.
func (s *run) giveUp(j *job, r *replica, sq *seq) {
	if !r.drop(sq) {
		return
	}
	s.wasteTokens(j, sq.windowTokens)
	if j.done != nil {
		d := j.done
		j.done = nil
		d(inferlb.Outcome{Err: context.Canceled, Unanswered: j.firstToken < 0, Tenant: j.req.Tenant})
	}
	if j.measured {
		s.abandoned++
	}
	s.fail(j)
}

// hop sends j on after a replica answered that it does not serve j's
// model, as the library's adapters do (Balancer.PickRetry: another replica
// than the one that answered, within the retry budget). It reports false
// when PickRetry found none; the caller then gets the 404.
func (s *run) hop(j *job) bool {
	rp, ok := s.routers[j.req.Client].(retryPicker)
	if !ok {
		return false
	}
	idx, done, err := rp.PickRetry(j.req, j.rep.idx)
	if err != nil {
		return false
	}
	j.hops++
	if j.measured {
		s.retries++
	}
	s.send(j, idx, done)
	return true
}

var errThrottled = errors.New("fleetsim: 429 too many requests")

// answered reports whether an attempt that ended with err got an answer
// from its replica (a success, a 500 it returned, a 429, a 404, a 400
// refusing it as too long), rather
// than a refused connection or a stream cut by a crash.
func answered(err error) bool {
	return err == nil || errors.Is(err, errModelFailed) || errors.Is(err, errThrottled) || errors.Is(err, errNotServed) ||
		errors.Is(err, errTooLong) || errors.Is(err, errUnauthorized)
}

// finish ends one attempt. Failed attempts are retried once, immediately, on
// a new pick, as a client with one retry does.
func (s *run) finish(j *job, now time.Duration, err error) {
	if j.onEnd != nil {
		j.onEnd(err)
		return
	}
	if j.done != nil {
		o := inferlb.Outcome{Err: err, OutputTokens: j.req.OutputTokens}
		if err == nil && j.firstToken >= 0 {
			o.TTFT = j.firstToken - j.start
		}
		switch {
		case errors.Is(err, errThrottled):
			o = inferlb.Outcome{Overloaded: true, RetryAfter: j.rep.p.RetryAfter}
		case errors.Is(err, errNotServed):
			o = inferlb.Outcome{NotServedModel: j.req.Model}
		case errors.Is(err, errTooLong):
			o = inferlb.Outcome{ContextWindow: j.rep.p.MaxModelLen}
		case errors.Is(err, errUnauthorized):
			// As the adapters read a 401 (inferlb.Outcome.ClientError).
			o = inferlb.Outcome{ClientError: true}
		}
		if answered(err) {
			// As the HTTP transport does: the call's model on every call
			// the server answered, successes and the failures it
			// returned, so the balancer can hold a model's failures
			// against it on a server that serves others; never on a
			// refused dial or a stream its crash cut (inferlb.Outcome.Model).
			o.Model = j.req.Model
		}
		// As the adapters do, on every outcome: a client error that
		// names its tenant may be a refusal of that tenant's calls
		// only (inferlb.Outcome.Tenant).
		o.Tenant = j.req.Tenant
		d := j.done
		j.done = nil
		d(o)
	}
	if errors.Is(err, errNotServed) {
		if j.measured {
			s.notServed++
		}
		if hops, ok := s.notServedHops(j); ok {
			// Read as the library's adapters read it: the call goes on
			// while it has hops left, and the caller gets the 404 when
			// it cannot, never a failover retry.
			if j.hops >= hops || !s.hop(j) {
				s.fail(j)
			}
			return
		}
		// A router that knows nothing of the answer takes it for a
		// failure like any other (below).
	}
	if errors.Is(err, errUnauthorized) {
		// The caller gets the 401: no client retries a 4xx.
		if j.measured {
			s.unauthorized++
		}
		s.fail(j)
		return
	}
	if errors.Is(err, errTooLong) {
		if j.measured {
			s.tooLong++
		}
		if hops := s.windowHops(j); hops > 0 {
			// As the HTTP transport reads the 400: the call goes on to
			// a replica not remembered too small for it, within the
			// hops it shares with not-served answers, and its caller
			// gets the 400 when PickRetry finds none.
			if j.hops >= hops || !s.hop(j) {
				s.fail(j)
			}
			return
		}
		// The other routers take it for a failure (below).
	}
	if err != nil {
		if j.attempts < 2 && s.mayRetry(j) {
			// The retry generates the answer anew: its first token, not
			// one the failed attempt streamed, is the answer's.
			j.firstToken = -1
			s.dispatch(j)
			return
		}
		s.fail(j)
		return
	}
	if j.measured {
		s.outstanding--
		j.over = true
		ttft := (j.firstToken - j.arrive).Seconds()
		s.ttft = append(s.ttft, ttft)
		e := (now - j.arrive).Seconds()
		s.e2e = append(s.e2e, e)
		if g := s.split.group(j.req); g != nil {
			g.completed++
			g.ttft, g.e2e = append(g.ttft, ttft), append(g.e2e, e)
		}
		if j.req.Class != "" {
			s.classE2E[j.req.Class] = append(s.classE2E[j.req.Class], e)
		}
		s.lora.add(j.req, ttft, e, j.slotWait, j.slotWaited)
	}
	s.wl.Done(s, j.req, true)
}

// slotFound ends the wait for an adapter slot of a sequence the scheduler
// had skipped for want of one, if it had.
func (s *run) slotFound(q *seq) {
	if !q.slotHeld {
		return
	}
	q.slotHeld = false
	q.job.slotWait += s.now - q.slotSince
	q.job.slotWaited = true
}

// fail ends j for good: its caller got an error.
func (s *run) fail(j *job) {
	if j.measured {
		s.failed++
		s.outstanding--
		j.over = true
		if g := s.split.group(j.req); g != nil {
			g.failed++
		}
		s.tenants.failed(s, j.req)
	}
	s.wl.Done(s, j.req, false)
}

// notServedHops reports how many times j's router sends a call on after
// answers that a replica does not serve its model, when it reads them as
// the library's adapters do (notServedReader); false when it takes them
// for failures.
func (s *run) notServedHops(j *job) (int, bool) {
	nr, ok := s.routers[j.req.Client].(notServedReader)
	if !ok {
		return 0, false
	}
	return nr.notServedHops(), true
}

// windowHops reports how many hops j's router allows a call refused as
// longer than a replica's context window, when it reads the refusal as
// the library's adapters do (windowReader); 0 when it takes it for a
// failure.
func (s *run) windowHops(j *job) int {
	wr, ok := s.routers[j.req.Client].(windowReader)
	if !ok {
		return 0
	}
	return wr.windowHops()
}

// mayRetry reports whether a failed first attempt is tried again: a router
// that picks its retries itself (retryPicker) decides in PickRetry, which
// also spends the retry budget; the others ask AllowRetry.
func (s *run) mayRetry(j *job) bool {
	rt := s.routers[j.req.Client]
	if _, ok := rt.(retryPicker); ok {
		return j.rep != nil
	}
	return rt.AllowRetry()
}

// countTokens adds n tokens of j's produced now to the window's.
func (s *run) countTokens(j *job, n int64) {
	if g := s.split.group(j.req); g != nil {
		g.tokens += n
	}
}

// wasteTokens takes the n tokens an attempt of j produced in the window
// off the throughput: the attempt failed, and the client throws away
// what it streamed.
func (s *run) wasteTokens(j *job, n int64) {
	s.wasted += n
	if g := s.split.group(j.req); g != nil {
		g.wasted += n
	}
}

func (s *run) mark(i int) {
	c := counters{at: s.now, tokens: s.tokens}
	for _, r := range s.reps {
		c.busy = append(c.busy, r.busy)
		c.hits += r.hitTokens
		c.queries += r.queryTokens
		c.assigned = append(c.assigned, r.assigned)
		c.loads = append(c.loads, r.loads)
	}
	s.marks[i] = c
}

// scrape publishes one replica's metrics to every client, as a /metrics
// scrape does: the values are its gauges, as of the end of its last engine
// step (replica.snapshot), and grow stale until the next scrape. An
// Unscraped replica's reach no client.
func (s *run) scrape(r *replica) {
	if r.up {
		g := &r.gauges
		var smp telemetry.Sample
		smp.Time = Epoch.Add(s.now)
		smp.Set(telemetry.Running, float64(g.running))
		smp.Set(telemetry.Waiting, float64(g.waiting))
		smp.Set(telemetry.KVCacheUsage, g.kvUsage)
		if g.queries > 0 {
			smp.Set(telemetry.PrefixCacheHitRate, float64(g.hits)/float64(g.queries))
		}
		if r.p.MaxLoRAs > 0 {
			a := g.adapters
			if a == nil { // no step yet
				a = &telemetry.Adapters{Base: Model}
			}
			smp.SetAdapters(float64(r.p.MaxLoRAs), a)
		}
		g.hits, g.queries = 0, 0
		if !s.sc.Fleet[r.idx].Unscraped {
			for _, rt := range s.uniq {
				rt.Publish(r.idx, smp)
			}
		}
	}
	if !s.stopped || s.outstanding > 0 {
		s.after(s.cfg.Scrape, func() { s.scrape(r) })
	}
}

func (s *run) setMembers() {
	for _, rt := range s.uniq {
		rt.SetMembers(s.members)
	}
}

func (s *run) applyEvent(ev FleetEvent) {
	r := s.reps[ev.Replica]
	switch ev.Kind {
	case Crash:
		r.crash()
		s.after(s.sc.DiscoveryDelay, func() {
			if !r.up {
				s.members = removeInt(s.members, r.idx)
				s.setMembers()
			}
		})
	case Restart:
		r.restart()
		s.members = insertInt(s.members, r.idx)
		s.setMembers()
	case SlowDown:
		r.speed = r.baseSpeed() * ev.Factor
	case Recover:
		r.speed = r.baseSpeed()
	case ThrottleOn:
		r.throttle = true
	case ThrottleOff:
		r.throttle = false
	case ModelFail:
		r.failModel(ev.Model)
	case ModelRecover:
		r.recoverModel(ev.Model)
	case Hang:
		r.hang()
	default:
		panic(fmt.Sprintf("fleetsim: unknown event kind %d", ev.Kind))
	}
}

func removeInt(xs []int, x int) []int {
	out := make([]int, 0, len(xs))
	for _, v := range xs {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func insertInt(xs []int, x int) []int {
	out := make([]int, 0, len(xs)+1)
	done := false
	for _, v := range xs {
		if v == x {
			done = true
		}
		if !done && v > x {
			out = append(out, x)
			done = true
		}
		out = append(out, v)
	}
	if !done {
		out = append(out, x)
	}
	return out
}

func (s *run) loop() {
	limit := s.cfg.Duration + s.cfg.Drain
	for s.events.Len() > 0 {
		ev := heap.Pop(&s.events).(event)
		if ev.at > limit {
			s.now = limit
			return
		}
		s.now = ev.at
		ev.fn()
		if s.stopped && s.outstanding == 0 && s.now >= s.cfg.Duration {
			return
		}
	}
}
