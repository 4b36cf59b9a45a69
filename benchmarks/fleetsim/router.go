package fleetsim

import (
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/telemetry"
)

// Router is one client's routing policy in the simulator. Baselines are
// implemented here; inferlb policies wrap the library's real Balancer.
type Router interface {
	// Pick chooses a replica index for req and returns the function that
	// reports how the call ended (called exactly once).
	Pick(req *Request) (replica int, done func(inferlb.Outcome), err error)
	// SetMembers replaces the replicas service discovery lists (ascending).
	SetMembers(replicas []int)
	// Publish delivers a telemetry scrape of one replica.
	Publish(replica int, s telemetry.Sample)
	// AllowRetry reports whether a failed call may be retried once.
	AllowRetry() bool
}

// retryPicker is a Router that picks a failed call's retry itself, as the
// library's adapters do (Balancer.PickRetry: another replica than the one
// that failed, within the retry budget), instead of AllowRetry and Pick.
type retryPicker interface {
	PickRetry(req *Request, failed int) (replica int, done func(inferlb.Outcome), err error)
}

// notServedReader is a Router that reads a replica's answer that it does
// not serve the call's model as the library's adapters do, rather than as
// a failure: the call goes on to another replica (with PickRetry) up to
// notServedHops times, and its caller gets the 404 when it cannot. The
// other routers take the answer for a failed call, which they retry once
// as they retry any failure (AllowRetry).
type notServedReader interface {
	notServedHops() int
}

// windowReader is a Router that reads a replica's refusal of a call
// longer than its context window as the library's adapters do, rather
// than as a failure: the attempt is reported with Outcome.ContextWindow
// and the call goes on (PickRetry) while windowHops allows (0: it reads
// the refusal as a failure, which it retries once as any). The other
// routers take it for a failure.
type windowReader interface {
	windowHops() int
}

// Env is what a policy's constructor gets.
type Env struct {
	Client  int
	Seed    uint64 // for the policy's own randomness; differs per client
	Clock   Clock
	IDs     []string            // replica IDs by index
	Weights []float64           // capacity weights by index (what discovery would say)
	Labels  []map[string]string // endpoint labels by index (nil: none)
	// Models are the models each replica serves (nil: all), which
	// discovery does not tell; only a Variant with ModelLabels reads it.
	Models [][]string
	// Estimate is what the clients' adapters know of each call's size
	// (RunConfig.Estimate); only the library's Balancer reads it.
	Estimate Estimate
	run      *run
}

// Estimate is how far what a client tells its Balancer of a call's size
// is from the truth. The zero value is the truth: the workload's prompt
// tokens and max_tokens, as the simulator's text tokenizes at exactly the
// HTTP transport's estimate of four characters a token, and its workloads
// declare max_tokens as the answer's length. Real text tokenizes at
// other ratios (code, other languages), and clients declare max_tokens
// far above the answer, or none.
type Estimate struct {
	// PromptError spreads the prompt tokens a Balancer is told over
	// [1-PromptError, 1+PromptError] times the true count, by a factor
	// fixed for each prompt's content (the same text, the same error).
	PromptError float64
	// OutputFactor multiplies the max_tokens a Balancer is told (0: as
	// declared).
	OutputFactor float64
}

// Rand returns a PCG source seeded for this policy instance.
func (e Env) Rand() *rand.PCG { return rand.NewPCG(e.Seed, 0x5eed0f90117c1e5) }

// Policy names a routing policy and builds its routers.
type Policy struct {
	Name string
	// Shared policies use one router for all clients; only the oracle,
	// which is a thought experiment rather than a library, is shared.
	Shared bool
	// SeesRanks policies see every data-parallel rank as an endpoint
	// (ReplicaSpec.DPGroup): inferlb, which reads their DPLabel, and the
	// oracle. The others see one endpoint per engine, whose front end
	// picks the rank as vLLM's does (dpFront).
	SeesRanks bool
	New       func(Env) Router
}

func noop(inferlb.Outcome) {}

// baseline holds what the simple policies share.
type baseline struct {
	members []int
	rng     *rand.Rand
}

