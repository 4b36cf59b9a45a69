package fleetsim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inferlb/inferlb/balancer"
)

// ReplicaSpec is one replica of a fleet.
type ReplicaSpec struct {
	Server ServerParams
	// Speed multiplies step time: 1 is nominal, 3 is three times slower
	// (an older GPU, a noisy neighbour, thermal throttling).
	Speed float64
	// Weight is the capacity weight discovery advertises (0 = 1).
	Weight float64
	// DPGroup, when not 0, makes the replica one data-parallel rank of an
	// engine: replicas with the same DPGroup step together (see dpEngine).
	// Discovery labels them DPLabel=dp<group>.
	DPGroup int
	// Models lists the models the replica serves: the base model and the
	// LoRA adapters it has loaded. nil serves every model. A call for
	// another is answered at once that the model does not exist (vLLM's
	// 404), with no GPU work.
	Models []string
	// Unscraped withholds the replica's telemetry from every client, as
	// when its /metrics scrape fails or it exports none: clients route to
	// it on what they see of their own calls. Its scrapes still run (and
	// reset its windowed counters); only their publication is skipped.
	Unscraped bool
	// Unauthorized makes the replica answer every call 401 (a replica
	// started with the wrong API key, or behind a gateway without the
	// route) after unauthorizedDelay, with no GPU work: the caller gets
	// the 401 and does not retry it, as clients do not retry a 4xx.
	Unauthorized bool
	// RefusesTenants makes the replica answer 401, as Unauthorized does,
	// the calls of these tenants only (Request.Tenant): their API keys
	// are not provisioned on it yet, during a key rollout. It serves the
	// other tenants' calls.
	RefusesTenants []string
}

// DPLabel is the endpoint label the simulator gives data-parallel ranks:
// the engine they belong to, under the balancer's default label.
const DPLabel = balancer.DefaultDPGroupLabel

// EventKind is a fleet incident.
type EventKind uint8

// Fleet incidents a scenario can script.
const (
	Crash       EventKind = iota + 1 // fail everything in flight; cache lost
	Restart                          // come back cold and rejoin discovery
	SlowDown                         // step time x Factor
	Recover                          // back to normal speed
	ThrottleOn                       // answer 429 beyond MaxWaiting
	ThrottleOff                      // queue without limit again
	// ModelFail makes FleetEvent.Model fail on the replica while it serves
	// its other models, as a Triton model whose backend crashed or a LoRA
	// adapter whose weights are broken: its calls in flight fail, and
	// later ones are answered 500 within milliseconds, with no GPU work.
	ModelFail
	ModelRecover // FleetEvent.Model serves again on the replica
	// Hang stops the replica's engine while its API server stays up: it
	// accepts calls and answers none (a stream gets its headers, no
	// token), and its /metrics scrape keeps answering with the gauges
	// frozen as of the hang. A Crash (then a Restart) ends it, as a
	// liveness probe's restart does.
	Hang
)

// FleetEvent scripts an incident at a time after the start of the run.
type FleetEvent struct {
	At      time.Duration
	Replica int
	Kind    EventKind
	Factor  float64 // SlowDown
	Model   string  // ModelFail, ModelRecover
}

// Sim is what a workload sees of the simulator.
type Sim interface {
	// Now is the simulated time since the start.
	Now() time.Duration
	// After runs fn after d of simulated time.
	After(d time.Duration, fn func())
	// Submit sends a request now.
	Submit(req *Request)
	// Rand returns a deterministic generator for one named stream of the run's seed.
	Rand(stream uint64) *rand.Rand
	// Stopped reports whether the arrival window has closed.
	Stopped() bool
}

// Workload generates a scenario's requests. A new one is built for each run
// so every policy sees the same seeded arrivals.
type Workload interface {
	// Start schedules the first arrivals.
	Start(s Sim)
	// Done is called when a request has finished (ok) or failed for good,
	// so closed-loop workloads can send the next turn.
	Done(s Sim, req *Request, ok bool)
}

