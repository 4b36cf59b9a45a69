// Package balancer is inferlb's routing core: one power-of-two-choices (P2C)
// picker shared by the gRPC policy and the HTTP transport.
//
// P2C samples two distinct endpoints, weighted by capacity, and keeps the one
// with the lower cost from the request's scorer (Mitzenmacher, "The Power of
// Two Choices in Randomized Load Balancing", 2001; Azar, Broder, Karlin and
// Upfal, "Balanced Allocations", 1999): with n requests on n endpoints the
// most loaded endpoint holds ln ln n / ln 2 + O(1) of them instead of the
// ln n / ln ln n of a single random choice, without any shared state.
// Calls whose scorer prices only this process's view of an endpoint
// (scoring.FullScanner: embeddings and rerankers by default) compare every
// candidate instead, up to Options.ScanLimit: two random choices are what
// spreads callers that all read the same stale telemetry, and such a
// price has none.
//
// A Balancer owns durable per-endpoint state keyed by endpoint ID (in-flight
// calls and tokens, peak-EWMA latency, error rate, telemetry slot, standing).
// Update builds a new immutable snapshot and swaps it in atomically; the state
// of endpoints that stay is kept. Pick never blocks, locks or allocates.
// An endpoint that no membership lists any more leaves with its state
// (see Update), so a client whose fleet gets new pod addresses on every
// rollout holds state for its current endpoints only.
//
// A call its caller cancelled (Outcome.Canceled: a user's stop, a hedged
// call's loser, an abandoned agent step) counts as neither success nor
// failure and gives no latency sample. An embedding or rerank call
// cancelled while the endpoint had sent nothing back (Outcome.Unanswered)
// says the endpoint takes at least that wait: it raises the latency the
// scorer sees to the wait when it is longer, never lowering it, so a hung
// endpoint whose callers give up on its calls is not priced at its last
// answer again once they are all abandoned; while calls are out, a wait
// with none answered longer than the latency prices it too
// (scoring.State.Pending). A generation call's wait is no latency (a
// non-streamed one sends nothing until it is done, and users stop long
// ones), but one given up on with nothing back after waiting as long as
// the endpoint's generation answers take, none of them answered (nor the
// first token of a stream its caller then stopped; a stream still out
// tells nothing) from then on, counts towards a run that its
// next answer or failure ends (scoring.State.Abandoned): a replica whose
// engine hangs behind a live API server (its /metrics frozen but fresh)
// runs it up, and the LLM scorer prices two or more in a row while calls
// are out to it, and affinity passes it over as a key's owner meanwhile,
// so it takes one call at a time until one is answered.
//
// Adapters that share one Balancer each take a Membership: their own
// endpoint set, readiness and snapshot over the one shared state per ID.
// Close ends a Balancer: its endpoints leave it, giving back their slots in
// its telemetry Store, and every later pick fails with ErrClosed.
//
// An endpoint may serve several models, and some answers are about one
// model there, not the endpoint: that it does not serve the call's model
// (Outcome.NotServedModel), and a run of failures of one model while the
// endpoint serves others (Outcome.Model names the model of each call the
// server answered; EventModelFailing). Both are kept per endpoint and
// model, in tables of fixed size keyed by seeded hashes: that model's
// picks pass the endpoint over for a while, and the endpoint's breaker,
// error rate and ejection see none of it. So is a refusal of a call as
// longer than the endpoint's context window (Outcome.ContextWindow): the
// window is remembered per endpoint and model, and calls whose tokens do
// not fit it pass the endpoint over (window.go). A call for a LoRA adapter
// avoids the endpoints whose adapter slots are all taken by others, as
// their telemetry reports them (vLLM's --max-loras) brought up to now
// with this process's calls in flight per adapter; an adapter with few of
// the calls in flight on its model's endpoints goes to a home endpoint of its own
// rather than wherever its sessions' keys lead (Options.AdapterHomes;
// lora.go). An endpoint whose fresh telemetry says its server sleeps
// (telemetry.Asleep: vLLM's sleep mode, which reads as an idle server)
// takes no call while an awake one can: a full scan passes it over, its
// affinity keys spill, a two-choice draw that lands on it is made again,
// and when both candidates still sleep the group is searched for an awake
// member; with every endpoint asleep, calls still go to them, to wait for
// the wake-up, and so do a strict tenant shard's (TenantShardStrict) when
// all of it sleeps (sleep.go).
//
// Telemetry (load reports of the HTTP transport's load header and the
// gRPC policy's ORCA, a telemetry.Poller's scrapes) is read from the
// Store, and a field older than Options.TelemetryMaxAge is ignored. When
// an endpoint's failures hold it out of rotation (its breaker trips, or
// outlier detection ejects it), the load readings observed before are
// expired (telemetry.Store.Expire): what returns is often a restarted,
// idle process, which the old one's last report (a full KV cache, a long
// queue) would price out until it aged out, with no call going there to
// bring a new one. Readings observed since stay; an overload answer's
// cooldown expires nothing.
package balancer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// ErrNoEndpoints is returned by Pick when no endpoint can take the request:
// none is configured, none is ready, none serves the requested model, or all
// are excluded and panic routing is disabled.
var ErrNoEndpoints = errors.New("inferlb: no endpoint available")

// ErrTenantShardDown is returned by Pick, with TenantShardStrict set,
// when no endpoint of the request's tenant's shard can take it. It wraps
// ErrNoEndpoints.
var ErrTenantShardDown = fmt.Errorf("%w: no endpoint of the tenant's shard can take the call (TenantShardStrict)", ErrNoEndpoints)

// ErrModelNotListed is returned by Pick when the request names a model
// (inferlb.Request.Model) that no endpoint of the set lists, while some
// endpoints list models and none is unlabelled (an unlabelled endpoint
// takes any model): most often a typo in the model name, or a call sent to
// the wrong fleet, which waiting will not mend. A model that some endpoint
// lists, all of them out of rotation, gets plain ErrNoEndpoints. It wraps
// ErrNoEndpoints.
var ErrModelNotListed = fmt.Errorf("%w: no endpoint lists the requested model", ErrNoEndpoints)

// ErrClosed is returned by every pick of a closed Balancer (Close), its
// own and its Memberships', and by their Update and by NewMembership.
// It is not ErrNoEndpoints: that one says nothing can serve the request
// now, this one that the router is gone.
var ErrClosed = errors.New("inferlb: Balancer is closed")

// ErrNoRetryBudget is returned by PickRetry when another endpoint could
// take the retry but the retry budget allows none now (see AllowRetry).
var ErrNoRetryBudget = errors.New("inferlb: retry budget spent")

// drawTries bounds the rejection-sampling attempts per candidate before the
// picker falls back to a scan (only when most endpoints are unusable).
const drawTries = 8

// Balancer routes requests across a set of endpoints. It is safe for
// concurrent use; one Balancer may serve gRPC and HTTP traffic together so
// both see the same live load. Pick never locks.
type Balancer struct {
	// Concurrency: cfg is immutable. mu serializes membership changes
	// (Update, SetReady and those of every membership) and Close, and
	// guards eps, memberships, nextSerial and closed. Each membership's
	// snapshot, all, epoch and engines are atomic; Pick reads only them,
	// the atomics of endpoint state and the tables behind sticky, spills
	// and reuse (lock-free), so it never takes mu. Lock order on the way to
	// an ejection: an endpoint's brMu, its breaker's own mutex, then
	// ejectMu (or, as the breaker closes, the endpoint's mu: see
	// forgiveErrors); or outlierMu, then ejectMu. A telemetry slot's merge lock
	// (forgetLoad, after ejectMu is released) is taken last, and nothing
	// under it.

	cfg     *config
	keyer   *cache.Keyer    // immutable
	sticky  *cache.Sessions // immutable pointer; nil unless StickyTTL > 0
	spills  *cache.Sessions // immutable pointer; nil when SpillMemory or affinity is off
	reuse   *keyReuse       // immutable pointer; nil unless AffinityPrefer with MinKeyReuse
	engines atomic.Bool     // some endpoint is a rank of a data-parallel engine (dp.go)
	// shunnable counts the endpoints marked shunnable (markShunnable):
	// while it is 0, no pick reads a client-error share.
	shunnable atomic.Int32
	// unanswering counts the endpoints in a run of generation calls
	// abandoned with nothing back (markUnanswering): while it is 0, the
	// affinity bound reads no run.
	unanswering atomic.Int32
	// shunMu makes counting a pool's shunnable members and marking one
	// shunnable one step (see markShunnable); nothing is taken under it.
	shunMu sync.Mutex

	mu          sync.Mutex
	eps         map[string]*endpoint        // guarded by mu: every membership's endpoints, by ID
	memberships [maxMemberships]*Membership // guarded by mu: by index; [0] is def
	nextSerial  uint64                      // guarded by mu: the last serial handed out
	closed      bool                        // guarded by mu: Close has run

	def   *Membership                 // immutable: the membership of Update, SetReady and Pick
	all   atomic.Pointer[[]*endpoint] // eps as a slice, for outlier detection
	epoch atomic.Uint64               // bumped on any readiness or standing change

	// Models endpoints answered they do not serve (notserved.go), from
	// the first such answer, and the unix ns after which none is live.
	lack   atomic.Pointer[lackTable]
	lackAt atomic.Int64
	// The smallest context window remembered per model (window.go), and
	// when the latest of them expires (unix ns).
	windows      atomic.Pointer[map[uint64]window]
	windowsUntil atomic.Int64
	// Until when (unix ns) some endpoint remembers a window that found
	// the gate above full (see rememberWindow): retries read the
	// endpoints' own windows meanwhile.
	windowsSpilled atomic.Int64
	runs           atomic.Pointer[runTable] // runs of failures of a model on an endpoint (modelfail.go)
	// Tenants whose calls endpoints refused (tenantrefusal.go), from the
	// first such answer, and the unix ns after which no entry is live.
	refused   atomic.Pointer[refusalTable]
	refusedAt atomic.Int64
	// How many endpoints are in a row of overload answers (a shedStreak
	// not 0; see Balancer.cooldown): while none is, a served call's Done
	// reads this word, next to refusedAt, which it reads as well, and not
	// the endpoint's cache line of its row. An endpoint that leaves in a
	// row leaves it counted: the check is then made, and finds nothing.
	shedRows atomic.Int64

	adapters adapterCounts // this Balancer's calls in flight per LoRA adapter (lora.go)

	retry         *retryBudget
	retries       atomic.Uint64
	retriesDenied atomic.Uint64

	outlierMu   sync.Mutex   // one outlier evaluation at a time (TryLock)
	nextOutlier atomic.Int64 // unix ns of the next evaluation
	// Guarded by outlierMu: the evaluation's number, and its scratch (the
	// pools to judge, one pool's success rates), kept from one evaluation
	// to the next so that it allocates only when the fleet grows.
	outlierRound uint64
	outlierFrom  int64 // unix ns of the last evaluation: the start of the window judged next
	outlierPools []*group
	outlierRates []float64
	ejectMu      sync.Mutex // makes mayEject and marking the endpoint out one step; see mayEject

	// beforeBrMu, when set (by internal tests only, before any call),
	// runs in report just before it takes an endpoint's brMu: the point
	// where a racing report can overtake it.
	beforeBrMu func()
	// shedCounted, when set (by internal tests only, before any call),
	// runs in countShed between counting a refusal in its row and setting
	// the probation that follows: the point where a served call's Done
	// (shedServed) can end the row first.
	shedCounted func()

	// onDone, for tests only (testhook.SetOnDone): called at the end of
	// every effective Done. nil in production: one atomic load a Done.
	onDone atomic.Pointer[func(endpointID string)]
	// onChange, for tests only (testhook.SetOnChange): called after every
	// SetReady or SetReconnected of a listed endpoint and after every
	// Publish. nil in production: one atomic load each.
	onChange atomic.Pointer[func(endpointID string)]
	// tenantLooks, for tests only (testhook.SetTenantLooks): the count
	// the tenants' refusals memory takes when it is allocated
	// (refusalTable.looks). nil in production, and read only then.
	tenantLooks atomic.Pointer[atomic.Int64]
	// fitCounts, for tests only (testhook.SetFitCounts): counts the fit
	// views picks read, and those summed anew (fitView.of). nil in
	// production: one atomic load a pick that reads a fit view.
	fitCounts atomic.Pointer[testhook.FitCounts]
}