func (b *baseline) SetMembers(m []int)            { b.members = slices.Clone(m) }
func (b *baseline) Publish(int, telemetry.Sample) {}
func (b *baseline) AllowRetry() bool              { return true }
func (b *baseline) pickRandom() (int, error) {
	if len(b.members) == 0 {
		return 0, balancer.ErrNoEndpoints
	}
	return b.members[b.rng.IntN(len(b.members))], nil
}

// RoundRobin cycles through the replicas; each client starts at a random
// offset, as independent processes do.
func RoundRobin() Policy {
	return Policy{Name: "round-robin", New: func(e Env) Router {
		r := &roundRobin{baseline: baseline{rng: rand.New(e.Rand())}}
		r.next = r.rng.Uint64()
		return r
	}}
}

type roundRobin struct {
	baseline
	next uint64
}

func (r *roundRobin) Pick(*Request) (int, func(inferlb.Outcome), error) {
	if len(r.members) == 0 {
		return 0, nil, balancer.ErrNoEndpoints
	}
	i := r.members[r.next%uint64(len(r.members))]
	r.next++
	return i, noop, nil
}

// Random picks a replica uniformly.
func Random() Policy {
	return Policy{Name: "random", New: func(e Env) Router {
		return &random{baseline{rng: rand.New(e.Rand())}}
	}}
}

type random struct{ baseline }

func (r *random) Pick(*Request) (int, func(inferlb.Outcome), error) {
	i, err := r.pickRandom()
	return i, noop, err
}

// LeastRequest samples two replicas and sends to the one with fewer of this
// client's requests in flight: Envoy's LEAST_REQUEST (choice_count 2) and
// grpc-go's least_request policy, the generic balancers users start from.
// As they do, it samples with replacement (both draws can name the same
// replica) and keeps the first draw on a tie.
func LeastRequest() Policy {
	return Policy{Name: "least-request", New: func(e Env) Router {
		return &leastRequest{baseline: baseline{rng: rand.New(e.Rand())}, inFlight: make([]int, len(e.IDs))}
	}}
}

type leastRequest struct {
	baseline
	inFlight []int
}

func (l *leastRequest) Pick(*Request) (int, func(inferlb.Outcome), error) {
	n := len(l.members)
	if n == 0 {
		return 0, nil, balancer.ErrNoEndpoints
	}
	i := l.members[l.rng.IntN(n)]
	if j := l.members[l.rng.IntN(n)]; l.inFlight[j] < l.inFlight[i] {
		i = j
	}
	l.inFlight[i]++
	return i, func(inferlb.Outcome) { l.inFlight[i]-- }, nil
}

// LeastConn sends to the replica with the fewest of this client's
// requests in flight, scanning them all (ties broken at random): NGINX's
// least_conn, HAProxy's leastconn, an AWS ALB's least outstanding
// requests. It is in no scenario's table; -extra least-conn adds it (see
// ExtraPolicies).
func LeastConn() Policy {
	return Policy{Name: "least-conn", New: func(e Env) Router {
		return &leastConn{baseline: baseline{rng: rand.New(e.Rand())}, inFlight: make([]int, len(e.IDs))}
	}}
}

type leastConn struct {
	baseline
	inFlight []int
}

func (l *leastConn) Pick(*Request) (int, func(inferlb.Outcome), error) {
	if len(l.members) == 0 {
		return 0, nil, balancer.ErrNoEndpoints
	}
	best, ties := -1, 0
	for _, i := range l.members {
		switch {
		case best < 0 || l.inFlight[i] < l.inFlight[best]:
			best, ties = i, 1
		case l.inFlight[i] == l.inFlight[best]:
			ties++
			if l.rng.IntN(ties) == 0 { // each of the ties alike
				best = i
			}
		}
	}
	l.inFlight[best]++
	return best, func(inferlb.Outcome) { l.inFlight[best]-- }, nil
}