// Scenario is a fleet, a workload swept over offered loads, and the policies
// compared on it.
type Scenario struct {
	Name        string
	Description string
	Fleet       []ReplicaSpec
	// Workload builds the workload for one offered load.
	Workload func(rate float64) Workload
	// Rates are the offered loads swept, in RateUnit.
	Rates    []float64
	RateUnit string
	// Headline is the rate of the summary table (near saturation).
	Headline float64
	// Warmup is excluded from measurement; arrivals stop at Duration; the
	// run then drains for at most Drain, and calls still unfinished are
	// counted with their latency so far.
	Warmup, Duration, Drain time.Duration
	// Scrape is the telemetry scrape interval.
	Scrape time.Duration
	// Estimate is how far what clients tell their Balancers of a call's
	// size is from the truth (zero: exact); the command's -estimate-error
	// and -declared-output set it.
	Estimate Estimate
	// DiscoveryDelay is how long a crashed replica stays listed by service
	// discovery (readiness probes must fail first).
	DiscoveryDelay time.Duration
	Events         []FleetEvent
	Policies       []Policy
	// Clients lists the numbers of independent clients to compare; empty
	// means the command's -clients flag.
	Clients []int
	// ClientTimeout, when positive, is how long a caller waits for a call
	// (from its arrival, over its attempts) before it gives up: the call
	// is cancelled on its replica (context.Canceled, with
	// inferlb.Outcome.Unanswered when no token had come back) and fails
	// for good, with no retry.
	ClientTimeout time.Duration
	// Seeds, when more than 1, is how many seeds the command runs, from
	// its -seed flag on: a scenario whose figures vary from seed to seed
	// more than policies differ reports them all.
	Seeds int
}

// RunConfig is one run's settings.
type RunConfig struct {
	Rate                    float64
	Clients                 int
	Seed                    uint64
	Warmup, Duration, Drain time.Duration
	// Scrape is the telemetry scrape interval; 0 is the scenarios'
	// default, one second.
	Scrape time.Duration
	// Estimate: see Scenario.Estimate.
	Estimate Estimate
}

// Result is one run's measurements. Latencies are in seconds.
type Result struct {
	Scenario string  `json:"scenario"`
	Policy   string  `json:"policy"`
	Rate     float64 `json:"rate"`
	Clients  int     `json:"clients"`
	Seed     uint64  `json:"seed"`

	// Requests are the calls that arrived in the measurement window; the
	// next four count what became of them (Retries: how many further
	// attempts were sent: a failed call's retry, a call's hops past
	// replicas without its model).
	Requests   int `json:"requests"`
	Completed  int `json:"completed"`
	Failed     int `json:"failed"`
	Unfinished int `json:"unfinished"`
	Retries    int `json:"retries"`
	// NotServed counts the attempts of those calls that a replica
	// answered it does not serve the call's model.
	NotServed int `json:"not_served,omitempty"`
	// TooLong counts the attempts of those calls that a replica refused
	// as longer than its context window (ServerParams.MaxModelLen): round
	// trips wasted, each a few ms.
	TooLong int `json:"too_long,omitempty"`
	// Unauthorized counts the attempts of those calls that a replica
	// answered 401 (ReplicaSpec.Unauthorized, RefusesTenants): each is a
	// call failed.
	Unauthorized int `json:"unauthorized,omitempty"`
	// Tenants splits the measured calls between the tenants some replica
	// refuses (ReplicaSpec.RefusesTenants) and the others; nil when no
	// replica refuses a tenant.
	Tenants *TenantResult `json:"tenants,omitempty"`
	// Abandoned counts the failed calls whose callers gave up on them
	// at Scenario.ClientTimeout.
	Abandoned int `json:"abandoned,omitempty"`

	// Throughput is output tokens per second in the measurement window
	// (input tokens for embedding and rerank calls, which produce none),
	// not counting those of attempts that failed.
	Throughput float64 `json:"throughput_tok_s"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP90    float64 `json:"ttft_p90_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	ITLP50     float64 `json:"itl_p50_s"`
	ITLP99     float64 `json:"itl_p99_s"`
	E2EP50     float64 `json:"e2e_p50_s"`
	E2EP90     float64 `json:"e2e_p90_s"`
	E2EP99     float64 `json:"e2e_p99_s"`
	CacheHit   float64 `json:"cache_hit_rate"`
	GPUBusy    float64 `json:"gpu_busy"`
	MaxMean    float64 `json:"max_mean_load"`
	// Share is each replica's share, by index, of the calls the replicas
	// accepted into their queues in the window (MaxMean is the largest
	// times their number).
	Share []float64 `json:"share,omitempty"`
	// Preemptions counts KV-cache preemptions over the whole run.
	Preemptions int `json:"preemptions"`
	// ClassE2EP99 is the p99 end-to-end latency per request class.
	ClassE2EP99 map[string]float64 `json:"class_e2e_p99_s,omitempty"`

	// Healthy and Broken split the measured calls by model when the
	// scenario makes a model fail (ModelFail): Broken are those of the
	// models a ModelFail event names, Healthy those of the others. nil
	// otherwise.
	Healthy *ModelResult `json:"healthy,omitempty"`
	Broken  *ModelResult `json:"broken,omitempty"`
	// Balancer sums what the run's inferlb balancers counted (nil for
	// the other policies).
	Balancer *BalancerCounts `json:"balancer,omitempty"`
	// LoRA is what the replicas' adapter slots did to the measured calls,
	// when some replica limits them (ServerParams.MaxLoRAs); nil otherwise.
	LoRA *LoRAResult `json:"lora,omitempty"`
}