func init() {
	testhook.SetOnDone = func(b any, f func(endpointID string)) {
		if f == nil {
			b.(*Balancer).onDone.Store(nil)
			return
		}
		b.(*Balancer).onDone.Store(&f)
	}
	testhook.SetOnChange = func(b any, f func(endpointID string)) {
		if f == nil {
			b.(*Balancer).onChange.Store(nil)
			return
		}
		b.(*Balancer).onChange.Store(&f)
	}
	testhook.SetTenantLooks = func(b any, n *atomic.Int64) {
		if b.(*Balancer).refused.Load() != nil {
			panic("testhook.SetTenantLooks after the tenants' refusals memory was allocated")
		}
		b.(*Balancer).tenantLooks.Store(n)
	}
	testhook.SetFitCounts = func(b any, n *testhook.FitCounts) {
		b.(*Balancer).fitCounts.Store(n)
	}
}

// changed calls the test hook onChange, if any, for endpoint id.
func (b *Balancer) changed(id string) {
	if f := b.onChange.Load(); f != nil {
		(*f)(id)
	}
}

// snapshot is the immutable picker state built by Update.
type snapshot struct {
	all      *group
	byModel  map[string]*group // nil when no endpoint carries the subset label
	anyModel *group            // unlabelled endpoints, for models nobody lists; may be nil
	closed   bool              // the Balancer is closed (all is empty)
}

// none is the error of a pick that found no group, or an empty one, in s.
// A closed Balancer's snapshots are empty, so a pick learns it is closed
// here, from the snapshot it loaded anyway, and only on its way to fail:
// a pick that finds endpoints checks nothing more.
func (s *snapshot) none() error {
	if s.closed {
		return ErrClosed
	}
	return ErrNoEndpoints
}

func (s *snapshot) groupFor(model string) *group {
	if model == "" || s.byModel == nil {
		return s.all
	}
	if g, ok := s.byModel[model]; ok {
		return g
	}
	return s.anyModel
}

// New returns a Balancer with no endpoints. It panics if opts fail Validate,
// which is a programming error; configuration parsers validate first.
func New(opts Options) *Balancer {
	cfg, err := opts.resolve()
	if err != nil {
		panic(err)
	}
	b := &Balancer{
		cfg:   cfg,
		keyer: cache.NewKeyer(cfg.affinitySeed),
		eps:   map[string]*endpoint{},
		retry: newRetryBudget(cfg.retryRatio, cfg.retryFloor),
	}
	b.adapters.seed = mix64(b.keyer.Seed() ^ 0xa0a0a0a0a0a0a0a0)
	b.def = newMembership(b, 0)
	b.memberships[0] = b.def
	if cfg.stickyTTL > 0 {
		s, err := cache.NewSessions(cache.SessionOptions{TTL: cfg.stickyTTL, MaxEntries: cfg.stickyEntries, Clock: cfg.clock})
		if err != nil {
			panic(err) // Validate checked the fields it depends on
		}
		b.sticky = s
	}
	if cfg.minKeyReuse > 0 && cfg.affinity == AffinityPrefer {
		b.reuse = newKeyReuse(b.keyer)
	}
	if cfg.spillTTL > 0 && cfg.affinity != AffinityOff {
		// The table's own TTL only bounds how long an entry holds its slot;
		// warmFor compares the stored time, as Get refreshes the TTL.
		s, err := cache.NewSessions(cache.SessionOptions{TTL: cfg.spillTTL, MaxEntries: SpillEntries, Clock: cfg.clock})
		if err != nil {
			panic(err) // constant, valid options
		}
		b.spills = s
	}
	return b
}

// Keyer returns the affinity Keyer that shares the balancer's AffinitySeed;
// adapters compute Request.AffinityKey with it (prompt prefixes, sessions).
func (b *Balancer) Keyer() *cache.Keyer { return b.keyer }

// Telemetry returns the Store the balancer reads samples from.
func (b *Balancer) Telemetry() *telemetry.Store { return b.cfg.store }

// TelemetryMaxAge returns the age past which the balancer ignores a
// telemetry field: Options.TelemetryMaxAge with its default applied, or 0
// when it keeps every field whatever its age (a negative
// Options.TelemetryMaxAge). Adapters that share a Balancer check their
// report intervals against it, and it makes the Balancer a
// telemetry.AgingSink: a telemetry.Poller publishing into it reports
// samples that arrive older than this (StaleSamplesError).
func (b *Balancer) TelemetryMaxAge() time.Duration { return b.cfg.telemetryMaxAge }

// Publish records a telemetry sample for an endpoint; the Balancer is a
// telemetry.Sink. Adapters call it with per-call load reports, and a
// telemetry.Poller can publish into it. A sample for an ID that is not one
// of the Balancer's endpoints (or another's on a shared Store) is dropped
// and counted in Telemetry().Stats().DroppedUnknown: the Store keeps slots
// only for endpoints someone routes to (a telemetry.Poller asks Known of
// each ID it publishes, and reports the unknown ones through its OnError).
// A sample with no time (Sample.Time
// zero) or no usable field is dropped and counted in DroppedEmpty: stamp
// samples with the Balancer's clock (a telemetry.Poller stamps those its
// Source left at zero).
//
// A sample stamped later than the Balancer's clock reads (another machine's
// clock running ahead) is taken as observed now, as a telemetry.Poller takes
// one: at its own time it would win over every fresher reading for as long
// as that clock is ahead, and would not go stale.
//
// A sample already older than TelemetryMaxAge when it arrives (a reading
// from a Prometheus server that scrapes less often than that) is kept but
// never read, and counted in ArrivedStale, not Accepted
// (telemetry.Store.PublishKnownWithin).
func (b *Balancer) Publish(endpointID string, s telemetry.Sample) {
	now := time.Unix(0, b.cfg.nowNs())
	if s.Time.After(now) {
		s.Time = now
	}
	b.cfg.store.PublishKnownWithin(endpointID, s, now, b.cfg.telemetryMaxAge)
	b.changed(endpointID)
}

// Known reports whether Publish keeps samples for endpointID: whether it
// is the key (Endpoint.Key) of an endpoint with a slot in the Balancer's
// telemetry Store (one of the Balancer's endpoints, or another's on a
// shared Store). The Balancer is a telemetry.KnownSink: a telemetry.Poller
// asks it of each ID it publishes and reports the unknown ones through its
// OnError (telemetry.UnknownEndpointsError). It never allocates or locks.
func (b *Balancer) Known(endpointID string) bool { return b.cfg.store.Known(endpointID) }

// KnownIDs returns up to n of the Balancer's endpoint IDs (Endpoint.Key,
// across its memberships), sorted: what a telemetry.Poller names in an
// UnknownEndpointsError as the IDs its targets should carry. It takes the
// Balancer's mutex and allocates.
func (b *Balancer) KnownIDs(n int) []string {
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	ids := make([]string, 0, len(b.eps))
	for id := range b.eps {
		ids = append(ids, id)
	}
	b.mu.Unlock()
	slices.Sort(ids)
	return ids[:min(n, len(ids)):min(n, len(ids))]
}

// Expired is its Store's Expired: a telemetry.Poller publishing into the
// Balancer scrapes again early after the Balancer or its transport drops an
// endpoint's readings (telemetry.Store.Expire: a failure exclusion, a gRPC
// reconnect), instead of leaving the endpoint without them until its next
// Interval.
func (b *Balancer) Expired() <-chan struct{} { return b.cfg.store.Expired() }

var (
	_ telemetry.Sink           = (*Balancer)(nil)
	_ telemetry.KnownSink      = (*Balancer)(nil)
	_ telemetry.AgingSink      = (*Balancer)(nil)
	_ telemetry.ExpiryNotifier = (*Balancer)(nil)
)

// Update replaces the endpoint set. Endpoints are matched to existing state by
// Key (ID, else Addr): the load, latency, error and standing of endpoints that
// stay are kept; new endpoints start fresh and, once the balancer has served
// a non-empty set, ramp up through slow start (so do those that a Membership's
// first Update adds next to endpoints another membership already serves).
//
// Entries with neither ID nor Addr, and later duplicates of an ID, are skipped;
// a negative or non-finite Weight is read as 1, and one above MaxWeight as
// MaxWeight. Every such problem is reported in the returned error, and the
// rest of the set is applied. A Weight of 0 is no problem: it means 1.
//
// Update sets the Balancer's own membership, which Pick routes over; an
// adapter sharing the Balancer with others sets its own through a Membership,
// which this call does not touch.
//
// An endpoint that leaves every membership leaves the Balancer with its
// state: Stats no longer lists it, its telemetry slot is released (a Store
// shared with other Balancers keeps the slots they hold), and its calls
// still out leave the load its former peers share, ending on its own state.
// What its answers taught (models it does not serve, context windows, a
// model's failures, tenants it refused) and the sessions and spills that
// name it stay in fixed-size tables, keyed by its Serial, until they lapse
// or are evicted: they never grow with churn and never apply to another
// endpoint. An ID added back is a new endpoint, with a new Serial and clean
// state.
func (b *Balancer) Update(endpoints []inferlb.Endpoint) error {
	return b.def.Update(endpoints)
}

// Closed reports whether Close has run. It takes no lock: an adapter
// asks it to fail calls that would otherwise wait for endpoints a closed
// Balancer will never give (a wait-for-ready gRPC call while no
// connection is up).
func (b *Balancer) Closed() bool { return b.def.snap.Load().closed }

// Close ends the Balancer. Its endpoints leave it, as with Update(nil)
// and every Membership's Close, so it lets go of their slots in its
// telemetry Store (a Store shared with other Balancers keeps the slots
// they hold); from then on every pick, the Balancer's own and its open
// Memberships', fails with ErrClosed, and so do Update, a Membership's
// Update and NewMembership. Calls picked before end normally: their Done
// releases their load and feeds the endpoint's statistics, which Stats
// no longer lists. Close is idempotent and safe for concurrent use with
// every other method; it takes the lock membership changes take, never
// a pick's path.
//
// Close a Balancer whose Store outlives it (Options.Telemetry) when you
// drop it; one with a private Store needs no Close, but may have one.
// The adapters close a Balancer they made themselves
// (httpbalancer.Transport.Close, the gRPC policy's), never one they were
// given.
func (b *Balancer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	closed := &snapshot{all: newGroup(nil, nil, new(atomic.Int64), 0), closed: true}
	for i, m := range b.memberships {
		if m == nil {
			continue
		}
		// Readiness is left as it is: a pick racing Close on the
		// snapshot it loaded before picks as it would have a moment
		// earlier, where with its endpoints marked not ready it would
		// fail with ErrNoEndpoints, not ErrClosed.
		m.members, m.infos, m.listed, m.groupsOf, m.poolsOf = nil, nil, nil, nil, nil
		m.closed = true
		m.snap.Store(closed)
		if m != b.def {
			b.memberships[i] = nil
		}
	}
	b.reconcile() // no endpoint is left: each releases its slot
	b.epoch.Add(1)
}