// RingHashBounded is RingHash with a load bound (Mirrokni, Thorup and
// Zadimoghaddam, 2018) as Envoy's hash_balance_factor applies it (grpc-go
// has none): a key goes to its ring owner while the calls in flight there
// (this client's) are within its slots, max(ceil(ceil((total+1) x factor)
// / n), 1) for n replicas of equal weight and total calls in flight
// before this one; past them, to the first replica within its slots in
// an order of the replicas shuffled by the key's hash (so every client
// probes alike), and when none is, to the one with the fewest calls in
// flight, the owner on a tie. That is Envoy's BoundedLoadHashingLoadBalancer;
// it takes a host one call fuller than the paper's rule, which counts the
// new call against the bound. It is in no scenario's table; -extra
// consistent-hash-bounded adds it at factor 1.25, inferlb's LoadBound
// default (hash_balance_factor 125; see ExtraPolicies).
func RingHashBounded(factor float64) Policy {
	return Policy{Name: "consistent-hash-bounded", New: func(e Env) Router {
		return &boundedRing{ringHash: ringHash{baseline: baseline{rng: rand.New(e.Rand())}, ids: e.IDs}, factor: factor, inFlight: make([]int, len(e.IDs))}
	}}
}

type boundedRing struct {
	ringHash
	factor   float64
	inFlight []int
	total    int
	order    []int // scratch for the probe order
}

func (r *boundedRing) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	i, _, err := r.ringHash.Pick(req)
	if err != nil {
		return 0, nil, err
	}
	if req.AffinityKey != 0 {
		slots := max(int(math.Ceil(math.Ceil(float64(r.total+1)*r.factor)/float64(len(r.members)))), 1)
		if r.inFlight[i] > slots {
			i = r.probe(mix64(req.AffinityKey), i, slots)
		}
	}
	r.inFlight[i]++
	r.total++
	return i, func(inferlb.Outcome) { r.inFlight[i]--; r.total-- }, nil
}

// probe returns the first member other than owner within its slots, in
// an order shuffled by a generator seeded with the key's hash h; when
// none is, the member with the fewest calls in flight (owner on a tie).
func (r *boundedRing) probe(h uint64, owner, slots int) int {
	r.order = append(r.order[:0], r.members...)
	g := rand.New(rand.NewPCG(h, 0xb0a7d))
	best := owner
	for k := range r.order {
		j := k + g.IntN(len(r.order)-k)
		r.order[k], r.order[j] = r.order[j], r.order[k]
		m := r.order[k]
		if m == owner {
			continue
		}
		if r.inFlight[m] <= slots {
			return m
		}
		if r.inFlight[m] < r.inFlight[best] {
			best = m
		}
	}
	return best
}

// ExtraPolicies are baselines kept out of the scenarios' tables, which
// cmd/fleetsim's -extra adds to every scenario it runs: stronger
// counterparts of least-request (a full scan) and of consistent hashing
// (a load bound) than the defaults of grpc-go and Envoy the tables hold.
func ExtraPolicies() []Policy {
	return []Policy{LeastConn(), RingHashBounded(1.25)}
}

// RingHash places each affinity key on a consistent-hash ring (Karger et al.,
// 1997) sized as grpc-go's ring_hash sizes it by default (ringEntries) and
// with no load bound: every client agrees on the owner, and a hot key
// overloads it. Requests without a key go to a random replica.
func RingHash() Policy {
	return Policy{Name: "consistent-hash", New: func(e Env) Router {
		return &ringHash{baseline: baseline{rng: rand.New(e.Rand())}, ids: e.IDs}
	}}
}

type ringHash struct {
	baseline
	ids    []string
	points []ringPoint
}

type ringPoint struct {
	h   uint64
	rep int
}

// Ring sizes of grpc-go's ring_hash by default (min_ring_size and
// max_ring_size; Envoy's minimum is 1,024 too).
const (
	ringMinSize = 1024
	ringMaxSize = 4096
)

// ringEntries is how many points each of n replicas of equal weight has
// on the ring, as grpc-go's ring_hash places them: it scales the ring so
// that the lightest replica gets a whole number of points and the ring at
// least ringMinSize of them (at most ringMaxSize, which binds only past
// 3,072 replicas, where some would get none: this gives each one), and
// each replica its share of the scale. With equal weights that is
// ringMinSize/n rounded up: 128 points each for 8 replicas, 147 for 7.
// The baselines ignore discovery's weights, as ring_hash does without xDS
// endpoint weights.
func ringEntries(n int) int {
	if n <= 0 {
		return 0
	}
	return (ringMinSize + n - 1) / n
}

func (r *ringHash) SetMembers(m []int) {
	r.baseline.SetMembers(m)
	r.points = r.points[:0]
	per := ringEntries(len(m))
	for _, i := range m {
		base := stringHash(r.ids[i])
		for v := range per {
			r.points = append(r.points, ringPoint{mix64(base + uint64(v)), i})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return a.rep - b.rep
	})
}