// ModelResult is what became of the measured calls of some models, as
// Result's fields of the same names are for all of them.
type ModelResult struct {
	Requests   int     `json:"requests"`
	Completed  int     `json:"completed"`
	Failed     int     `json:"failed"`
	Throughput float64 `json:"throughput_tok_s"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	E2EP99     float64 `json:"e2e_p99_s"`
	// Attempts counts the attempts of those calls sent to each replica,
	// by index: first tries, retries and hops alike.
	Attempts []int `json:"attempts"`
}

// TenantResult is what became of the measured calls of the tenants some
// replica refuses (ReplicaSpec.RefusesTenants) and of the other tenants'.
type TenantResult struct {
	// Refused: the calls of the tenants some replica refuses, and how
	// many of them failed (their callers got an error, a 401 or other).
	Refused       int `json:"refused_tenant_requests"`
	RefusedFailed int `json:"refused_tenant_failed"`
	// Others: the other tenants' calls, how many failed, and how many
	// of their attempts went to a replica that refuses some tenant (and
	// serves them): a policy that shuns that replica for everyone sends
	// it few.
	Others          int `json:"other_requests"`
	OthersFailed    int `json:"other_failed"`
	OthersOnRefuser int `json:"other_attempts_on_refuser"`
	// OthersAttempts counts the other tenants' attempts sent to each
	// replica, by index.
	OthersAttempts []int `json:"other_attempts"`
}

// BalancerCounts sums the endpoint statistics (balancer.EndpointStats)
// of a run's inferlb balancers at its end, over every client, and the
// events they emitted, warm-up included.
type BalancerCounts struct {
	Trips         uint64 `json:"trips"`          // breakers opened
	Ejections     uint64 `json:"ejections"`      // outlier ejections
	Capped        uint64 `json:"capped"`         // trips and ejections MaxEjectedFraction held off (EventCapped)
	Failures      uint64 `json:"failures"`       // failures held against their endpoint
	ModelFailures uint64 `json:"model_failures"` // failures held against their model on an endpoint
	ModelFailing  uint64 `json:"model_failing"`  // EventModelFailing: a model's picks made to pass an endpoint over
}

func (c *BalancerCounts) add(o BalancerCounts) {
	c.Trips += o.Trips
	c.Ejections += o.Ejections
	c.Capped += o.Capped
	c.Failures += o.Failures
	c.ModelFailures += o.ModelFailures
	c.ModelFailing += o.ModelFailing
}

// balancerCounter is a Router that reports its BalancerCounts.
type balancerCounter interface {
	balancerCounts() BalancerCounts
}

// Run simulates one policy on one scenario at one offered load. It is
// deterministic: the same arguments give the same Result.
func Run(sc *Scenario, pol Policy, cfg RunConfig) Result {
	if cfg.Clients <= 0 {
		cfg.Clients = 1
	}
	if cfg.Scrape <= 0 {
		// Scrapes rescheduled at the instant they run would hold virtual
		// time still for ever.
		cfg.Scrape = defaultScrape
	}
	s := &run{sc: sc, cfg: cfg, classE2E: map[string][]float64{}}
	for _, ev := range sc.Events {
		if ev.Kind == ModelFail {
			if s.split == nil {
				s.split = &modelSplit{broken: map[string]bool{}}
				for g := range s.split.g {
					s.split.g[g].attempts = make([]int, len(sc.Fleet))
				}
			}
			s.split.broken[ev.Model] = true
		}
	}
	if slices.ContainsFunc(sc.Fleet, func(r ReplicaSpec) bool { return r.Server.MaxLoRAs > 0 }) {
		s.lora = &loraStats{classes: map[string]*loraClass{}}
	}
	ids := make([]string, len(sc.Fleet))
	weights := make([]float64, len(sc.Fleet))
	labels := make([]map[string]string, len(sc.Fleet))
	models := make([][]string, len(sc.Fleet))
	engines := map[int]*dpEngine{}
	for i, spec := range sc.Fleet {
		ids[i] = fmt.Sprintf("r%d", i)
		weights[i] = spec.Weight
		if weights[i] <= 0 {
			weights[i] = 1
		}
		speed := spec.Speed
		if speed <= 0 {
			speed = 1
		}
		r := newReplica(i, ids[i], spec.Server, speed, s)
		r.models = spec.Models
		r.unauthorized = spec.Unauthorized
		r.refuses = spec.RefusesTenants
		if len(spec.RefusesTenants) > 0 && s.tenants == nil {
			s.tenants = &tenantStats{attempts: make([]int, len(sc.Fleet))}
		}
		models[i] = spec.Models
		if spec.DPGroup != 0 {
			e := engines[spec.DPGroup]
			if e == nil {
				e = &dpEngine{}
				engines[spec.DPGroup] = e
			}
			e.ranks = append(e.ranks, r)
			r.dp = e
			labels[i] = map[string]string{DPLabel: fmt.Sprintf("dp%d", spec.DPGroup)}
		}
		s.reps = append(s.reps, r)
		s.members = append(s.members, i)
	}
	if !pol.SeesRanks {
		for _, r := range s.reps {
			if e := r.dp; e != nil && e.front == nil {
				e.front = &dpFront{e: e, counts: make([][2]int, len(e.ranks))}
				s.at(0, func() { e.front.refresh(s) })
			}
		}
	}
	clock := Clock{now: &s.now}
	var shared Router
	for c := range cfg.Clients {
		var rt Router
		switch {
		case pol.Shared && shared != nil:
			rt = shared
		default:
			rt = pol.New(Env{
				Client: c, Seed: cfg.Seed*1000003 + uint64(c) + 1, Clock: clock,
				IDs: ids, Weights: weights, Labels: labels, Models: models, Estimate: cfg.Estimate, run: s,
			})
			if len(engines) > 0 && !pol.SeesRanks {
				rt = &engineFronted{Router: rt, s: s}
			}
			s.uniq = append(s.uniq, rt)
			if pol.Shared {
				shared = rt
			}
		}
		s.routers = append(s.routers, rt)
	}
	s.setMembers()
	for i, r := range s.reps {
		// Scrapes are phased across the interval, as independent targets are.
		r := r
		s.at(cfg.Scrape*time.Duration(i)/time.Duration(len(s.reps)), func() { s.scrape(r) })
	}
	for _, ev := range sc.Events {
		ev := ev
		s.at(ev.At, func() { s.applyEvent(ev) })
	}
	s.at(cfg.Warmup, func() { s.mark(0) })
	s.at(cfg.Duration, func() { s.mark(1); s.stopped = true })
	s.wl = sc.Workload(cfg.Rate)
	s.wl.Start(s)
	heap.Init(&s.events)
	s.loop()
	if s.marks[1].busy == nil { // ended early: nothing in flight
		s.mark(1)
	}
	return s.result(pol.Name)
}

func (s *run) result(policy string) Result {
	res := Result{
		Scenario: s.sc.Name, Policy: policy, Rate: s.cfg.Rate, Clients: s.cfg.Clients, Seed: s.cfg.Seed,
		Requests: s.requests, Failed: s.failed, Retries: s.retries, NotServed: s.notServed,
		TooLong: s.tooLong, Unauthorized: s.unauthorized, Abandoned: s.abandoned,
		Completed: len(s.e2e), Unfinished: s.outstanding,
	}
	// Calls still in flight at the end count with their latency so far: a
	// policy that leaves a backlog must not look good by leaving it out.
	if s.outstanding > 0 {
		s.censor()
	}
	a, b := s.marks[0], s.marks[1]
	window := (b.at - a.at).Seconds()
	if window > 0 {
		// An attempt can fail after the window closes, so its tokens are
		// taken off at the end of the run, not at the mark.
		res.Throughput = float64(b.tokens-a.tokens-s.wasted) / window
		var busy float64
		for i := range b.busy {
			busy += (b.busy[i] - a.busy[i]).Seconds()
		}
		res.GPUBusy = min(busy/window/float64(len(b.busy)), 1)
	}
	if q := b.queries - a.queries; q > 0 {
		res.CacheHit = float64(b.hits-a.hits) / float64(q)
	}
	maxA, sum := 0, 0
	for i := range b.assigned {
		d := b.assigned[i] - a.assigned[i]
		maxA = max(maxA, d)
		sum += d
	}
	if sum > 0 {
		res.MaxMean = float64(maxA) / (float64(sum) / float64(len(b.assigned)))
		res.Share = make([]float64, len(b.assigned))
		for i := range b.assigned {
			res.Share[i] = float64(b.assigned[i]-a.assigned[i]) / float64(sum)
		}
	}
	slices.Sort(s.ttft)
	slices.Sort(s.e2e)
	res.TTFTP50, res.TTFTP90, res.TTFTP99 = pct(s.ttft, 50), pct(s.ttft, 90), pct(s.ttft, 99)
	res.E2EP50, res.E2EP90, res.E2EP99 = pct(s.e2e, 50), pct(s.e2e, 90), pct(s.e2e, 99)
	res.ITLP50, res.ITLP99 = s.itl.quantile(0.50), s.itl.quantile(0.99)
	for _, r := range s.reps {
		res.Preemptions += r.preemptions
	}
	if sp := s.split; sp != nil {
		res.Healthy, res.Broken = sp.g[0].result(window), sp.g[1].result(window)
	}
	if t := s.tenants; t != nil {
		res.Tenants = &TenantResult{Refused: t.refused, RefusedFailed: t.refusedFailed,
			Others: t.others, OthersFailed: t.othersFailed, OthersAttempts: slices.Clone(t.attempts)}
		for i, n := range t.attempts {
			if len(s.reps[i].refuses) > 0 {
				res.Tenants.OthersOnRefuser += n
			}
		}
	}
	if s.lora != nil {
		res.LoRA = s.lora.result(a.loads, b.loads)
	}
	for _, rt := range s.uniq {
		if bc, ok := rt.(balancerCounter); ok {
			if res.Balancer == nil {
				res.Balancer = &BalancerCounts{}
			}
			res.Balancer.add(bc.balancerCounts())
		}
	}
	if len(s.classE2E) > 0 {
		res.ClassE2EP99 = map[string]float64{}
		for _, k := range slices.Sorted(mapsKeys(s.classE2E)) {
			v := s.classE2E[k]
			slices.Sort(v)
			res.ClassE2EP99[k] = pct(v, 99)
		}
	}
	return res
}

// censor adds the measured calls still in flight with their latency so far:
// those in a replica's queue or batch, and those between a replica's
// answer and the next attempt or waiting for an answer no GPU works on (a
// 404, a 400, a 500 within milliseconds), which are in no queue.
func (s *run) censor() {
	add := func(j *job, q *seq) {
		if !j.measured || j.over {
			return
		}
		j.over = true
		ttft := (s.now - j.arrive).Seconds()
		if j.firstToken >= 0 {
			ttft = (j.firstToken - j.arrive).Seconds()
		}
		s.ttft = append(s.ttft, ttft)
		e := (s.now - j.arrive).Seconds()
		s.e2e = append(s.e2e, e)
		if g := s.split.group(j.req); g != nil {
			g.ttft, g.e2e = append(g.ttft, ttft), append(g.e2e, e)
		}
		if j.req.Class != "" {
			s.classE2E[j.req.Class] = append(s.classE2E[j.req.Class], e)
		}
		wait, waited := j.slotWait, j.slotWaited
		if q != nil && q.slotHeld {
			wait += s.now - q.slotSince
			waited = true
		}
		s.lora.add(j.req, ttft, e, wait, waited)
	}
	for _, r := range s.reps {
		for _, q := range r.running {
			add(q.job, q)
		}
		for _, q := range r.waiting {
			add(q.job, q)
		}
	}
	for _, j := range s.live {
		add(j, nil)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// pct is the nearest-rank percentile of sorted xs, 0 for none (JSON has no NaN).
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(xs)))) - 1
	return xs[min(max(k, 0), len(xs)-1)]
}

// histogram is a log-scale histogram of durations with 1% wide buckets from
// 1µs, for the inter-token latency of millions of tokens.
type histogram struct {
	counts []int64
	n      int64
}

const histBase = 1.01

func (h *histogram) add(d time.Duration) {
	us := max(float64(d)/1e3, 1)
	k := int(math.Log(us) / math.Log(histBase))
	if k >= len(h.counts) {
		h.counts = append(h.counts, make([]int64, k-len(h.counts)+1)...)
	}
	h.counts[k]++
	h.n++
}

// quantile returns the upper edge of the bucket holding quantile q, in seconds.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0 // no decoding (pooling calls): not applicable
	}
	want := int64(math.Ceil(q * float64(h.n)))
	var acc int64
	for k, c := range h.counts {
		acc += c
		if acc >= want {
			return math.Pow(histBase, float64(k+1)) / 1e6
		}
	}
	return math.Pow(histBase, float64(len(h.counts))) / 1e6
}

// modelSplit keeps Result.Healthy and Result.Broken apart while a run
// goes; a nil *modelSplit keeps nothing.
type modelSplit struct {
	broken map[string]bool // the models a ModelFail event names
	g      [2]splitGroup   // healthy, broken
}

type splitGroup struct {
	requests, completed, failed int
	tokens, wasted              int64 // produced in the window; of them, by attempts that failed
	ttft, e2e                   []float64
	attempts                    []int
}

// group returns the group of req's model, nil when there is no split.
func (sp *modelSplit) group(req *Request) *splitGroup {
	if sp == nil {
		return nil
	}
	if sp.broken[req.Model] {
		return &sp.g[1]
	}
	return &sp.g[0]
}

func (g *splitGroup) result(window float64) *ModelResult {
	slices.Sort(g.ttft)
	slices.Sort(g.e2e)
	m := &ModelResult{
		Requests: g.requests, Completed: g.completed, Failed: g.failed,
		TTFTP50: pct(g.ttft, 50), TTFTP99: pct(g.ttft, 99), E2EP99: pct(g.e2e, 99),
		Attempts: slices.Clone(g.attempts),
	}
	if window > 0 {
		m.Throughput = float64(g.tokens-g.wasted) / window
	}
	return m
}

// tenantStats keeps Result.Tenants while a run goes; a nil *tenantStats
// keeps nothing.
type tenantStats struct {
	refused, refusedFailed int
	others, othersFailed   int
	attempts               []int // the other tenants' attempts, by replica
}

// isRefused reports whether some replica of the run refuses req's tenant.
func (s *run) isRefused(req *Request) bool {
	if req.Tenant == "" {
		return false
	}
	for _, r := range s.reps {
		if r.refusesTenant(req) {
			return true
		}
	}
	return false
}

// arrived counts a measured call.
func (t *tenantStats) arrived(s *run, req *Request) {
	if t == nil {
		return
	}
	if s.isRefused(req) {
		t.refused++
	} else {
		t.others++
	}
}

// failed counts a measured call failed for good.
func (t *tenantStats) failed(s *run, req *Request) {
	if t == nil {
		return
	}
	if s.isRefused(req) {
		t.refusedFailed++
	} else {
		t.othersFailed++
	}
}

// sent counts a measured call's attempt on replica idx.
func (t *tenantStats) sent(s *run, req *Request, idx int) {
	if t != nil && !s.isRefused(req) {
		t.attempts[idx]++
	}
}