// models returns the model names an endpoint serves, from the subset label.
func (b *Balancer) models(info *inferlb.Endpoint) []string {
	v := info.Labels[b.cfg.subsetLabel]
	var out []string
	var seen map[string]bool // past a few names: a label listing hundreds of adapters
	for m := range strings.SplitSeq(v, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if seen == nil && len(out) >= 8 {
			seen = make(map[string]bool, 2*len(out))
			for _, o := range out {
				seen[o] = true
			}
		}
		if seen != nil {
			if seen[m] {
				continue
			}
			seen[m] = true
		} else if slices.Contains(out, m) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// build makes the snapshot of m's members, weighted and labelled as m
// describes them, and records in m.groupsOf the durable in-flight
// counters of the groups each member now belongs to that keep one
// (countedGroup; reconcile moves the endpoints' counts onto them), and in
// m.poolsOf the groups each counts against MaxEjectedFraction (see
// mayEject). Called with mu held.
func (b *Balancer) build(m *Membership) *snapshot {
	used := map[string]bool{}
	counter := func(key string) *atomic.Int64 {
		used[key] = true
		c, ok := m.loads[key]
		if !ok {
			c = new(atomic.Int64)
			m.loads[key] = c
		}
		return c
	}
	mkGroup := func(key string, idx []int) *group {
		ms := make([]*endpoint, len(idx))
		w := make([]float64, len(idx))
		for k, i := range idx {
			ms[k], w[k] = m.members[i], m.infos[i].Capacity()
		}
		var load *atomic.Int64 // a small model group sums its members' (countedGroup)
		if key == "" || len(idx) > countedGroup {
			load = counter(key)
		}
		g := newGroup(ms, w, load, m.bit)
		g.horizon = b.cfg.horizon
		// The ring places affinity keys and tenants' shards: tenant
		// sharding needs it with affinity off too.
		if b.cfg.affinity != AffinityOff || b.cfg.tenantShard > 0 {
			g.placement = cache.NewPlacement(placementMembers(ms, w), b.cfg.affinitySeed)
			if b.sticky != nil {
				g.indexHashes()
			}
		}
		return g
	}

	// Groups of the same members are one group: a fleet whose every
	// endpoint lists a base model and its LoRA adapters (hundreds of
	// names in the label) would otherwise build a ring and keep a load
	// counter per name, each counting every call on its members, so that
	// a pick and its Done cost a counter per model listed (25 us a call
	// with 2,000) and an Update a ring per model. A group holds nothing
	// of its model's own: its ring, load and cached standing are its
	// members', and the same for every model they serve.
	//
	// A set is named by its members' serials, 8 bytes each: IDs joined by
	// a separator named different sets alike when an ID held it ("a\x00b"
	// alone and "a" with "b"), and the one's model went to the other's.
	sets := map[string]*group{}
	var sig []byte
	shared := func(key string, idx []int) *group {
		sig = sig[:0]
		for _, i := range idx {
			sig = binary.LittleEndian.AppendUint64(sig, m.members[i].serial)
		}
		if g, ok := sets[string(sig)]; ok {
			return g
		}
		if key != "" {
			key = "set:" + string(sig) // the counter follows the set, whatever models it serves
		}
		g := mkGroup(key, idx)
		sets[string(sig)] = g
		return g
	}
	every := make([]int, len(m.members))
	for i := range every {
		every[i] = i
	}
	snap := &snapshot{all: shared("", every)}
	byModel := map[string][]int{}
	var unlabelled []int
	var names []string
	for i := range m.members {
		ms := b.models(m.infos[i])
		if len(ms) == 0 {
			unlabelled = append(unlabelled, i)
			continue
		}
		for _, m := range ms {
			if _, ok := byModel[m]; !ok {
				names = append(names, m)
			}
			byModel[m] = append(byModel[m], i)
		}
	}
	groupsOf := make(map[*endpoint][]*atomic.Int64, len(m.members))
	poolsOf := make(map[*endpoint][]*group, len(m.members))
	for _, e := range m.members {
		groupsOf[e] = []*atomic.Int64{snap.all.load}
	}
	if len(names) > 0 {
		snap.byModel = make(map[string]*group, len(names))
		joined := map[*group]bool{}
		join := func(g *group) { // once per group, however many models it serves
			if joined[g] {
				return
			}
			joined[g] = true
			for _, e := range g.members {
				if g.load != nil && g != snap.all { // the whole group's counter is every member's already
					groupsOf[e] = append(groupsOf[e], g.load)
				}
				poolsOf[e] = append(poolsOf[e], g)
			}
		}
		for _, m := range names {
			g := shared("model", append(byModel[m], unlabelled...))
			snap.byModel[m] = g
			join(g)
		}
		if len(unlabelled) > 0 {
			snap.anyModel = shared("unlabelled", unlabelled)
			join(snap.anyModel)
		}
	} else {
		for _, e := range m.members {
			poolsOf[e] = []*group{snap.all}
		}
	}
	m.groupsOf, m.poolsOf = groupsOf, poolsOf
	for k := range m.loads {
		if !used[k] {
			delete(m.loads, k)
		}
	}
	return snap
}

// reconcile makes eps and all the union of every membership's members (the
// state of an endpoint no membership lists any more is dropped), finds the
// data-parallel engines among them and moves each endpoint's in-flight
// count onto the counters of the groups it now belongs to, in every
// membership. Called with mu held after a membership change.
func (b *Balancer) reconcile() {
	eps := make(map[string]*endpoint, len(b.eps))
	var all []*endpoint
	for _, m := range b.memberships {
		if m == nil {
			continue
		}
		for _, e := range m.members {
			if _, ok := eps[e.id]; !ok {
				eps[e.id] = e
				all = append(all, e)
			}
		}
	}
	for id, e := range b.eps {
		if _, ok := eps[id]; ok {
			continue
		}
		// Gone from every membership: it is in no pool (a call still out
		// to it may trip its breaker, which holds nothing out), and its
		// telemetry slot goes too (unless another Balancer on a shared
		// Store holds it), so endpoint churn cannot fill the Store.
		// Without a slot (the Store was full) it held none, so it
		// releases none: the slot another Balancer took since is that
		// one's. Its calls still in flight leave the groups' load
		// counters too: they are no member's to share, and counted there
		// they widened every remaining member's affinity bound until
		// they ended (a replica drained by a rolling deploy streams for
		// minutes). Their Done counts on the empty set. Their outcomes
		// are its own: the ID added back is a new endpoint, whose
		// events and telemetry its breaker's trip must not touch.
		e.gone.Store(true)
		e.pools.Store(nil)
		b.markShunnable(e, false, 0) // it holds no pool's room
		b.markUnanswering(e, false)  // nor is its run counted
		setGroupLoads(e, nil)
		if s := e.slot.Load(); s != nil {
			b.cfg.store.ReleaseSlot(id, s)
		}
	}
	for _, e := range all {
		if e.slot.Load() == nil {
			// It found the Store full when it joined. Room may have
			// been made since (by the endpoints released above, or by
			// another Balancer on a shared Store): it tries again at
			// each membership change, where it costs a Hold per
			// endpoint still without a slot, and never on a pick.
			if s := b.cfg.store.Hold(e.id); s != nil {
				e.slot.Store(s)
			}
		}
	}
	b.eps = eps
	b.setEngines()
	for _, e := range all {
		var loads []*atomic.Int64
		var pools []*group
		for _, m := range b.memberships {
			if m != nil {
				loads = append(loads, m.groupsOf[e]...)
				pools = append(pools, m.poolsOf[e]...)
			}
		}
		setGroupLoads(e, loads)
		e.pools.Store(&pools)
	}
	b.all.Store(&all)
}

// setGroupLoads points e at new group counters, moving its calls counted
// on counters it leaves to counters it joins. Called with mu held.
//
// The count moved is the old set's own (see loadSet), sealed in the same
// atomic step that reads it, not e's in-flight count: a pick or Done racing
// with the move counts either before the seal, and is moved, or after it,
// on the new set, so no call is lost or counted twice. (Moving the in-flight
// count left one call on a counter for good each time a pick or Done fell
// between reading it and publishing the new counters.)
func setGroupLoads(e *endpoint, next []*atomic.Int64) {
	old := e.groupLoads.Load()
	if slices.Equal(old.counters, next) {
		return
	}
	ls := &loadSet{counters: next}
	e.groupLoads.Store(ls) // before the seal: a call that finds it sealed retries here
	n := old.calls.Or(1) >> 1
	ls.calls.Add(2 * n)
	for _, c := range old.counters {
		if !slices.Contains(next, c) {
			c.Add(-n)
		}
	}
	for _, c := range next {
		if !slices.Contains(old.counters, c) {
			c.Add(n)
		}
	}
}

// countLoad adds delta calls to the counters of the groups e belongs to.
func (e *endpoint) countLoad(delta int64) {
	for {
		ls := e.groupLoads.Load()
		if ls.calls.Add(2*delta)&1 != 0 {
			// Sealed: setGroupLoads has moved this set's calls to the
			// next one, which it published first; count there.
			ls.calls.Add(-2 * delta)
			continue
		}
		for _, c := range ls.counters {
			c.Add(delta)
		}
		return
	}
}

// SetReady marks an endpoint ready or not (gRPC: its subchannel is READY).
// Endpoints start ready. A not-ready endpoint is never picked, even in panic
// routing; one that turns ready again ramps up through slow start. It
// reports whether id is an endpoint of the Balancer's own membership
// (Update); a Membership has its own readiness (Membership.SetReady).
func (b *Balancer) SetReady(id string, ready bool) bool {
	return b.def.SetReady(id, ready)
}

// Serial returns the serial number of the current endpoint id (see
// Pick.Serial), and false when id is not a current endpoint.
func (b *Balancer) Serial(id string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.eps[id]; ok {
		return e.serial, true
	}
	return 0, false
}

// Now returns the balancer's clock reading, for adapters that stamp
// telemetry (ORCA, load headers) on the same clock the scorers compare with.
func (b *Balancer) Now() time.Time { return b.cfg.clock.Now() }

func (b *Balancer) rand() uint64 { return b.cfg.rand.Uint64() }

// Pick chooses an endpoint for req. It never blocks, locks or allocates. The
// caller must call Done on the returned Pick exactly once when the call ends
// (later calls are no-ops). It returns ErrNoEndpoints when nothing can serve req.
// req must not be nil (the zero Request is a call that names nothing); the
// Pick methods below read it the same way.
func (b *Balancer) Pick(req *inferlb.Request) (Pick, error) {
	return b.pick(b.def, req, "")
}

// PickExcept is Pick for a failover: it never returns the endpoint whose ID
// is exclude (the one that just failed), and returns ErrNoEndpoints when no
// other endpoint can serve req, counting as unable those remembered not to
// serve req's model or too small for its tokens (a first pick goes ahead
// to them when nothing else is left; a failover would only fetch that
// answer again). The affinity key still steers it: the key's next endpoint
// in preference order takes the retry.
func (b *Balancer) PickExcept(req *inferlb.Request, exclude string) (Pick, error) {
	return b.pick(b.def, req, exclude)
}

// PickRetry is PickExcept for a failover under the retry budget: when an
// endpoint other than failed can serve req, it spends one retry
// (AllowRetry) and picks that endpoint, or returns ErrNoRetryBudget when
// the budget allows none; when none can, it returns ErrNoEndpoints and
// spends nothing. A failover with nowhere to go (a fleet of one, or every
// other endpoint out of rotation, which is when the budget matters) so
// leaves the budget, and RetryStats, to retries that happen. Nor does a
// retry go to an endpoint remembered not to serve req's model
// (Outcome.NotServedModel): it would only get that answer again.
func (b *Balancer) PickRetry(req *inferlb.Request, failed string) (Pick, error) {
	return b.pickWith(b.def, req, failed, false, pickBudget|pickRefused)
}

// PickNotServedRetry is PickRetry for a call whose attempt at failed was
// answered that the endpoint does not serve req's model
// (Outcome.NotServedModel): a hop to look for an endpoint that has it. Hops draw the retry budget only down to a reserve
// kept for failover (PickRetry): a model name is request data, and calls
// for made-up names, which go round the fleet, spent the whole budget, so
// that failover of real calls got no retry for some 10 s.
func (b *Balancer) PickNotServedRetry(req *inferlb.Request, failed string) (Pick, error) {
	return b.pickWith(b.def, req, failed, false, pickBudget|pickRefused|pickHop)
}

func (b *Balancer) pick(m *Membership, req *inferlb.Request, exclude string) (Pick, error) {
	if exclude != "" { // a failover (PickExcept)
		return b.pickWith(m, req, exclude, false, pickRefused)
	}
	return b.pickWith(m, req, "", true, 0)
}

// pickMode says how a failover's pickWith differs from a first pick.
type pickMode uint8

const (
	// pickBudget: an endpoint found is taken only if AllowRetry allows.
	pickBudget pickMode = 1 << iota
	// pickRefused: when every candidate is remembered not to serve the
	// call's model, or too small for its tokens, or to refuse its
	// tenant's calls (within MaxEjectedFraction), there is none
	// (ErrNoEndpoints); a first pick goes ahead instead (the memory may be
	// stale, and the server's answer is the caller's).
	pickRefused
	// pickHop: with pickBudget, the retry is a hop past a "not served"
	// answer, which leaves failover a reserve of the budget (withdraw).
	pickHop
)

// passOverFilters sets c up to pass over the members the call would only
// be refused by, as remembered: those that do not serve its model
// (lacking), those too small for its tokens (windowFilter) and those that
// refuse its tenant's calls (tenantMarks), in that order, each among the
// members the ones before it leave. A filter that finds every member left
// so gives way: a first pick goes ahead (the memory may be stale, the
// request's tokens are an estimate, and the server's answer is the
// caller's), while with refused (a retry's or a failover's pick) it
// reports true: the pick has nowhere to go, and a retry would only fetch
// the same answer again, on the retry budget.
//
// The order decides only where a call goes when no member escapes every
// filter: the one that gives way is the latest that finds every member
// left. The window filter runs after the not-served memory: a member
// that serves the model may take a call whose tokens, a first pick's
// estimate, are over its window, and if not its answer (too long) is the
// call's true one; a member without the model takes it at no length, and
// its answer says the fleet has no such model. Tried the other way
// round, with the members serving the model remembered too small, the
// window filter sent every call to a member without it: those the model's
// members would have served (an estimate over the window) were answered
// "not found", 50 of 50 (TestNotServedAndContextWindowTogether). It runs
// before the tenant memory: that one counted members too small for a long
// call as others for the tenant's calls to go to, passed over the only
// members that fit it, and the window filter, finding every member left
// too small, gave way, so the call went where it was sure to be refused
// as too long (TestTenantRefusalAndContextWindowTogether). The fit view
// (fitView) reads the filters as set here, whichever gave way; a strict
// tenant shard whose members they all pass over lets them give way in
// the same order (pickWith).
func (b *Balancer) passOverFilters(req *inferlb.Request, g *group, c *cand, refused bool) (none bool) {
	if req.Model != "" && b.lackAt.Load() > c.nowNs {
		if b.lacking(req.Model, g, c) && refused {
			return true
		}
	}
	if b.windowFilter(req, g, c, refused) && refused {
		return true
	}
	if req.Tenant != "" && b.refusedAt.Load() > c.nowNs {
		if b.tenantMarks(req.Tenant, g, c) && refused {
			return true
		}
	}
	return false
}

// pickWith is pick; observe says whether the pick is a call's first (its
// affinity key counts as seen and it earns retry budget), not a failover,
// which is the same call again; mode how a failover differs.
func (b *Balancer) pickWith(m *Membership, req *inferlb.Request, exclude string, observe bool, mode pickMode) (Pick, error) {
	retry := mode&pickBudget != 0
	refused := mode&pickRefused != 0
	snap := m.snap.Load()
	if snap == nil {
		return Pick{}, ErrNoEndpoints
	}
	g := snap.groupFor(req.Model)
	if g == nil || len(g.members) == 0 {
		if req.Model != "" && snap.byModel != nil && len(snap.all.members) > 0 {
			return Pick{}, ErrModelNotListed
		}
		return Pick{}, snap.none()
	}
	nowNs, monoNs := b.cfg.readNs()
	now := time.Unix(0, nowNs)
	st := g.eligibility(b.cfg, b.epoch.Load(), nowNs)
	if st.ready == 0 {
		return Pick{}, ErrNoEndpoints
	}
	panicking := b.cfg.panicThreshold > 0 && float64(st.good) < b.cfg.panicThreshold*float64(st.ready)
	if !panicking && st.good == 0 {
		return Pick{}, ErrNoEndpoints
	}
	c := cand{nowNs: nowNs, monoNs: monoNs, bit: m.bit, panicking: panicking, exclude: exclude, failover: !observe,
		affine: req.AffinityKey != 0 && b.cfg.affinity != AffinityOff, key: req.AffinityKey,
		steer: !panicking && st.settled > 0 && st.settled < st.good}
	if st.leadFrom != 0 {
		c.lead = st.lead(b.cfg, nowNs)
	}
	if b.passOverFilters(req, g, &c, refused) {
		return Pick{}, ErrNoEndpoints
	}
	if c.filtered() {
		var fit fitView // read only by the affinity bound (see fitView)
		c.fit = &fit
	}
	c.slots = req.Model != "" && b.slotAware(req.Service) && b.slotsLive(nowNs)
	c.sleep = b.sleepLive(nowNs)
	if c.affine && b.reuse != nil && !req.Session {
		// An explicit session sticks whatever prompt keys do.
		rc := b.reuse.class(req.Tenant)
		if observe {
			b.reuse.observe(req.AffinityKey, rc)
		}
		c.affine = b.reuse.recurring(rc, b.cfg.minKeyReuse)
	}
	homed := false
	var ownKey uint64 // the call's own key and affinity while homed (see baseAt)
	var ownAffine bool
	if c.slots && b.cfg.adapterHomes > 0 && !req.Session && b.cfg.affinity != AffinityOff {
		if k := b.adapterHome(req, g, nowNs); k != 0 {
			ownKey, ownAffine = c.key, c.affine
			c.key, c.affine, homed = k, true, true // a rarely asked adapter goes to its home (lora.go)
		}
	}
	// chooseOwn is choose, from the group or sh, with rc (c or a copy of
	// it) for a pick that may be homed: a member chosen by the adapter's
	// home that does not read the call as an adapter's (baseAt) is chosen
	// again with the call's own key, for this and every later choose of
	// the pick. Every choose of a homed pick goes through it: the
	// shard's second tries (its cooling members, a strict shard's first
	// pick past the memory) sent another base model's calls, all of them,
	// to one home when the shard's first choose found nothing.
	chooseOwn := func(rc cand, sh *shard) (int, keyUse) {
		i, keyed := b.choose(req, g, now, rc, sh)
		if homed && i >= 0 && b.baseAt(g.members[i], req.Model, nowNs) {
			c.key, c.affine, homed = ownKey, ownAffine, false // see baseAt
			rc.key, rc.affine = ownKey, ownAffine
			i, keyed = b.choose(req, g, now, rc, sh)
		}
		return i, keyed
	}
	if b.cfg.tenantShard > 0 && req.Tenant != "" {
		var sh shard
		if b.tenantShard(req, g, &sh) {
			if retry {
				if err := b.spendRetry(g, c, &sh, mode&pickHop != 0); err != nil {
					return Pick{}, err
				}
				retry = false // spent
			}
			i, keyed := -1, keyUse(0)
			if c.panicking && sh.calm(b.cfg, g, c.bit, c.nowNs) {
				// The group is in panic routing but the shard is not:
				// the calls of the group's other tenants, which made
				// the panic (a flood cooling its own shard), never come
				// here, so its members in good standing take its
				// calls, as they would the group's. In panic they
				// sent half of them to another tenant's flooded,
				// cooling members. A shard in panic itself spreads
				// over its ready members, as the group does. Out of
				// panic, members on probation are second choice to
				// settled ones, as in the group (cand.steer), which
				// the group's panic had turned off.
				rc := c
				rc.panicking = false
				rc.steer = st.settled > 0 && st.settled < st.good
				i, keyed = chooseOwn(rc, &sh)
			}
			if i < 0 {
				i, keyed = chooseOwn(c, &sh)
			}
			if i < 0 && !c.panicking && b.cfg.panicThreshold > 0 {
				// The shard may be only cooling down after overload
				// answers, which a tenant's own flood causes: spread over
				// the group, the flood cooled every other tenant's shard
				// in turn. Its calls stay on the shard's cooling members,
				// as panic routing would send them (no probes, so
				// acquire sees them out of standing); a shard that is
				// down (breakers, ejections, not ready) goes to the group.
				rc := c
				rc.panicking, rc.coolingOnly = true, true
				i, keyed = chooseOwn(rc, &sh)
			}
			if i < 0 && b.cfg.tenantStrict && !refused && c.filtered() {
				// The group's memory passed over every member of the
				// shard (not serving the model, too small for the
				// call, refusing its tenant) for members outside it,
				// where a strict call cannot go. The shard is not
				// down: as when the whole group is remembered so, a
				// first pick goes ahead (the memory may be stale, the
				// server's answer is the caller's); it failed with
				// ErrTenantShardDown for the whole memory without
				// trying a server. The filters give way one at a
				// time, the latest first, as in the group (see
				// passOverFilters): cleared all at once, they sent a
				// long call as often to a member without its model as
				// to one with it, too small by the call's estimate.
				rc := c
				rc.fit = nil // read by the group's bound, not the shard's
				for give := range 3 {
					if !rc.giveWay(give) {
						continue // no such filter: nothing new to choose from
					}
					sh.shared = false // its share left the members passed over out
					rc.panicking, rc.coolingOnly = c.panicking, false
					rc.key, rc.affine = c.key, c.affine // the call's own, should a choose have found a base reader
					if i, keyed = chooseOwn(rc, &sh); i < 0 && !rc.panicking && b.cfg.panicThreshold > 0 {
						rc.panicking, rc.coolingOnly = true, true
						i, keyed = chooseOwn(rc, &sh)
					}
					if i >= 0 {
						break
					}
				}
			}
			if i >= 0 && c.sleep && !b.cfg.tenantStrict && g.members[i].asleep(c.nowNs, b.cfg.telemetryMaxAge) {
				// Only sleeping members of the shard could take it
				// (sleep.go): an awake endpoint of the group takes it,
				// as when nothing in the shard can; with the group
				// asleep too, the shard's. (A group's choose that finds
				// every member asleep records no spill.)
				if j, kj := chooseOwn(c, nil); j >= 0 && !g.members[j].asleep(c.nowNs, b.cfg.telemetryMaxAge) {
					i, keyed = j, kj
				}
			}
			if i >= 0 {
				c.keyed = keyed&keyChose != 0 && !homed // a home holds the adapter, not the prompt's prefix
				c.pastShunned = keyed&keyPastShunned != 0
				return b.acquire(g.members[i], req, c), nil
			}
			if b.cfg.tenantStrict {
				return Pick{}, ErrTenantShardDown
			}
			// Nothing in the shard can take it: the whole group, below.
		}
	}
	if retry {
		if err := b.spendRetry(g, c, nil, mode&pickHop != 0); err != nil {
			return Pick{}, err
		}
	}
	i, keyed := chooseOwn(c, nil)
	if i < 0 && !refused && c.filtered() {
		// The filters found a member for the call when they looked
		// (passOverFilters), and choose, looking again, none: the members
		// changed in between, on other goroutines (the members the
		// memory left tripped, or the memory came to pass over the last
		// of them). The filters give way as they would have had they
		// seen it, one at a time, the latest first; the pick failed with
		// ErrNoEndpoints, where one a moment earlier or later goes to a
		// member (TestMemoryGivesWayWhenTheMembersChangeDuringThePick;
		// TestModelFailuresUnderConcurrency lost a pick of its 16,000 in
		// about 1 run in 2,500).
		rc := c
		var fit fitView // the view without the members the filters left pass over
		for give := range 3 {
			if !rc.giveWay(give) {
				continue
			}
			fit, rc.fit = fitView{}, nil
			if rc.filtered() {
				rc.fit = &fit
			}
			rc.key, rc.affine = c.key, c.affine // the call's own, should a choose have found a base reader
			if i, keyed = chooseOwn(rc, nil); i >= 0 {
				c.lack, c.windowNeed, c.promptNeed, c.refused = rc.lack, rc.windowNeed, rc.promptNeed, rc.refused // as given way (acquire)
				break
			}
		}
	}
	if i < 0 {
		// With a retry spent, the last candidate spendRetry found left
		// in between: rare, and the retry is not refunded.
		return Pick{}, ErrNoEndpoints
	}
	c.keyed = keyed&keyChose != 0 && !homed
	c.pastShunned = keyed&keyPastShunned != 0
	return b.acquire(g.members[i], req, c), nil
}

// spendRetry is a retry's budget check, made before choose: choosing
// records where a key spilled (the sticky session, the spill memory, the
// spill counts), and a retry the budget denied sends no call there. It
// returns ErrNoEndpoints, spending nothing, when no member can take the
// retry (draw, which records nothing, finds none; nor, with a tenant's
// shard sh, among the shard's cooling members, where pickWith sends a
// shard's calls when they are all cooling down; with TenantShardStrict,
// only in the shard, and then ErrTenantShardDown), ErrNoRetryBudget when
// the budget denies it, and nil once it is spent. hop: see pickHop.
func (b *Balancer) spendRetry(g *group, c cand, sh *shard, hop bool) error {
	// A strict tenant's calls never leave its shard: an endpoint outside
	// it that could take the retry is none of this retry's, and a shard
	// that is down (a poison tenant's) would drain the budget every other
	// tenant's failovers share with retries that all fail.
	strict := sh != nil && b.cfg.tenantStrict
	var found bool
	if strict {
		found = b.draw(g, c, sh, -1) >= 0
	} else {
		found = b.draw(g, c, nil, -1) >= 0
	}
	if !found && sh != nil && !c.panicking && b.cfg.panicThreshold > 0 {
		rc := c
		rc.panicking, rc.coolingOnly = true, true
		found = b.draw(g, rc, sh, -1) >= 0
	}
	if !found {
		if strict {
			return ErrTenantShardDown
		}
		return ErrNoEndpoints
	}
	if !b.allowRetry(hop) {
		return ErrNoRetryBudget
	}
	return nil
}

// PickAt picks the endpoint whose serial (Pick.Serial) is given when it can
// take req (it serves req's model, is ready and in good standing, or the
// group is in panic; with TenantShardStrict, it is in req's tenant's
// shard), whatever its load, and otherwise picks as Pick does.
// It is for calls that must reach the endpoint holding their state, such
// as a Responses API follow-up whose server keeps the stored conversation
// in memory; when that endpoint is gone they go wherever they can.
func (b *Balancer) PickAt(req *inferlb.Request, serial uint64) (Pick, error) {
	return b.pickAt(b.def, req, serial)
}

func (b *Balancer) pickAt(m *Membership, req *inferlb.Request, serial uint64) (Pick, error) {
	if g := m.snap.Load().groupFor(req.Model); g != nil {
		if i, ok := g.bySerial[serial]; ok && b.inStrictShard(req, g, int(i)) {
			nowNs, monoNs := b.cfg.readNs()
			st := g.eligibility(b.cfg, b.epoch.Load(), nowNs)
			panicking := b.cfg.panicThreshold > 0 && float64(st.good) < b.cfg.panicThreshold*float64(st.ready)
			// keyed: the call's state, its prefix among it, is cached there.
			c := cand{nowNs: nowNs, monoNs: monoNs, bit: m.bit, panicking: panicking, keyed: true}
			// Its adapter takes a slot there as any call's does (lora.go).
			c.slots = req.Model != "" && b.slotAware(req.Service) && b.slotsLive(nowNs)
			if e := g.members[i]; c.ok(e) {
				if req.AffinityKey != 0 && b.reuse != nil && !req.Session {
					b.reuse.observe(req.AffinityKey, b.reuse.class(req.Tenant))
				}
				return b.acquire(e, req, c), nil
			}
		}
	}
	return b.pick(m, req, "")
}

// inStrictShard reports whether member i of g may take req under
// TenantShardStrict: always without it, else when i is in req's tenant's
// shard. The serial PickAt is given comes from the caller (a Responses
// API follow-up names the response it continues, which may have been made
// outside this tenant's shard: another tenant's, or before the shard
// moved), and a strict shard keeps every call of its tenant in it.
func (b *Balancer) inStrictShard(req *inferlb.Request, g *group, i int) bool {
	if !b.cfg.tenantStrict {
		return true
	}
	var sh shard
	return !b.tenantShard(req, g, &sh) || sh.has(i)
}

// choose picks a member for req from the group, or from a tenant's shard
// of it when sh is not nil: the affinity key's endpoint when the key has
// one within bound, else the cheapest member for a FullScanner's call
// (scan), else the cheaper of two draws (P2C); -1 when nothing can take
// req.
func (b *Balancer) choose(req *inferlb.Request, g *group, now time.Time, c cand, sh *shard) (i int, keyed keyUse) {
	if c.affine && g.placement != nil {
		var i int
		var past bool
		if c.steer {
			i, past = b.pickSteered(req, g, now, c, sh) // out of line
		} else {
			i, past = b.pickAffine(req, g, now, c, sh)
		}
		if i >= 0 {
			if past {
				return i, keyChose | keyPastShunned
			}
			return i, keyChose
		}
	}
	if !c.slots {
		if b.cfg.fullScan[svcIndex(req.Service)] && len(g.members) > 2 {
			if i := b.scan(req, g, c, sh, now); i >= 0 {
				return i, 0
			}
			// Every candidate was turned down by its slow-start ramp's
			// draw: two choices, whose draws fall back to a scan.
		}
		if !c.sleep {
			i = b.draw(g, c, sh, -1)
			if i < 0 || len(g.members) == 1 {
				return i, 0
			}
			if j := b.draw(g, c, sh, i); j >= 0 && b.prefer(req, g, i, j, now, c.steer) {
				return j, 0
			}
			return i, 0
		}
	}
	i, fi := b.drawFit(req, g, c, sh, -1)
	if i < 0 || len(g.members) == 1 {
		return i, 0
	}
	j, fj := b.drawFit(req, g, c, sh, i)
	if fi && (j < 0 || fj) && c.sleep &&
		(g.members[i].asleep(c.nowNs, b.cfg.telemetryMaxAge) || j >= 0 && g.members[j].asleep(c.nowNs, b.cfg.telemetryMaxAge)) {
		// Neither candidate can serve now, and a sleeping one would hold
		// the call until its wake-up: with most of the group asleep the
		// redraws find sleepers too (sleep.go).
		if k := b.fitScan(req, g, c, sh, now); k >= 0 {
			return k, 0
		}
	}
	switch {
	case j < 0:
	case fi != fj: // one cannot serve req now (its LoRA slots are full, it sleeps): the other (lora.go, sleep.go)
		if fi {
			return j, 0
		}
	case b.prefer(req, g, i, j, now, c.steer):
		return j, 0
	}
	return i, 0
}

// keyUse says how a pick's affinity key chose its endpoint (choose).
type keyUse uint8

const (
	// keyChose: the key chose the endpoint (its prefix is likely cached
	// there).
	keyChose keyUse = 1 << iota
	// keyPastShunned: on its way, the key's walk passed over a member for
	// its client errors (its owner or sticky endpoint, shunnedOnWalk).
	keyPastShunned
)

// cand is what decides whether a member may be a candidate for one pick.
type cand struct {
	nowNs   int64
	monoNs  int64  // the clock's monotonic reading with nowNs (config.readNs)
	bit     uint64 // the picking membership's readiness bit
	exclude string // an endpoint ID to skip (failover); "" for none
	// With lack set, the members remembered not to serve the request's
	// model are passed over (see lacking).
	lack *lackTable
	// keep: with lack, the model's entry is not kept yet; the pick's
	// endpoint serving the call keeps it (pickKeep, keepModel).
	keep bool
	// model is the request's model key (Balancer.modelKey) when lack or
	// windowNeed is set.
	model     uint64
	panicking bool
	failover  bool // the pick is another attempt of a call already picked once
	affine    bool // key steers the pick (see keyReuse)
	keyed     bool // set by pick: the key chose the endpoint (its prefix is likely cached there)
	// pastShunned, set by pick: the key's walk passed over a member for
	// its client errors on its way to the endpoint (pickPastShunned).
	pastShunned bool
	// With panicking: only members whose breaker is closed and that are
	// not ejected, i.e. at most cooling down (a tenant's shard, see pickWith).
	coolingOnly bool
	// slots: the call names a LoRA adapter and some endpoint reported its
	// adapter slots lately; candidates whose slots are full for it are
	// drawn again (see drawFit).
	slots bool
	// sleep: some endpoint was seen asleep lately; candidates whose fresh
	// reading says they sleep are drawn again (see sleep.go).
	sleep bool
	// With windowNeed or promptNeed set, the members whose remembered
	// context window for the model is below windowNeed, or whose
	// remembered limit on its prompts is below promptNeed, are passed over
	// (window.go).
	windowNeed, promptNeed int32
	// key is the affinity key the pick follows: the request's AffinityKey,
	// or its adapter's home (adapterHome).
	key uint64
	// mem is key scoped to the request's model, as the sticky table and
	// the spill memory keep it (memKey); 0 until the pick needs it (memOf).
	mem uint64
	// lead is standing.lead when every ready member ramps, else 0 (1).
	lead float64
	// ceRef is the lowest client-error share among the first members of
	// the key's order (keyBestShare), once ceRefSet: a pick computes it
	// only when a member of the walk is far enough above 0 to be shunned.
	ceRef    float64
	ceRefSet bool
	// tenantKeep: with refused, the tenant's entry is not kept yet
	// (pickTenantKeep). Next to ceRefSet, in its padding.
	tenantKeep bool
	// steer: out of panic routing, some members in good standing are on
	// probation after an overload cooldown and some are not: the former
	// lose every comparison with the latter, and an affinity key passes
	// them over (see Balancer.cooldown). In panic routing the calls are
	// spread over the ready members, as they were.
	steer bool
	// With refused set, the members that refused the request's tenant's
	// calls (tenant, its Keyer.Tenant key) are passed over.
	refused *refusalTable
	tenant  uint64
	// fit, set when lack, windowNeed, promptNeed or refused is, holds the
	// group's fleet view without the members they pass over, computed at
	// the pick's first affinity bound (see fitView). It lives on
	// pickWith's stack.
	fit *fitView
}

// filtered reports whether the memory's filters pass some members over
// for the pick (passOverFilters).
func (c *cand) filtered() bool {
	return c.lack != nil || c.windowNeed != 0 || c.promptNeed != 0 || c.refused != nil
}

// giveWay lifts the give-th filter the memory set for the pick, the latest
// of passOverFilters' order first: the tenant's refusals (0), the context
// window (1), the not-served memory (2). It reports false, changing
// nothing, when that filter is not set.
func (c *cand) giveWay(give int) bool {
	switch {
	case give == 0 && c.refused != nil:
		c.refused = nil
	case give == 1 && (c.windowNeed != 0 || c.promptNeed != 0):
		c.windowNeed, c.promptNeed = 0, 0
	case give == 2 && c.lack != nil:
		c.lack = nil
	default:
		return false
	}
	return true
}

func (c *cand) ok(e *endpoint) bool {
	return e.usable(c.bit, c.nowNs, c.panicking) && (c.exclude == "" || e.id != c.exclude) &&
		(!c.coolingOnly || !e.heldOut(c.nowNs)) && !c.passOver(e)
}

func (b *Balancer) scorer(svc inferlb.Service) scoring.Scorer {
	if int(svc) < len(b.cfg.scorers) {
		return b.cfg.scorers[svc]
	}
	return b.cfg.scorers[inferlb.ServiceUnknown]
}

// draw samples a usable member other than not, by capacity weight and slow
// start, from the group or, when sh is not nil, from a tenant's shard of it.
// After drawTries rejections it scans from a random start, so it terminates
// in O(n) even when almost nothing is usable; -1 means none.
//
// A second candidate (not >= 0) is admitted by its slow-start factor
// relative to the first's, and a ramping member it turns down stays
// turned down for the draw, the scan included (secondOK). Drawn again and
// again until admitted, as the first candidate is, a joiner that is the
// only other usable member (a fleet of two) was the second candidate of
// every pick, and took half the calls from its first second: slow start
// did nothing. So did joiners that are all the other members (two joining
// one) while only the last one turned down was remembered: the others were
// drawn again, and the scan took one unramped. Relative, so that members
// ramping together (all of a new set) are still compared in pairs.
func (b *Balancer) draw(g *group, c cand, sh *shard, not int) int {
	base := 1.0
	var salt uint64 // the second candidate's verdicts (secondOK); 0 until one is needed
	if not >= 0 {
		base = g.members[not].rampFactor(b.cfg, c.nowNs)
	}
	for range drawTries {
		var i int
		if sh == nil {
			i = g.sample(b.rand())
		} else {
			i = sh.sample(g, b.rand())
		}
		if i == not || !c.ok(g.members[i]) {
			continue
		}
		if not < 0 {
			if b.admitRamp(g.members[i], &c) {
				return i
			}
			continue
		}
		if b.secondOK(g.members[i], i, c.nowNs, base, &salt) {
			return i
		}
	}
	n := len(g.members)
	if sh != nil {
		n = sh.n
	}
	start := int(b.rand() % uint64(n))
	for k := range n {
		i := (start + k) % n
		if sh != nil {
			i = int(sh.members[i])
		}
		if i != not && c.ok(g.members[i]) && (not < 0 || b.secondOK(g.members[i], i, c.nowNs, base, &salt)) {
			return i
		}
	}
	return -1
}

// secondOK admits member i as a second candidate weighed against one whose
// slow-start factor is base (in (0, 1]), with probability its factor /
// base, at most 1. Its verdict on a member holds for the whole draw: it is
// a hash of i under the draw's salt (a random value drawn when it first
// weighs a ramping member), so a member turned down stays turned down
// however often it is drawn, and in the scan, with no list of them kept.
func (b *Balancer) secondOK(e *endpoint, i int, nowNs int64, base float64, salt *uint64) bool {
	return b.rampOK(e, i, nowNs, base, 1, salt)
}

// rampOK is secondOK admitting a ramping member with probability its
// factor / base times scale (in (0, 1]); a member not ramping below base,
// always.
func (b *Balancer) rampOK(e *endpoint, i int, nowNs int64, base, scale float64, salt *uint64) bool {
	f := e.rampFactor(b.cfg, nowNs)
	if f >= base {
		return true
	}
	if *salt == 0 {
		*salt = b.rand() | 1
	}
	u := mix64(*salt + uint64(i)*0x9e3779b97f4a7c15)
	return float64(u>>11)/(1<<53) < f/base*scale
}

// admitRamp accepts a ramping endpoint with probability equal to its
// slow-start factor, which scales its share of candidacies (or of its
// affinity keys) by that factor, like a weight of w*f. When every ready
// member ramps (c.lead set), the factor is relative to the one furthest
// along: members ramping together are admitted at their weights, and an
// owner keeps its keys, as there is no member at full weight to take more.
func (b *Balancer) admitRamp(e *endpoint, c *cand) bool {
	f := e.rampFactor(b.cfg, c.nowNs)
	if c.lead > 0 {
		f /= c.lead
	}
	return f >= 1 || float64(b.rand()>>11)/(1<<53) < f
}

// prefer reports whether member j costs less than member i for req (a tie
// is a coin flip). Slow start is applied to candidacy in draw, not here:
// scaling the cost too would make an idle joiner lose every comparison
// (cost 1/f against 1) until its window ends, a step instead of a ramp.
//
// For generation calls, each cost is also scaled by the candidate's recent
// prefill (prefillBacklog) and, when both candidates' decode speed is
// known, the slower one's by how much slower it is (see "Decode speed" at
// the end of this file). Before any cost, a candidate whose share of
// client-error answers is far above the other's loses (clienterror.go),
// then one that is not a half-open probe, then, with steer (cand.steer),
// one on probation after an overload cooldown (onProbation).
func (b *Balancer) prefer(req *inferlb.Request, g *group, i, j int, now time.Time, steer bool) bool {
	if ei, ej := g.members[i], g.members[j]; b.shunnable.Load() > 0 && (ei.ceShunnable.Load() || ej.ceShunnable.Load()) {
		// One refuses calls the other takes (a wrong API key, a
		// missing route): its refusals are fast and leave nothing in
		// flight, so its cost looks the lowest (see clienterror.go).
		// Before the probe: a probe it refuses would not count, and
		// it would win every comparison while half-open.
		ci, cj := ei.clientErrorShare(b.cfg, now.UnixNano()), ej.clientErrorShare(b.cfg, now.UnixNano())
		switch {
		case shunned(ei, ci, cj):
			return true
		case shunned(ej, cj, ci):
			return false
		}
	}
	if pi, pj := probing(g.members[i], now.UnixNano()), probing(g.members[j], now.UnixNano()); pi != pj {
		// A half-open breaker's probe wins: its cost still carries the
		// outage's error rate, and it would lose to every healthy
		// candidate until that decayed, keeping an endpoint that may
		// have recovered out of rotation for tens of seconds. Its probe
		// slots bound what it takes.
		return pj
	}
	if steer {
		if pi, pj := onProbation(g.members[i], now.UnixNano()), onProbation(g.members[j], now.UnixNano()); pi != pj {
			// It refused even the call sent at its Retry-After: the
			// caller's next retry goes to the other (see
			// Balancer.cooldown).
			return pi
		}
	}
	sc := b.scorer(req.Service)
	var si, sj scoring.State
	nowNs := now.UnixNano()
	g.members[i].state(b.cfg, now, req.Service, g.weights[i], &si)
	g.members[j].state(b.cfg, now, req.Service, g.weights[j], &sj)
	if loadFields(&si) != loadFields(&sj) {
		// One of the two has the server's count of its calls (every
		// caller's), the other only this caller's: compared so, the
		// one whose scrape fails (or that exports none) looked as many
		// times lighter as there are callers, and every caller sent it
		// the calls: with 2 endpoints, 28 of 30. They are compared on
		// what both have, this caller's calls. So too when one has
		// Running and the other only Waiting (a load header's queue,
		// its scrape's Running stale): its running calls are counted
		// nowhere but in this caller's.
		dropLoadReading(&si)
		dropLoadReading(&sj)
	}
	ci := b.priced(sc, req, g, i, nowNs, &si)
	cj := b.priced(sc, req, g, j, nowNs, &sj)
	if req.Service == inferlb.ServiceLLM {
		if ti, tj := g.members[i].tpotEWMA.Load(), g.members[j].tpotEWMA.Load(); ti > 0 && tj > 0 {
			// Only the slower one pays, and only past speedTolerance.
			ci = raise(ci, max(1, float64(ti)/(speedTolerance*float64(tj))))
			cj = raise(cj, max(1, float64(tj)/(speedTolerance*float64(ti))))
		}
	}
	return cj < ci || (cj == ci && b.rand()&1 == 1)
}

// loadCounts is the server's own counts of its calls.
const loadCounts = telemetry.FieldSet(1<<telemetry.Running | 1<<telemetry.Waiting)

// loadFields is which of the server's own counts of its calls (Running,
// Waiting) st carries fresh.
func loadFields(st *scoring.State) telemetry.FieldSet { return st.Telemetry.Has & loadCounts }

// dropLoadReading takes the server's count of its calls out of st, which
// then prices this caller's calls only, as for an endpoint without one.
// The readings of pressure (KV cache, memory, utilization) stay: they
// are 1 below their knees, and near full they say so whoever's calls
// fill it.
func dropLoadReading(st *scoring.State) {
	st.Telemetry.Has &^= loadCounts
	st.InFlightSinceReading = 0
}

// priced is member i's cost for req under sc given its state st, with
// what prefer and scan add to every scorer's: the data-parallel barrier
// and, for generation calls, the recent prefill. A NaN (a custom Scorer's
// 0/0) is +Inf: it compares false both ways, so the first candidate won,
// whichever had it, and an endpoint its scorer could not price took every
// pick it was drawn first for. It loses instead.
func (b *Balancer) priced(sc scoring.Scorer, req *inferlb.Request, g *group, i int, nowNs int64, st *scoring.State) float64 {
	e := g.members[i]
	c := sc.Cost(req, *st)
	if req.PromptTokens > 0 && b.engines.Load() {
		c = raise(c, barrier(e, req.PromptTokens, nowNs))
	}
	if req.Service == inferlb.ServiceLLM {
		c = raise(c, prefillBacklog(e, nowNs))
	}
	if c != c {
		c = math.Inf(1)
	}
	return c
}

// raise makes cost c dearer by the factor f (at least 1): c x f, or c / f
// for a negative c. A Scorer's cost need only order endpoints (lower is
// better), and a custom one may price below zero (minus the free
// capacity); multiplied, a negative cost fell with the factor, so the
// endpoint just sent a long prompt, or the slower decoder, became the
// cheaper one and took every call it was drawn for.
func raise(c, f float64) float64 {
	if c < 0 {
		return c / f
	}
	return c * f
}

// scan returns the member of g, or of the tenant's shard sh when it is
// not nil, that costs least for req among every candidate, or -1 when
// there is none. It is the pick of calls whose scorer prices only what
// this process sees of an endpoint (scoring.FullScanner): with nothing
// shared and stale to herd on, comparing every endpoint finds the best
// one, where two drawn at random often hold neither. Past
// Options.ScanLimit members it compares that many, in a row from a random
// start. A ramping member (slow start) is a candidate as often as it
// would be one of two choices': with probability its factor (relative to
// the lead, when every ready member ramps, as in draw) times 2/m for m
// members compared. Admitted with its factor alone, a joiner, idle and
// with no latency yet, is the cheapest of every scan it is in: it took
// its factor of all calls (0.1 of them among 32, three times its full
// share) from its first second. A half-open breaker's probe wins over
// every other candidate, as in prefer, then one not on probation after an
// overload cooldown (with cand.steer), and a member marked shunnable whose
// share of client errors is far above the least among the candidates is
// passed over, as in prefer (clienterror.go). Ties go to one of the tied
// alike.
func (b *Balancer) scan(req *inferlb.Request, g *group, c cand, sh *shard, now time.Time) int {
	n := len(g.members)
	if sh != nil {
		n = sh.n
	}
	m, start := n, 0
	if lim := b.cfg.scanLimit; n > lim {
		m, start = lim, int(b.rand()%uint64(n))
	}
	base := 1.0
	if c.lead > 0 {
		base = c.lead
	}
	sc := b.scorer(req.Service)
	var st scoring.State
	var salt uint64 // the ramp's verdicts (rampOK); 0 until one is needed
	scale := min(1, 2/float64(m))
	best, ties, bestProbe, bestCost := -1, 0, false, 0.0
	bestZz := false   // the best sleeps (see sleep.go)
	bestShed := false // the best is on probation (see cand.steer)
	// Client errors first, as in prefer: a member whose share is far
	// above the least of the candidates' is passed over. Only while some
	// endpoint may be (markShunnable): the least share takes a pass of its
	// own, in which the candidates' verdicts are those of the pass below
	// (rampOK's are fixed by salt).
	minCE := -1.0
	if b.shunnable.Load() > 0 {
		for k := range m {
			i := (start + k) % n
			if sh != nil {
				i = int(sh.members[i])
			}
			e := g.members[i]
			if !c.ok(e) || !b.rampOK(e, i, c.nowNs, base, scale, &salt) {
				continue
			}
			ce := 0.0
			if e.ceShare.Load() != 0 {
				ce = e.clientErrorShare(b.cfg, c.nowNs)
			}
			if minCE < 0 || ce < minCE {
				minCE = ce
			}
		}
	}
	for k := range m {
		i := (start + k) % n
		if sh != nil {
			i = int(sh.members[i])
		}
		e := g.members[i]
		if !c.ok(e) || !b.rampOK(e, i, c.nowNs, base, scale, &salt) {
			continue
		}
		if minCE >= 0 && e.ceShunnable.Load() && shunned(e, e.clientErrorShare(b.cfg, c.nowNs), minCE) {
			continue
		}
		zz := c.sleep && e.asleep(c.nowNs, b.cfg.telemetryMaxAge)
		if best >= 0 && zz && !bestZz {
			continue // an awake one was found: a sleeping one is worse
		}
		probe := probing(e, c.nowNs)
		if bestProbe && !probe && zz == bestZz {
			continue
		}
		shed := c.steer && onProbation(e, c.nowNs)
		if best >= 0 && shed && !bestShed && zz == bestZz && probe == bestProbe {
			continue
		}
		e.state(b.cfg, now, req.Service, g.weights[i], &st)
		cost := b.priced(sc, req, g, i, c.nowNs, &st)
		switch {
		case best < 0 || zz != bestZz || probe != bestProbe || shed != bestShed || cost < bestCost:
			best, ties, bestProbe, bestZz, bestShed, bestCost = i, 1, probe, zz, shed, cost
		case cost == bestCost:
			ties++
			if b.rand()%uint64(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

func (b *Balancer) acquire(e *endpoint, req *inferlb.Request, c cand) Pick {
	// The breaker generation is read before standing is checked again: if
	// the endpoint was excluded after it was chosen (a trip, cooldown or
	// ejection landed between the candidate check and here), the call goes
	// ahead as a straggler of the old generation, which the breaker
	// ignores, not as a half-open probe whose failure would double the
	// exclusion. onBreakerChange sets the exclusion before it bumps the
	// generation, so a new generation is never seen with the old standing.
	// Panic routing's calls to an endpoint out of good standing (excluded,
	// or half-open with its probes out) are stragglers too: a last resort,
	// not probes, or each failure would re-open the breaker and double its
	// exclusion, pick after pick.
	gen := e.brGen.Load()
	var flags uint32
	if !e.usable(c.bit, c.nowNs, false) {
		gen--
	} else if e.brOpen.Load() {
		if b.takeProbe(e, c.nowNs) {
			flags = pickProbe
		} else {
			gen-- // a racing pick took the last probe: a straggler, as above
		}
	} else if cappedProbing(e, c.nowNs) && b.takeProbe(e, c.nowNs) {
		// A capped breaker's probe (armCappedProbes). It is in rotation:
		// a pick that finds no slot is an ordinary call.
		flags = pickProbe
	}
	// Counted as int32 so Pick stays 40 bytes (the HTTP transport's call
	// state, which holds one, stays in its allocation size class); no call
	// comes near 2^31 tokens.
	tokens := int32(min(max(req.Tokens(), 0), math.MaxInt32))
	var prompt int32
	if req.PromptTokens > 0 && (req.Service == inferlb.ServiceLLM && !c.keyed || b.engines.Load() && e.dpPeers.Load() != nil) {
		prompt = int32(min(req.PromptTokens, math.MaxInt32))
		e.prefill.add(c.nowNs, float64(prompt))
	}
	if sec := histSecond(c.nowNs); e.histSec.Load() != sec {
		e.recordInFlight(sec) // once a second: see readingDelta
	}
	if e.inFlight.Add(1) == 1 {
		e.busySince.Store(c.nowNs) // see endpoint.pending
	}
	if tokens != 0 {
		e.inFlightTokens.Add(int64(tokens))
	}
	e.countLoad(1)
	if !c.failover {
		// Only a call's first attempt earns retry budget: a retry that
		// earned some too would refund part of its own cost (all of it at
		// RetryRatio 1, a budget that never runs out).
		b.retry.deposit()
	}
	if c.slots {
		flags |= b.countLoRA(req, e, c)
	}
	flags |= uint32(svcIndex(req.Service)) << pickServiceShift
	if c.lack != nil && c.keep {
		flags |= pickKeep
	}
	if c.pastShunned {
		flags |= pickPastShunned
	}
	if c.refused != nil && c.tenantKeep {
		flags |= pickTenantKeep
	}
	return Pick{e: e, start: c.nowNs, mono: c.monoNs, tokens: tokens, gen: gen, prompt: prompt, flags: flags}
}

// Pick is the result of Balancer.Pick: the endpoint chosen and the handle to
// report how the call ended. Call Done exactly once, when the response or
// stream has ended, not when headers arrive; further calls are no-ops. Do
// not copy a Pick before calling Done: each copy could report once.
type Pick struct {
	e      *endpoint // its Balancer is e.b
	start  int64     // unix ns at pick
	mono   int64     // the clock's monotonic reading then, ns (see config.readNs)
	tokens int32     // added to the endpoint's in-flight tokens
	prompt int32     // added to the endpoint's prefill estimate
	gen    uint32    // breaker generation at pick
	flags  uint32    // pickDone (atomic) | pickProbe
}

// Pick.flags bits. They share one word so a Pick stays 40 bytes.
const (
	pickDone  = 1 << iota // Done has run
	pickProbe             // the pick took one of a half-open breaker's probe slots
	// then the LoRA counts the call is in: its endpoint's adapter entry
	// (4 bits), its Balancer-wide adapter entry (7; pickCounted,
	// lora.go), then the call's Service (2; pickServiceShift)
)

// pickServiceShift places the call's Service in Pick.flags, past the LoRA
// bits: Done feeds that service's latency.
const pickServiceShift = 14

// pickKeep, past the Service, marks a pick the not-served memory steered
// while its model's entry was not kept: served, the call keeps it
// (keepModel).
const pickKeep = 1 << (pickServiceShift + 2)

// pickPastShunned marks a pick whose affinity key's walk passed over a
// member for its client errors on its way (see clienterror.go): a client
// error in answer is the key's, not the endpoint's.
const pickPastShunned = 1 << (pickServiceShift + 3)

// pickTenantKeep marks a pick the memory of tenants' refusals steered
// while the tenant's entry was not kept: served, the call keeps it
// (tenantServed).
const pickTenantKeep = 1 << (pickServiceShift + 4)

// Fails to compile if the service bits overlap the LoRA ones or cannot
// hold every Service.
var (
	_ = [1]int{}[pickAdapterMask>>pickServiceShift]
	_ = [1]int{}[(inferlb.NumServices-1)>>2]
)

// service returns the Service the Pick was made for.
func (p *Pick) service() inferlb.Service {
	return inferlb.Service(atomic.LoadUint32(&p.flags) >> pickServiceShift & 3)
}

// Endpoint returns the chosen endpoint as last given to Update.
func (p *Pick) Endpoint() inferlb.Endpoint {
	if p.e == nil {
		return inferlb.Endpoint{}
	}
	return *p.e.info.Load()
}

// OwnEndpoint returns the chosen endpoint as the Balancer's own membership
// (Balancer.Update) last described it, and false when that membership
// never listed it. Memberships sharing a Balancer may each describe one ID
// their own way (an HTTP port and a gRPC port): Endpoint is the
// description given last, by whichever membership, so an adapter routing
// over the Balancer's own set (Pick, PickRetry and the like) reads its
// address here. An endpoint that set dropped keeps its last description.
func (p *Pick) OwnEndpoint() (inferlb.Endpoint, bool) {
	if p.e == nil {
		return inferlb.Endpoint{}, false
	}
	if info := p.e.ownInfo.Load(); info != nil {
		return *info, true
	}
	return inferlb.Endpoint{}, false
}

// ID returns the chosen endpoint's ID (Endpoint().Key()) without copying it.
func (p *Pick) ID() string {
	if p.e == nil {
		return ""
	}
	return p.e.id
}

// PickedAt returns the balancer's clock reading at the pick, which Done
// measures latency from when the Outcome gives none. Adapters that time the
// call themselves start from it instead of reading the clock again.
func (p *Pick) PickedAt() time.Time { return time.Unix(0, p.start) }

// Elapsed returns how long the call has been out since its pick, as Done
// measures it when the Outcome gives no Latency: with a MonotonicClock
// (the default clock is one), no forward step of the wall clock counts.
// Adapters that time a whole call, or its wait for the response headers,
// take it from here rather than from PickedAt and the clock, which would
// count a step an hour forward as an hour's wait. 0 for an empty Pick.
func (p *Pick) Elapsed() time.Duration {
	if p.e == nil {
		return 0
	}
	c := p.e.b.cfg
	nowNs, monoNs := c.readNs()
	return c.waited(p.start, p.mono, nowNs, monoNs)
}

// Serial returns a number that identifies the chosen endpoint's state in
// this Balancer: dense (1, 2, ... in order of first appearance) and never
// reused, also when an ID leaves and comes back (it then gets a new one).
// Adapters index per-endpoint data by it instead of hashing the ID on
// every call. 0 for an empty Pick.
func (p *Pick) Serial() uint64 {
	if p.e == nil {
		return 0
	}
	return p.e.serial
}

// Done records the call's outcome: it releases the in-flight count and
// tokens, feeds latency and error EWMAs, and cools the endpoint down on
// overload. Only the first call has an effect; it is safe for concurrent use.
func (p *Pick) Done(o inferlb.Outcome) {
	if p.e == nil {
		return
	}
	f := atomic.LoadUint32(&p.flags)
	if f&pickDone != 0 || !atomic.CompareAndSwapUint32(&p.flags, f, f|pickDone) {
		return
	}
	p.e.b.finish(p, o)
}

func (b *Balancer) finish(p *Pick, o inferlb.Outcome) {
	e := p.e
	nowNs, monoNs := b.cfg.readNs()
	if !o.Canceled() {
		// An answer or a failure: a call the caller gave up on says
		// nothing about how long the others have been out (see
		// endpoint.pending). It ends a run of generation calls
		// abandoned with nothing back (noteAbandoned): e answers.
		e.lastDone.Store(nowNs)
		if e.abandoned.Load() != 0 {
			e.abandoned.Store(0)
			b.markUnanswering(e, false)
		}
	}
	e.inFlight.Add(-1)
	if atomic.LoadUint32(&p.flags)&pickCounted != 0 {
		uncountLoRA(p)
	}
	if p.tokens != 0 {
		e.inFlightTokens.Add(-int64(p.tokens))
	}
	e.countLoad(-1)
	if p.prompt > 0 {
		e.prefill.done(nowNs, p.start, float64(p.prompt))
	}
	latency := o.Latency
	if latency <= 0 {
		// Not across a forward step of the clock (see MonotonicClock).
		latency = b.cfg.waited(p.start, p.mono, nowNs, monoNs)
	}
	svc := p.service()
	switch {
	case o.Canceled():
		e.canceled.Add(1)
		if o.Unanswered {
			e.unanswered.Add(1)
			e.observeUnanswered(b.cfg, nowNs, svc, latency)
			if e.noteAbandoned(svc, p.start, nowNs, latency) {
				b.markUnanswering(e, true)
			}
		} else if o.TTFT > 0 {
			e.noteFirstToken(svc, p.start, nowNs, o.TTFT)
		}
		e.observe(b.cfg, nowNs, svc, 0, o.TTFT, 0, false, false, false)
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.NotServedModel != "":
		// Neither success nor failure: an answer about the model, not
		// about the endpoint's health or speed (see notserved.go).
		e.notServed.Add(1)
		b.notServed(e, o.NotServedModel, nowNs)
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.ContextWindow > 0:
		// Neither: the call, not the endpoint (see window.go).
		e.tooLong.Add(1)
		b.rememberWindow(e, o.Model, o.ContextWindow, o.PromptWindow, nowNs)
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.Overloaded:
		e.overloads.Add(1)
		b.cooldown(e, nowNs, p.start, o.RetryAfter, !o.Drained)
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.ClientError:
		// Neither: the call was bad or not allowed, and a fast refusal
		// must not make the endpoint look fast (see clienterror.go).
		e.clientErrors.Add(1)
		if o.Tenant != "" && b.tenantRefused(e, o.Tenant, nowNs) { // see tenantrefusal.go
			b.emit(e, Event{Kind: EventTenantRefused, Endpoint: e.id, Tenant: o.Tenant, At: time.Unix(0, nowNs), Until: time.Unix(0, later(nowNs, min(b.cfg.errorDecay, maxHold)))})
		}
		if atomic.LoadUint32(&p.flags)&pickPastShunned == 0 {
			b.noteAnswer(e, nowNs, true)
		} // else the key's calls are refused wherever they go (see clienterror.go)
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.Err != nil && o.Model != "" && b.modelFailed(e, o.Model, nowNs):
		// The model's failure, not the endpoint's: it serves other calls
		// meanwhile (see modelfail.go).
		e.modelFailures.Add(1)
		e.failed.note(modelID(o.Model), nowNs)
		b.noteAnswer(e, nowNs, false) // an answer, and no client error
		b.report(e, p.gen, errExcluded, nowNs)
		b.returnProbe(p)
	case o.Err != nil:
		e.failures.Add(1)
		e.failed.note(modelID(o.Model), nowNs) // 0 without one: a call of no model
		b.noteAnswer(e, nowNs, false)
		e.observe(b.cfg, nowNs, svc, latency, 0, 0, true, true, false)
		b.report(e, p.gen, errFailed, nowNs)
	default:
		e.successes.Add(1)
		if b.shedRows.Load() != 0 && e.shedStreak.Load() != 0 && p.start >= e.shedBack.Load() {
			b.shedServed(e) // sent after its cooldown, and served
		}
		if o.Tenant != "" && b.refusedAt.Load() > nowNs {
			b.tenantServed(e, o.Tenant, nowNs, atomic.LoadUint32(&p.flags)&pickTenantKeep != 0)
		}
		if atomic.LoadUint32(&p.flags)&pickKeep != 0 && o.Model != "" {
			b.keepModel(e, o.Model, nowNs) // served: not a made-up name
		}
		if o.Model != "" {
			e.served.note(modelID(o.Model), nowNs)
			if f := e.failed.at0.Load(); f != 0 && nowNs-f < b.cfg.runLife() {
				b.modelServed(e, o.Model, nowNs)
			}
		}
		b.noteAnswer(e, nowNs, false)
		e.observe(b.cfg, nowNs, svc, latency, o.TTFT, o.OutputTokens, true, false, o.Dialed)
		b.report(e, p.gen, nil, nowNs)
	}
	b.maybeEvaluateOutliers(nowNs)
	if f := b.onDone.Load(); f != nil {
		(*f)(e.id)
	}
}

// cooldown keeps e out of rotation for the server's Retry-After hint, or
// DefaultCooldown, capped at MaxCooldown (which is at least DefaultCooldown).
// It never shortens an exclusion.
//
// A second overload answer in a row (to a call sent after the first's
// cooldown had ended, none served in between) puts e on probation
// (onProbation) once its new cooldown ends: in good standing, but second
// choice wherever a peer in good standing is not on probation, for twice
// the cooldown, doubled again for each further refusal in a row, up to
// MaxCooldown. The cooldown is the server's own word, so a caller's retry
// at exactly Retry-After (the OpenAI SDKs', and most others') found e back
// in full standing: with affinity the key's owner took the retry back,
// without it e and a healthy peer tied, and a replica that refused every
// call kept a share of the calls and of their retries: with two retries
// at Retry-After, as openai-go's defaults make them, 10 of 30 calls failed
// all three attempts with affinity, 2 without
// (TestRetryAfterRetriesAvoidRefusingReplica). The first
// refusal is taken at its word, as before: the replica said when it would
// have room, and a replica that sheds one burst is back in full at its
// Retry-After, its affinity keys with it. Once it has refused a call sent
// at the time it gave, its hint has been wrong, and the calls and retries
// that follow go to its peers while it stays so. Put on probation from
// the first refusal, in the fleet simulator's shedding scenario (every
// replica sheds past 4 waiting; 60 req/s, means of seeds 1-4) it cost
// 2.5% of throughput, 14% more failed calls and 3 points of cache hits,
// as the fleet's own overload moved from replica to replica; from the
// second, 0.5% of throughput, 1% more failed calls and half a point
// (`go run ./benchmarks/cmd/fleetsim -scenario shedding -seed N -policies
// inferlb` for N = 1 to 4, against the same before the probation; the
// first-refusal form is `n >= 1` for `n >= 2` below: seed 1 15,237 tok/s
// and 447 failed, against 15,386 and 421).
//
// The cooldown itself is not lengthened: with nowhere else to go (a
// single replica, every peer cooling down or on probation too) the call
// goes to e at the time the server asked, as before; and panic routing,
// which the probation does not move, spreads calls over the ready
// members as it did.
//
// A refusal counts in the row (shedStreak) when its call was picked
// after the latest cooldown had ended (shedBack): the answers of calls
// already in flight when e began to shed, and those panic routing sent
// it while it cooled down, are the same burst. The row ends when e serves
// a call picked after its cooldown (shedServed), or when the refusal
// comes more than MaxCooldown after it was last back in full standing.
// A served call ends the probation of a refusal counted before its Done,
// even when the refusal's Done sets the probation after it
// (TestServedDoneDuringRefusalEndsItsProbation).
//
// refusal is false for a call the endpoint dropped unprocessed as its
// connection closed (Outcome.Drained): it cools e down all the same, and
// leaves the row and the probation as they were (see countShed).
func (b *Balancer) cooldown(e *endpoint, nowNs, pickedNs int64, retryAfter time.Duration, refusal bool) {
	d := retryAfter
	if d <= 0 {
		d = b.cfg.cooldown
	}
	d = min(d, b.cfg.maxCooldown)
	if d <= 0 {
		return
	}
	until := later(nowNs, d)
	moved := refusal && b.countShed(e, nowNs, pickedNs, d, until)
	if exclude(&e.excludedUntil, until) {
		b.epoch.Add(1)
		b.emit(e, Event{Kind: EventCooldown, Endpoint: e.id, At: time.Unix(0, nowNs), Until: time.Unix(0, until)})
	} else if moved {
		b.epoch.Add(1) // the group's count of members on probation (see standing.settled)
	}
}

// countShed counts a refusal of e's (an overload answer at nowNs to a call
// picked at pickedNs, cooling e down for d, until until) in its row, and
// from the row's second puts e on probation after until (see cooldown). It
// reports whether the probation moved.
//
// Only refusals count: a call the endpoint dropped unprocessed as its
// connection closed (Outcome.Drained; gRPC's "the connection is
// draining") says nothing of its load. Counted, a replica restarted
// behind a listener that drained every connection with a GOAWAY (a
// sidecar's, as its application restarted) had two or three such calls
// in a row, and came back on probation: it took none of the first 30
// calls after it was back, and its peers all of them
// (TestE2EDrainedReplicaTakesCallsWhenBack). A connection that fails
// outright (refused, reset, closed with a call on it) is a failure in
// both adapters, for the breaker and ejection, never an overload answer
// (TestConnectionFailuresAreNoOverloads in httpbalancer).
func (b *Balancer) countShed(e *endpoint, nowNs, pickedNs int64, d time.Duration, until int64) bool {
	n := e.shedStreak.Load()
	if pickedNs >= e.shedBack.Load() {
		// When it was last back in full standing: its latest cooldown's
		// end, or its probation's after it.
		back := max(e.shedBack.Load(), e.probationUntil.Load())
		for {
			next := n
			if n > 0 && back < nowNs && uint64(nowNs-back) > uint64(b.cfg.maxCooldown) {
				next = 0 // long since: a new row
			}
			next = min(next+1, maxShedStreak)
			if e.shedStreak.CompareAndSwap(n, next) {
				if n == 0 {
					b.shedRows.Add(1) // a new row (see Balancer.shedRows)
				}
				n = next
				break
			}
			n = e.shedStreak.Load()
		}
	}
	if b.shedCounted != nil {
		b.shedCounted()
	}
	exclude(&e.shedBack, until)
	moved := false
	if n >= 2 {
		probation := d
		for k := int32(1); k < n && probation < b.cfg.maxCooldown; k++ {
			probation = min(probation, b.cfg.maxCooldown/2) * 2
		}
		probation = min(probation, b.cfg.maxCooldown)
		pu := later(until, probation)
		moved = exclude(&e.probationUntil, pu)
		if moved && e.shedStreak.Load() < n {
			// A served call's Done ended the row (shedServed) after it
			// was counted above and before this probation was set: the
			// row only grows, but for that. Left, the probation stood
			// until its end with no row on, and no served call ended it
			// (a served call's Done looks at e only while e is in a row,
			// see Balancer.shedRows). The served call came after the
			// refusal, and ends its probation as it would have a moment
			// later. The epoch moves all the same (moved): a pick may
			// have counted e on probation meanwhile.
			e.probationUntil.CompareAndSwap(pu, math.MinInt64)
		}
	}
	return moved
}

// maxShedStreak bounds shedStreak: past it, doubling the probation has
// long reached any MaxCooldown.
const maxShedStreak = 64

// shedServed ends e's row of overload answers and its probation: it
// served a call sent to it after its cooldown.
func (b *Balancer) shedServed(e *endpoint) {
	if e.shedStreak.Swap(0) != 0 {
		b.shedRows.Add(-1)
	}
	if e.probationUntil.Swap(math.MinInt64) != math.MinInt64 {
		b.epoch.Add(1)
	}
}

// onProbation reports whether e is second choice at nowNs after an
// overload cooldown (see Balancer.cooldown). One load.
func onProbation(e *endpoint, nowNs int64) bool {
	return e.probationUntil.Load() > nowNs
}

// exclude extends a deadline of an endpoint (its exclusion, excludedUntil)
// to until; it reports whether it changed.
func exclude(v *atomic.Int64, until int64) bool {
	for {
		cur := v.Load()
		if cur >= until {
			return false
		}
		if v.CompareAndSwap(cur, until) {
			return true
		}
	}
}

// Decode speed. A generation call's completion latency measures its output
// length more than the endpoint, so the LLM scorer ignores it; but the time
// per output token after the first, (latency - TTFT) / (output tokens - 1),
// from streamed calls that report both, is the endpoint's own decode speed:
// a slower or throttled GPU, or a noisy neighbour, shows there at any
// output length. In-flight counts already steer work away from a slow
// endpoint (its calls last longer, so more are open), but only after it
// has taken its share of long generations, whose whole decode then runs
// slowly. When both P2C candidates have a time per output token, the
// slower one's cost is multiplied by how much slower it is beyond
// speedTolerance; an endpoint without one (new, or serving no streamed
// calls) is compared on cost alone. The speed is an EWMA with ErrorAlpha's
// weight.
//
// In the fleet simulator's heavy/light mix, where 2 of 8 replicas are 1.5x
// and 2x slower and say nothing about it, this cut e2e p99 by 11-14% at
// 10-30 req/s (means of seeds 1-6: 20 req/s 50.5s -> 43.4s) and p99 TTFT
// past saturation (30 req/s) from 37s to 26s; on the homogeneous fleets of
// the other scenarios the speeds are alike and results moved within noise.

// speedTolerance is the ratio of decode speeds that counts as equal: on a
// homogeneous fleet the measured speeds differ by scheduling noise and by
// batch size (a few percent in the quickstart's real-time run, read with a
// temporary debug print), which must not outweigh load. Different GPUs,
// throttling or a noisy neighbour differ by far more. In the simulator's mix 1.1 kept nearly all of the gain of no
// tolerance (e2e p99 at 20 req/s 43.4s against 42.4s; p90 TTFT at 25 0.71s
// against 0.74s) and 1.25 about two thirds of it.
const speedTolerance = 1.1

// minTPOTTokens is the fewest output tokens a call needs to measure decode
// speed: fewer are mostly the first token's own latency and jitter.
const minTPOTTokens = 4

// prefillBacklog prices the prompt tokens recently sent to e that it is
// likely still prefilling: 1 + the decaying estimate (prefillWindow; calls
// that have ended are taken out) / prefillBacklogTokens. A generation
// call's first token waits behind the prefill ahead of it, which in-flight
// counts do not see: a replica that was just sent a 10k-token prompt has one
// more call in flight, the same as one that was sent a 200-token question.
// Calls an affinity key placed are left out of the estimate: their prefix is
// likely cached there, so their prefill is short (counted in full, they
// made the shared-prefix workload's p90 TTFT at 16 req/s 0.25s -> 0.37s).
// Ranks of a data-parallel engine are priced by their engine's barrier
// instead (dp.go), so they get 1 here.
func prefillBacklog(e *endpoint, nowNs int64) float64 {
	if e.dpPeers.Load() != nil {
		return 1
	}
	t := e.prefill.at(nowNs)
	if t < prefillFloor {
		// A residue (float32 rounding of what ended calls took out, or the
		// tail of the decay) is noise; left in, it would make an otherwise
		// idle endpoint lose every tie.
		return 1
	}
	return 1 + t/prefillBacklogTokens
}

// prefillBacklogTokens is the recent prefill that doubles a candidate's
// cost: four chunks of vLLM's default 8,192-token prefill budget. In the
// fleet simulator (means of seeds 1-6) it cut p99 TTFT in the heavy/light
// mix at 10-25 req/s by 5-19% (20 req/s 1.17s -> 0.94s) and on the hot
// prompt at 20-50 req/s by 13-23% (30 req/s 0.43s -> 0.35s), for e2e p99
// 1-3% higher in the mix (20 req/s 43.4s -> 44.2s); the scenarios whose
// calls follow keys (shared prefixes, chat, failures, 8 clients) did not
// move. Weights of 1/4096-1/16384 gained more TTFT but cost the mix's e2e
// p99 4-13% (tried before decode speed was weighed, when 1/32768 cost 1-4%).
const prefillBacklogTokens = 32768

// prefillFloor is the recent prefill below which a candidate counts as
// having none: less than one short prompt, a few milliseconds of work.
const prefillFloor = 256