func (r *ringHash) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	if len(r.points) == 0 {
		return 0, nil, balancer.ErrNoEndpoints
	}
	if req.AffinityKey == 0 {
		i, err := r.pickRandom()
		return i, noop, err
	}
	return r.points[r.at(mix64(req.AffinityKey))].rep, noop, nil
}

// at returns the index of the first point at or after h, round the ring.
func (r *ringHash) at(h uint64) int {
	k, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint64) int {
		switch {
		case p.h < h:
			return -1
		case p.h > h:
			return 1
		}
		return 0
	})
	if k == len(r.points) {
		k = 0
	}
	return k
}

func stringHash(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := range len(s) {
		h = (h ^ uint64(s[i])) * 0x100000001b3
	}
	return mix64(h)
}

// Variant describes an inferlb configuration: the real Balancer built from
// Options, plus what the client feeds it.
type Variant struct {
	Name string
	// Options returns the balancer options; the simulator sets Clock and Rand.
	Options func() balancer.Options
	// NoAffinity clears Request.AffinityKey before Pick: a client that
	// computes no keys.
	NoAffinity bool
	// NoTelemetry never publishes scrapes to the balancer: a client with no
	// telemetry source configured.
	NoTelemetry bool
	// ShedAsFailure reports a replica's shed answer (an overload answer
	// without a hint) as a failure: what the adapters made of the 503 with
	// which Triton, SGLang and Ollama shed load, and of their in-band
	// equivalents, before 2026-12-05.
	ShedAsFailure bool
	// NotServedAsSuccess reports a replica's answer that it does not
	// serve the call's model (vLLM's 404 "The model `x` does not
	// exist.") as a success, and does not send the call on: what the
	// adapters did before 2026-12-05, so the caller got the 404.
	NotServedAsSuccess bool
	// NotServedHops is how many times a call goes on to another replica
	// after such answers, each with PickRetry. 0 means 8, as the HTTP
	// transport does; its first version went on once.
	NotServedHops int
	// ModelLabels labels each endpoint with the models its replica
	// serves (the SubsetLabel, comma-separated), as a fleet that declares
	// its LoRA adapters to service discovery does: the balancer then
	// knows where each model is before any call.
	ModelLabels bool
	// NoOutcomeModel leaves Outcome.Model empty, as the adapters did
	// before 2026-12-05: every failure the server answered counts against
	// its endpoint, whatever model it was for.
	NoOutcomeModel bool
	// NoWindow reports a replica's refusal of a call longer than its
	// context window (Outcome.ContextWindow) as a failure (Outcome.Err)
	// and retries it once with PickRetry, as any failure: a client whose
	// adapter does not read the 400 and whose retry policy takes it for a
	// retriable error. The Balancer then learns no window, and counts the
	// refusals against the small replicas as failures.
	NoWindow bool
	// ClientErrorAsSuccess reports a replica's 401 (and any answer the
	// adapters read as inferlb.Outcome.ClientError) as a success, as the
	// adapters did before 2026-12-07: the replica's millisecond refusals
	// were its fastest calls, and it kept nothing in flight.
	ClientErrorAsSuccess bool
	// NoUnanswered never sets inferlb.Outcome.Unanswered on a call its
	// caller gave up on (Scenario.ClientTimeout), as the adapters did
	// before 2026-12-07: the balancer cannot tell a replica whose engine
	// hangs from callers that cancel.
	NoUnanswered bool
	// NoTenantMemory leaves inferlb.Outcome.Tenant empty, as the
	// simulator did before the balancer remembered which tenants' calls
	// an endpoint refuses: a refusal of one tenant's calls counts only
	// towards the endpoint's share of client errors.
	NoTenantMemory bool
}

// errShedAsFailure is the failure a ShedAsFailure variant reports.
var errShedAsFailure = errors.New("fleetsim: 503 (queue full), read as a failure")

// errTooLongAsFailure is the failure a NoWindow variant reports.
var errTooLongAsFailure = errors.New("fleetsim: 400 longer than the context window, read as a failure")

// InferLB is the library's real Balancer in the given configuration.
func InferLB(v Variant) Policy {
	return Policy{Name: v.Name, SeesRanks: true, New: func(e Env) Router {
		var o balancer.Options
		if v.Options != nil {
			o = v.Options()
		}
		o.Clock = e.Clock
		o.Rand = e.Rand()
		r := &inferlbRouter{v: v, ids: e.IDs, weights: e.Weights, byID: map[string]int{}, est: e.Estimate}
		onEvent := o.OnEvent
		o.OnEvent = func(ev balancer.Event) {
			r.event(ev)
			if onEvent != nil {
				onEvent(ev)
			}
		}
		if o.AffinitySeed == 0 {
			// The fleet's shared secret: independent clients must place
			// keys alike to agree on owners, and a random per-process seed
			// (the zero value) would also make runs irreproducible.
			o.AffinitySeed = KeyerSeed
		}
		labels := e.Labels
		if v.ModelLabels {
			labels = modelLabels(e.Labels, e.Models)
		}
		r.b, r.labels = balancer.New(o), labels
		for i, id := range e.IDs {
			r.byID[id] = i
		}
		return r
	}}
}

// modelLabels adds to labels, by replica, the default SubsetLabel listing
// the models the replica serves, when it serves only some.
func modelLabels(labels []map[string]string, models [][]string) []map[string]string {
	out := make([]map[string]string, len(labels))
	for i, l := range labels {
		if i >= len(models) || models[i] == nil {
			out[i] = l
			continue
		}
		out[i] = maps.Clone(l)
		if out[i] == nil {
			out[i] = map[string]string{}
		}
		out[i][balancer.DefaultSubsetLabel] = strings.Join(models[i], ",")
	}
	return out
}

type inferlbRouter struct {
	v       Variant
	b       *balancer.Balancer
	ids     []string
	weights []float64
	labels  []map[string]string
	byID    map[string]int // lookups only
	events  BalancerCounts // the counts of events (Capped, ModelFailing)
	est     Estimate       // how far the call sizes it is told are off
}

// event counts the balancer's events (Options.OnEvent).
func (r *inferlbRouter) event(ev balancer.Event) {
	switch ev.Kind {
	case balancer.EventCapped:
		r.events.Capped++
	case balancer.EventModelFailing:
		r.events.ModelFailing++
	}
}

// balancerCounts implements balancerCounter.
func (r *inferlbRouter) balancerCounts() BalancerCounts {
	c := r.events
	for _, st := range r.b.Stats() {
		c.Trips += st.Trips
		c.Ejections += st.Ejections
		c.Failures += st.Failures
		c.ModelFailures += st.ModelFailures
	}
	return c
}

func (r *inferlbRouter) SetMembers(m []int) {
	eps := make([]inferlb.Endpoint, 0, len(m))
	for _, i := range m {
		eps = append(eps, inferlb.Endpoint{ID: r.ids[i], Addr: r.ids[i], Weight: r.weights[i], Labels: r.labels[i]})
	}
	_ = r.b.Update(eps)
}

func (r *inferlbRouter) Publish(i int, s telemetry.Sample) {
	if !r.v.NoTelemetry {
		r.b.Publish(r.ids[i], s)
	}
}

func (r *inferlbRouter) AllowRetry() bool { return r.b.AllowRetry() }

func (r *inferlbRouter) notServedHops() int {
	switch {
	case r.v.NotServedAsSuccess:
		return 0
	case r.v.NotServedHops > 0:
		return r.v.NotServedHops
	}
	return transportNotServedHops
}

// windowHops implements windowReader: the HTTP transport sends a call
// refused as too long on as it sends one not served, within the same
// hops.
func (r *inferlbRouter) windowHops() int {
	if r.v.NoWindow {
		return 0
	}
	return transportNotServedHops
}

func (r *inferlbRouter) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	ir := r.request(req)
	return r.picked(r.b.Pick(&ir))
}

// picked returns a pick's replica and its Done.
func (r *inferlbRouter) picked(p balancer.Pick, err error) (int, func(inferlb.Outcome), error) {
	if err != nil {
		return 0, nil, err
	}
	held := &p
	if !r.v.ShedAsFailure && !r.v.NotServedAsSuccess && !r.v.NoOutcomeModel && !r.v.NoWindow && !r.v.ClientErrorAsSuccess && !r.v.NoUnanswered && !r.v.NoTenantMemory {
		return r.byID[p.ID()], held.Done, nil
	}
	return r.byID[p.ID()], func(o inferlb.Outcome) {
		switch {
		case r.v.ShedAsFailure && o.Overloaded:
			o = inferlb.Outcome{Err: errShedAsFailure}
		case r.v.NotServedAsSuccess && o.NotServedModel != "":
			o = inferlb.Outcome{}
		case r.v.NoWindow && o.ContextWindow > 0:
			o = inferlb.Outcome{Err: errTooLongAsFailure, Model: o.Model}
		case r.v.ClientErrorAsSuccess && o.ClientError:
			o = inferlb.Outcome{Model: o.Model}
		case r.v.NoOutcomeModel:
			o.Model = ""
		case r.v.NoUnanswered:
			o.Unanswered = false
		}
		if r.v.NoTenantMemory {
			o.Tenant = ""
		}
		held.Done(o)
	}, nil
}

// request is req as the client's adapter describes it. Its token counts
// are the true ones (the workload's prompt and max_tokens), as the HTTP
// transport makes them after a refusal as too long (the server's counts),
// unless the run's Estimate puts them off.
func (r *inferlbRouter) request(req *Request) inferlb.Request {
	ir := inferlb.Request{
		Service:         req.Service,
		Model:           req.Model,
		AffinityKey:     req.AffinityKey,
		PromptTokens:    req.Prompt.Tokens,
		MaxOutputTokens: req.MaxOutputTokens,
		Tenant:          req.Tenant,
	}
	if e := r.est.PromptError; e > 0 && req.Prompt.Tokens > 0 {
		u := float64(promptID(req.Prompt)>>11) / (1 << 53) // [0, 1), fixed per content
		ir.PromptTokens = max(int(math.Round(float64(req.Prompt.Tokens)*(1+e*(2*u-1)))), 1)
	}
	if f := r.est.OutputFactor; f > 0 {
		ir.MaxOutputTokens = int(math.Round(float64(req.MaxOutputTokens) * f))
	}
	if r.v.NoAffinity {
		ir.AffinityKey = 0
	}
	return ir
}

// PickRetry is the retry the HTTP Transport and the gRPC policy make: on
// another replica than the failed one, if the retry budget allows.
func (r *inferlbRouter) PickRetry(req *Request, failed int) (int, func(inferlb.Outcome), error) {
	ir := r.request(req)
	return r.picked(r.b.PickRetry(&ir, r.ids[failed]))
}

// Oracle is a reference, not a bound: one omniscient router that sees every
// replica's prefix cache, queue and batch exactly at the moment of each
// pick. It sends a request where its estimated end-to-end latency plus the
// cost it imposes on others is least: the prompt tokens the replica must
// compute (its cache miss), the prefill queued ahead of it, any wait for
// KV-cache blocks, the decode steps of its answer at that replica's batch
// size and speed, and the slowdown it adds to the batch it joins. The wait
// for blocks counts the blocks its prompt's miss and its answer, the
// prompts queued ahead of it and the rest of the running sequences'
// prompts and answers (to MaxOutputTokens) will allocate, against the free
// blocks less the cached ones that it and the queue will hit (an
// unreferenced cached block is free, as in vLLM, until a hit takes it). It
// knows every replica's context window and sends no call to one too small
// for it while another can take it, and sends none to a replica that
// answers 401 (ReplicaSpec.Unauthorized), nor a tenant's call to one that
// refuses that tenant's (ReplicaSpec.RefusesTenants).
func Oracle() Policy {
	return Policy{Name: "oracle", Shared: true, SeesRanks: true, New: func(e Env) Router {
		return &oracle{run: e.run}
	}}
}

type oracle struct {
	baseline
	run *run
	// mark and gen mark the free blocks one cost call has counted as hit
	// (blockPool.idleHits).
	mark []uint32
	gen  uint32
}

func (o *oracle) Pick(req *Request) (int, func(inferlb.Outcome), error) {
	best, bestCost := -1, 0.0
	fits := slices.ContainsFunc(o.members, func(i int) bool { return !o.run.reps[i].tooLong(req) })
	for _, i := range o.members {
		r := o.run.reps[i]
		if !r.up || r.unauthorized || r.refusesTenant(req) || (fits && r.tooLong(req)) {
			continue
		}
		c := o.cost(r, req)
		if best < 0 || c < bestCost {
			best, bestCost = i, c
		}
	}
	if best < 0 {
		return 0, nil, balancer.ErrNoEndpoints
	}
	return best, noop, nil
}

// idleHits is how many of r's free blocks req and the requests waiting on
// r would take out of the free queue by hitting them, each counted once.
func (o *oracle) idleHits(r *replica, req *Request) int {
	if n := len(r.kv.ref); len(o.mark) < n {
		o.mark = make([]uint32, n)
	}
	o.gen++
	if o.gen == 0 { // wrapped: old marks could match
		clear(o.mark)
		o.gen = 1
	}
	hit := func(hashes []uint64, tokens int) int {
		maxBlocks := (tokens - 1) / BlockSize // at least one token is computed
		return r.kv.idleHits(hashes[:min(len(hashes), maxBlocks)], o.mark, o.gen)
	}
	// They are free blocks: past r.kv.nFree of them, more change nothing.
	n := hit(req.Prompt.Hashes, req.Prompt.Tokens)
	for _, s := range r.waiting {
		if n >= r.kv.nFree {
			break
		}
		n += hit(s.hashes, s.numTokens())
	}
	return n
}

// queued is the mean number of requests waiting per replica.
func (o *oracle) queued() float64 {
	n := 0
	for _, r := range o.run.reps {
		n += len(r.waiting)
	}
	return float64(n) / float64(len(o.run.reps))
}

func (o *oracle) cost(r *replica, req *Request) float64 {
	p := r.p
	hit := 0
	if p.PrefixCaching {
		maxBlocks := (req.Prompt.Tokens - 1) / BlockSize
		hit = r.kv.contains(req.Prompt.Hashes[:min(len(req.Prompt.Hashes), maxBlocks)]) * BlockSize
	}
	miss := req.Prompt.Tokens - hit
	pend := r.pendingPrefill()
	prefill := float64(pend+miss) * p.PerPrefillToken.Seconds()
	// Every step the prefill spans also carries the running batch's decodes.
	batch := len(r.running) + len(r.waiting)
	steps := float64(pend+miss)/float64(p.MaxBatchedTokens) + 1
	ctx := 0
	for _, s := range r.running {
		ctx += s.computed
	}
	stepNow := p.StepFixed.Seconds() + float64(batch)*p.PerDecodeSeq.Seconds() + float64(ctx)*p.PerKVToken.Seconds()
	// Blocks this request, the queue ahead of it and the running batch need
	// beyond what is free wait for running sequences to finish (or preempt
	// them): price that as prefill-equivalent work, four times dearer than
	// compute. The running sequences still allocate blocks for the rest of
	// their prompts and answers; and the free pool counts cached blocks
	// nothing references, which leave it when this request or one queued
	// ahead hits them.
	need := (miss + req.MaxOutputTokens) / BlockSize
	for _, s := range r.waiting {
		need += (s.numTokens() - s.hitTokens) / BlockSize
	}
	for _, s := range r.running {
		last := s.prompt.Tokens + max(s.job.req.MaxOutputTokens, 1) - 1 // its last step computes up to here
		need += max((last+BlockSize-1)/BlockSize-len(s.blocks), 0)
	}
	free := r.kv.nFree
	if p.PrefixCaching {
		free -= o.idleHits(r, req)
	}
	kvWait := 0.0
	if deficit := need - free; deficit > 0 {
		kvWait = 4 * float64(deficit*BlockSize) * p.PerPrefillToken.Seconds()
	}
	// Own latency: the prefill queued ahead and its own, the decode steps
	// those span, any wait for blocks, then the answer's steps.
	out := float64(req.MaxOutputTokens)
	perSeq := p.PerDecodeSeq.Seconds() + float64(req.Prompt.Tokens+req.MaxOutputTokens/2)*p.PerKVToken.Seconds()
	own := prefill + steps*stepNow + kvWait + out*(stepNow+perSeq)
	// What it costs the others: its prefill stalls every sequence batched
	// with it, and each of its decode steps slows them; under overload the
	// miss is also capacity taken from every request queued in the fleet.
	missCost := float64(miss) * p.PerPrefillToken.Seconds()
	others := missCost*float64(batch) + out*perSeq*float64(batch) + missCost*o.queued()
	return r.speed * (own + others)
}
