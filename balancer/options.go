package balancer

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// runtimeRand is math/rand/v2's top-level generator: per-thread ChaCha8,
// lock-free and safe for concurrent use.
type runtimeRand struct{}

func (runtimeRand) Uint64() uint64 { return rand.Uint64() }

// Defaults for Options. Each is what the zero value of its field means.
const (
	DefaultTelemetryMaxAge = 30 * time.Second
	DefaultLatencyDecay    = 10 * time.Second
	DefaultErrorDecay      = 30 * time.Second
	DefaultErrorAlpha      = 0.1
	DefaultPanicThreshold  = 0.5
	DefaultCooldown        = time.Second
	DefaultMaxCooldown     = 30 * time.Second
	DefaultNotServedMemory = 30 * time.Second
	// MaxNotServedMemory bounds Options.NotServedMemory.
	MaxNotServedMemory     = 24 * time.Hour
	DefaultSlowStartWindow = 30 * time.Second
	DefaultSlowStartMin    = 0.1
	DefaultSubsetLabel     = "model"

	DefaultBreakerFailures = 5

	// MaxStickyEntries bounds Options.StickyEntries: the table is allocated
	// up front, 32 bytes an entry, and a mistyped size must fail as a
	// setting, not as an allocation that takes the process down.
	MaxStickyEntries = cache.MaxSessions
	// MaxWeight bounds an endpoint's Weight (weights are relative: a
	// replica with eight GPUs next to one with a single GPU is 8 to 1);
	// Update reads a larger one as MaxWeight and says so.
	MaxWeight                 = 1e6
	DefaultBreakerProbes      = 3
	DefaultEjectionTime       = 10 * time.Second
	DefaultMaxEjectionTime    = 2 * time.Minute
	DefaultMaxEjectedFraction = 0.5
	DefaultOutlierInterval    = 10 * time.Second
	DefaultOutlierMinRequests = 20
	DefaultOutlierMargin      = 0.2
)

// Options configure a Balancer. The zero value is ready to use: wall clock,
// the runtime's random source, the default scorer per service and the
// documented defaults. A duration set positive must be at least a
// millisecond: a bare number in a Duration is nanoseconds.
type Options struct {
	// Clock is the time source; nil means the wall clock. It may step back,
	// as the wall clock does: no exclusion, overload probation, slow-start
	// ramp, probe deadline, outlier evaluation or forgiveness of a
	// flapping breaker then waits out a step longer than twice the
	// furthest ahead such a deadline is set (the longest ejection,
	// MaxEjectionTime, or a cooldown and the probation after it, twice
	// MaxCooldown), and the error-rate, latency
	// and recent-prefill estimates count no time across a step of more
	// than a second and decay on from the new reading. A step forward
	// cannot be told from time passing by Now alone: with a
	// MonotonicClock (the default clock is one), a call's measured
	// latency or wait, pick to Done, counts none of it, so calls given up
	// on just after such a step are not overdue (see MonotonicClock).
	Clock Clock
	// Rand is the random source for sampling. nil means math/rand/v2's
	// concurrent-safe generator. A custom source must be safe for concurrent
	// use if the Balancer is (tests pass a scripted one).
	Rand rand.Source
	// Scorers overrides the scorer per Service; services not named keep
	// scoring.DefaultFor. A Scorer with a Validate() error method (the
	// scoring package's have one) is validated with the Options.
	//
	// Besides its costs, a Scorer's type decides two things, read once
	// at New: a scoring.FullScanner whose FullScan reports true (as
	// *scoring.Latency's does) has its calls compared over every endpoint
	// of their group (ScanLimit) rather than two drawn at random; and a
	// *scoring.LLM given here itself (with LoRAWait not 1) has calls for a
	// LoRA adapter kept off servers whose adapter slots other adapters
	// hold, and rare adapters sent to a home endpoint (AdapterHomes). A
	// Scorer of your own that wraps a built-in one keeps only what it
	// exposes: embed the wrapped *scoring.Latency (its FullScan and
	// Validate are promoted) or forward them, as the scoring package's
	// Example_wrap shows; a wrapped *scoring.LLM loses the LoRA slot
	// handling.
	Scorers map[inferlb.Service]scoring.Scorer
	// Telemetry is where the balancer reads endpoint samples. nil means a
	// private Store on the Balancer's Clock, reachable through
	// Balancer.Telemetry. Share one Store
	// between Balancers to share one telemetry plane; a Store given here
	// keeps its own Clock (nil: the wall clock), so with an injected
	// Clock set the Store's to it too. A Balancer holds a slot of the
	// Store for each of its endpoints until the endpoint leaves it
	// (Update, a Membership's Close) or the Balancer is closed: Close a
	// Balancer whose Store lives on when you drop it, or its endpoints'
	// slots stay for as long as the Store does (the adapters close the
	// Balancers they make themselves). An endpoint
	// that joins while the Store's MaxEndpoints slots are all held gets
	// none, so its samples are dropped (DroppedUnknown) and it is scored
	// without telemetry; it tries again at each later membership change
	// of the Balancer (Update, a Membership's Update or Close).
	Telemetry *telemetry.Store
	// TelemetryMaxAge is how old a telemetry field may be before it is
	// ignored (treated as absent, i.e. neutral). Default 30s: twice the
	// 15s at which a telemetry.Poller polls by default and Prometheus'
	// example configuration scrapes. Prometheus' own default interval is
	// 1m: a reading is as old as its scrape (promapi stamps each field
	// with it), so with scrapes that far apart set this to at least twice
	// the interval, or readings count as absent for half of it (readings
	// already past it when they arrive are counted in the Store's
	// ArrivedStale, not Accepted). Negative means never stale. An endpoint's load readings (its queue, KV and
	// prefix cache, utilization, GPU memory used, LoRA adapters, sleep
	// state: telemetry.ProcessLoad) are expired sooner when a failure
	// exclusion begins, a tripped breaker or
	// an outlier ejection: a replica that fails has often crashed, and the
	// old process's last report would price the new, idle one out of
	// rotation when it returns; readings observed since stay.
	TelemetryMaxAge time.Duration
	// LatencyDecay is the peak-EWMA time constant. Default 10s (Linkerd's).
	// A sample dt after the previous one weighs 1 - exp(-dt/LatencyDecay)
	// (a latency above the average replaces it at once: the peak); read
	// dt after its last sample, the average has decayed towards 0 by
	// exp(-dt/LatencyDecay), so an endpoint shunned for one slow call is
	// probed again once that falls below its peers' cost: after one 30 s
	// call among 20 ms ones, about LatencyDecay x ln(30 s / peers' cost
	// per call), a minute at the default.
	LatencyDecay time.Duration
	// ErrorAlpha is the weight of each new outcome in the error-rate EWMA,
	// and of each streamed call in the TTFT and decode-speed (time per
	// output token) EWMAs. Default 0.1 (about the last 10 calls).
	ErrorAlpha float64
	// ErrorDecay is how fast an idle endpoint's error rate fades towards 0.
	// Default 30s. A breaker that closes (its probes passed) starts the
	// rate over at 0: the outage's failures are the breaker's to judge,
	// and slow start paces the return. A capped breaker (see
	// MaxEjectedFraction) that closes on the calls it takes in rotation
	// before its probes are due keeps the rate.
	ErrorDecay time.Duration
	// PanicThreshold: when fewer than this fraction of an eligible group's
	// ready endpoints are in good standing (not cooling down, ejected or
	// breaker-open), the picker ignores standing and routes across all ready
	// endpoints, as Envoy does, rather than piling the whole load onto a few
	// survivors (a tenant's shard, TenantShardSize, by its own members). Default 0.5 (Envoy's); negative disables panic routing.
	// Such a call to an endpoint out of good standing is no half-open
	// probe: its outcome does not move the breaker or the exclusion the
	// breaker set. An overload answer to it still cools the endpoint down
	// (DefaultCooldown), as any overload answer does: the server said so
	// just now.
	PanicThreshold float64
	// DefaultCooldown is how long an endpoint that answered "overloaded"
	// without a Retry-After hint is kept out of rotation. Default 1s, or
	// MaxCooldown when that is set shorter.
	//
	// An endpoint that answers "overloaded" again to a call sent once its
	// cooldown had ended (its hint was wrong) is, after the new
	// cooldown, on probation: in good standing (it counts against
	// PanicThreshold as such, and takes calls when no peer can), but
	// second choice to every peer in good standing that is not on
	// probation, and passed over by affinity keys that have such a peer
	// to go to (in the tenant's shard, past the call's filters), for
	// twice the cooldown, doubled for each further refusal in a row, up
	// to MaxCooldown. A half-open breaker's probe still wins over its
	// peers. A call it serves ends both; EndpointStats shows them
	// (ProbationUntil, OverloadStreak). The cooldown itself stays the
	// server's hint, so a single replica still takes the caller's retry
	// at its Retry-After, while next to a healthy peer a replica that
	// refuses every call no longer takes each retry back. A call the
	// endpoint dropped unprocessed as its connection closed
	// (inferlb.Outcome.Drained: a gRPC stream a GOAWAY dropped, as in a
	// restart) cools it down for DefaultCooldown, but is no refusal: it
	// neither counts in a row nor ends one. Connection failures are
	// failures, not overload answers.
	DefaultCooldown time.Duration
	// MaxCooldown caps any Retry-After hint, and the probation after a
	// row of overload answers (see DefaultCooldown). Default 30s, or
	// DefaultCooldown when that is longer; set, it must be at least
	// DefaultCooldown.
	MaxCooldown time.Duration
	// NotServedMemory is how long an endpoint that answered it does not
	// serve a model (Outcome.NotServedModel: vLLM's 404 for a LoRA adapter
	// loaded on other replicas, Ollama's "model not found", Triton's
	// "unknown model") is passed over by that model's picks, unless no
	// other endpoint can take them. Other models' picks are not affected,
	// nor is the endpoint's health. 0 means DefaultNotServedMemory (30s);
	// negative turns the memory off; at most MaxNotServedMemory. It holds
	// up to 4,096 (endpoint, model) pairs and 256 models, 34 KiB allocated
	// at the first such answer (see notserved.go). The entries of a model
	// an endpoint then served a call for (Outcome.Model on a success) are
	// kept: a table set full of live entries gives up one of made-up
	// names, which no endpoint serves, before them, and one of them only
	// when all four are kept.
	NotServedMemory time.Duration
	// SlowStartWindow is how long an endpoint that joins an already-serving
	// balancer (or recovers) takes to ramp to its full weight. Default 30s;
	// negative disables slow start. When every ready endpoint is ramping
	// (a whole new set, every connection back after an outage), each ramps
	// relative to the one furthest along: with none at full weight to take
	// more, keys stay with their owners and calls go by weight.
	SlowStartWindow time.Duration
	// SlowStartMinWeight is the fraction of weight a ramping endpoint starts
	// from. Default 0.1 (Envoy's min_weight_percent of 10%).
	SlowStartMinWeight float64
	// SlowStartAggression shapes the ramp: weight fraction =
	// max(min, (t/window)^(1/aggression)). Default 1 (linear); above 1
	// ramps faster early. As Envoy's slow_start_config.aggression.
	SlowStartAggression float64
	// RetryRatio is the share of traffic that failover retries may add
	// (AllowRetry). Default 0.2; negative allows only RetryFloor. Hops
	// past "model not found" (PickNotServedRetry) leave failover a
	// reserve of the budget: half what the ratio banks (at least one
	// retry) and half the floor's bank. Below a ratio of 0.02 with the
	// floor under 0.2 a second, that reserve is all there is, and such
	// hops are refused: the caller gets the server's 404.
	RetryRatio float64
	// RetryFloor is how many retries per second are allowed regardless of
	// traffic, with up to ten seconds of it banked while unused (100
	// retries at the default), so a burst of failures, such as the calls
	// a crashed replica was streaming, can all fail over. Default 10;
	// negative means none.
	RetryFloor float64
	// Affinity says how Request.AffinityKey steers picks. The zero value is
	// AffinityPrefer.
	Affinity AffinityMode
	// LoadBound is the bounded-load factor c for affinity: an endpoint takes
	// a key's traffic only while its in-flight calls stay within c x its
	// capacity share of the group's load. Default DefaultLoadBound (1.25);
	// must be above 1. The load is shared among the endpoints that can take
	// calls, each at its weight times its slow-start ramp; calls still in
	// flight on endpoints out of rotation (cooling down, ejected, not
	// ready), or on endpoints whose fresh telemetry says they sleep
	// (telemetry.Asleep), are not theirs to share. The calls counted are this caller's own, or, when
	// the endpoints of the group that can take calls report Running and
	// Waiting in fresh telemetry, what each server reports (all callers'
	// calls), brought up to now with this caller's calls there since the
	// report, or this caller's own calls there, whichever is more:
	// independent callers then bound an owner by the same load and spill
	// its keys at the same moments. Endpoints without such a reading (a
	// failing scrape), if they have less than half the weight and were
	// listed at least TelemetryMaxAge ago or added to a serving pool
	// (whose first scrape is not waited for), count at the reporters' mean
	// load in the group's total, and are themselves bounded by this
	// caller's own calls. A tenant's shard (TenantShardSize)
	// counts this caller's own calls only. An endpoint whose fresh telemetry shows an empty queue
	// and KV cache below 90% is not saturated and keeps its keys up to 1.2c:
	// continuous batching absorbs the extra call, a spill costs a cold
	// prefill elsewhere. In the fleet simulator this cut p90 TTFT at 4 req/s
	// on the shared-prefix workload from 0.38s to 0.17s; 2c cut it to 0.09s
	// but let a hot prompt crowd its owner (p90 TTFT 0.97s against 0.47s).
	// One far from saturation (no queue, KV cache under 30%) keeps its keys
	// up to 4 calls past that: at light load a share is a handful of calls,
	// and passing it by chance spilled chat sessions to cold caches (p99
	// TTFT at 10 req/s 0.18s; 0.06s with the 4 calls).
	// One waiting call counts as no queue while the KV cache is under 50%:
	// it arrived since the server's last step and is admitted at the next
	// (data-parallel chat's p99 TTFT at 20 req/s 0.171s; 0.087s with it).
	// Up to the same 1.2c, an owner with a queue also keeps a key when the
	// endpoint it would spill to shows a queue or a KV cache at 90% or more
	// in fresh telemetry: near saturation a spill trades a queue for a
	// queue plus a cold prefill. At 16 req/s that raised throughput from
	// 15.1k to 15.6k tokens/s and cut p90 TTFT from 24s to 8s; eight
	// independent clients went from 13.9k to 15.3k tokens/s. A busy spill
	// target that holds the key's prefix (see SpillMemory) is no such
	// trade, and the key spills to it.
	// An owner whose KV cache or GPU memory is at 95% or more passes its keys
	// to a nearby endpoint in the key's order that is at least 20 points less
	// full and has no queue, if there is one; when the whole fleet is that
	// full or queueing, keys stay. (Relief to an emptier endpoint with a
	// queue cost 3-5% of throughput at saturation in the simulator.)
	LoadBound float64
	// AffinitySeed keys the consistent placement of affinity keys and the
	// Keyer returned by Balancer.Keyer. 0 means a random per-process seed
	// (from crypto/rand, drawn once and shared by every Balancer of the
	// process that leaves it 0, so they agree on where a key goes), so
	// outsiders cannot aim traffic at one endpoint.
	// Processes that set the same secret seed and see the same endpoints
	// place every key identically; even then, the load bound keeps a
	// flood of one key from pushing any endpoint past c x the mean.
	AffinitySeed uint64
	// StickyTTL, when positive, makes affinity follow each key to the
	// endpoint it last went to (while usable and within bound) for this long
	// after its last use, instead of returning to the owner after a spill.
	// Stickiness is per key and model: a session (Request.Session) whose
	// calls name two models, such as an agent's small router model and its
	// large model, sticks to one endpoint per model, since each model's KV
	// cache is its own; calls that name no model share the key's entry.
	// A key that went past an endpoint passed over for its client errors
	// does not stick where it went (see clienterror.go).
	// Off by default. It suits one router serving many clients: in the fleet
	// simulator's shared-prefix workload at saturation it raised a single
	// client's throughput 3.7% and cut p90 TTFT from 27s to 10s. Independent
	// callers each remember their own spills and so disagree: with 8 clients
	// it cost 5.5% of throughput. The table is bounded (StickyEntries).
	StickyTTL time.Duration
	// TenantShardSize, when positive, confines each tenant's requests
	// (Request.Tenant) to a shard of this many endpoints: shuffle sharding,
	// so one tenant's flood reaches only its own shard, and two tenants
	// rarely share all of theirs (poison requests too with
	// TenantShardStrict): as with shards drawn at random, two tenants
	// share a whole shard about once in C(n, k) pairs (n endpoints of equal
	// weight in the group, shards of k). A shard is
	// TenantShardSize endpoints, each the first on the group's
	// consistent-hash ring from one of the tenant's seeded keys that the
	// shard does not hold yet, so processes with the same AffinitySeed
	// agree on it, nothing is stored per tenant (tenant names cannot grow
	// any table), and an endpoint leaving changes only the shards it was in.
	// Affinity keys and P2C work inside the shard, and the affinity load
	// bound shares the shard members' load among them. Panic routing
	// (PanicThreshold) is judged by the shard too: a group in panic sends a
	// tenant's calls across its shard's members out of good standing only
	// when fewer than PanicThreshold of the shard's ready members are in
	// good standing (one tenant's flood, cooling its own shard, put a
	// model's group of 6 in panic with shards of 4, and other tenants then
	// sent half their calls to its cooling members). When no endpoint of the
	// shard can take a request it goes to the whole group (availability
	// first), unless the shard's endpoints are only cooling down after
	// overload answers, as a tenant's own flood leaves them: its calls then
	// stay in the shard, across its cooling endpoints, as panic routing
	// sends them (with PanicThreshold negative they go to the group). Shards are drawn per group, so each model subset has its own;
	// a group of k endpoints or fewer is not sharded. 0 (the default) turns
	// sharding off; at most MaxTenantShard.
	TenantShardSize int
	// TenantShardStrict keeps every tenant's calls in its shard: when no
	// endpoint of the shard can take a call (its breakers open, ejected,
	// not ready), the pick fails with ErrTenantShardDown instead of going
	// to the whole group (a shard whose endpoints are only remembered not
	// to serve the call's model, or too small for it, takes a first pick
	// all the same, as a group does; see NotServedMemory). Requests that crash or break the servers they
	// reach (a poison prompt) then take down one shard, not the fleet one
	// shard at a time, at the cost of that tenant's calls failing while
	// its shard is down; its half-open breakers are probed by its own
	// calls. It needs TenantShardSize; off by default (availability first).
	TenantShardStrict bool
	// SpillMemory is how long the balancer remembers that it sent an
	// affinity key to an endpoint other than the key's owner (a spill past
	// the load bound, a breaker, pressure relief), because that endpoint
	// now holds the key's prefix in its KV cache for a while. As with
	// StickyTTL, a key is remembered per model: an endpoint warm for a
	// session's calls of one model is not warm for its calls of another. Later spills
	// of the key prefer such a warm endpoint to a cold one, and a crowded
	// owner lets a key go to a busy endpoint only when it is warm (see
	// LoadBound): spills of a key then stay on the endpoints that cached
	// it, instead of paying a cold prefill somewhere new each time. And
	// while the key's owner is above its fair share of the group's load
	// (within its bound), the key stays on a warm endpoint among the next
	// two in its order that is at or below its own share, rather than
	// flapping home: one cached copy of the prefix instead of two. 0 means
	// DefaultSpillMemory; negative turns it off. The memory is a bounded
	// table of SpillEntries entries (128 KiB), allocated with the Balancer
	// unless Affinity is AffinityOff; keys are seeded hashes, so request
	// data can neither grow it nor aim at one of its sets.
	SpillMemory time.Duration
	// StickyEntries bounds the sticky table; 0 means cache.DefaultMaxSessions
	// (65,536 entries, 2 MiB). The table is allocated up front by New, and
	// only when StickyTTL is positive, rounded down to a power of two; at
	// most MaxStickyEntries (16,777,216: 512 MiB).
	StickyEntries int
	// BreakerFailures is how many consecutive failures trip an endpoint's
	// circuit breaker: outcomes with an Err that is neither overload nor
	// cancellation (connection errors, 5xx, and the gRPC codes Envoy maps
	// to 5xx: UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
	// UNAVAILABLE, DATA_LOSS). Default 5 (Envoy's consecutive_5xx);
	// negative disables the breaker.
	BreakerFailures int
	// BreakerProbes is how many calls a half-open breaker lets through, all
	// of which must succeed to close it. Default 3. A probe holds its slot
	// until its call ends; once all are out, they are overdue after as long
	// as the exclusion before them, and one more call goes as a probe, then
	// another after twice that wait, up to MaxEjectionTime. So a probe that
	// never ends (the server accepts calls and never answers, or lost one,
	// and the caller set no deadline) does not hold the endpoint out for
	// good: a wedged server gets about one call per wait, as a failing one
	// gets one probe per exclusion, and a probe that is only a long
	// generation delays the next by a wait at most. Overdue probes still
	// count when they end.
	BreakerProbes int
	// EjectionTime is how long a tripped or ejected endpoint stays out the
	// first time; each consecutive ejection doubles it. A breaker that
	// trips again soon after it recovered counts as consecutive too: one
	// doubling is forgiven per EjectionTime of good standing in between, so
	// a flapping endpoint is held out longer each time. An outlier ejected
	// again counts as consecutive unless an evaluation judged it no outlier
	// in between, less one doubling forgiven per span of good standing
	// since its return as long as its last ejection and at least two
	// OutlierIntervals (it may have had too few calls to be judged,
	// OutlierMinRequests): one that fails again within two intervals of
	// its return is held out longer, and one ejected once and then given
	// light traffic for a day starts over. (Envoy forgives a step per
	// interval the host is not ejected.) Default 10s (or
	// MaxEjectionTime, when that is set shorter): a crashed model server
	// usually needs longer to come back, and a probe costs little.
	EjectionTime time.Duration
	// MaxEjectionTime caps the doubling. Default 2m, or EjectionTime
	// when that is longer; set, it must be at least EjectionTime.
	MaxEjectionTime time.Duration
	// MaxEjectedFraction caps the share of a pool that breakers and
	// outlier detection may hold out at once; one endpoint per pool may
	// always be ejected. A pool is the endpoints of one model (with the
	// unlabelled ones, which serve every model; see SubsetLabel), or the
	// whole fleet when no endpoint names a model, in each Membership: one
	// model's endpoints cannot carry another's calls, so a small model
	// keeps its share however many of a big one's are out (Envoy counts
	// per cluster, one pool). An endpoint that serves several models is
	// held out only within the cap of each. Default 0.5: past that, the
	// pool itself is the problem and ejecting more only overloads the rest.
	// A breaker that trips past the cap (capped) keeps its endpoint in
	// rotation, priced by its error rate, and is probed as a tripped one
	// is: from EjectionTime after its last failure, BreakerProbes of its
	// calls win their comparisons, and when they pass the breaker closes.
	// After a failure of the whole pool, which the capped endpoints took
	// nearly all of, that brings them back within EjectionTime of the
	// recovery, where their error rate kept them out for minutes. The same
	// cap, counted apart, bounds how many of a pool's members may be
	// passed over for a share of client errors (inferlb.Outcome.
	// ClientError) far above their peers': a tenant's bad calls raise the
	// shares of its shard's replicas alone.
	MaxEjectedFraction float64
	// OutlierInterval is how often each endpoint's success rate over the
	// interval is compared with its pool's (the pools of
	// MaxEjectedFraction). Default 10s; negative disables outlier ejection.
	OutlierInterval time.Duration
	// OutlierMinRequests is the calls an endpoint needs in an interval to
	// be judged. Default 20.
	OutlierMinRequests int
	// OutlierMargin ejects an endpoint whose success rate is this far below
	// the median success rate of a pool it is in, over that pool's judged
	// endpoints, itself among them; a pool with fewer than 3 judged judges
	// none. Default 0.2. Each model's endpoints are judged among
	// themselves, in each Membership, as each Envoy cluster has its own
	// detector: a model whose calls fail more often by nature (a harder
	// task, bad input) is no outlier next to one that rarely fails, and
	// does not hide a bad endpoint of another model. An endpoint in
	// several pools (serving several models, or in several Memberships)
	// is ejected when it is an outlier in any of them, with its one
	// success rate over all its calls. A margin from the median, unlike
	// Envoy's mean minus 1.9 standard deviations, still finds one bad
	// replica among four.
	OutlierMargin float64
	// OnEvent, when set, is called synchronously on every standing change
	// (trip, probe failure, recovery, ejection, cooldown). It must be fast
	// and must not call back into the Balancer. An endpoint that has left
	// the Balancer (Update without it) reports nothing more: the calls
	// still out to it end there, but its ID may be a new endpoint's.
	OnEvent func(Event)
	// SubsetLabel is the endpoint label listing the models an endpoint
	// serves (comma-separated). Default "model". Each name is trimmed of
	// spaces; empty names and repeats are dropped, and a name matches a
	// request's Model exactly, case included (as model servers match
	// served model names). A request for a model goes to the endpoints
	// that list it and to those whose label is absent or lists no name,
	// which serve every model; a model that no endpoint lists goes to
	// those alone, or fails with ErrNoEndpoints. A request without a
	// Model may go to any endpoint. It must differ from DPGroupLabel.
	SubsetLabel string
	// MinKeyReuse turns AffinityPrefer off while the workload's keys do
	// not recur: when fewer than this fraction of recent keyed requests
	// carry a key this Balancer has seen recently, AffinityKey is ignored
	// and P2C alone picks, until keys recur again. Requests with a Tenant
	// are judged apart from those without, in 7 classes of tenants (by a
	// seeded hash of the name), so that one tenant's prompts that never
	// recur do not turn affinity off for the tenants whose prompts do. AffinityStrict always
	// follows the keys, and so does a request whose key is an explicit
	// session (Request.Session: the adapters set it for session headers,
	// prompt_cache_key, conversation IDs and gRPC metadata keys), which
	// does not count in the estimate either. Default DefaultMinKeyReuse
	// (0.05); negative keeps affinity on for prompt keys too, whatever
	// they do. It is measured on tables of recent keys (32 KiB for requests
	// without a tenant, 4 KiB for each class of tenants), 1 in 8 keys
	// sampled; Balancer.KeyReuse reports it. A new Balancer follows keys until it
	// has observed 64 sampled keys (about 500 keyed requests): until then
	// even prompts that never recur go to their keys' owners, within the
	// load bound, rather than to the cheaper of two candidates.
	MinKeyReuse float64
	// DPGroupLabel is the endpoint label naming the data-parallel attention
	// engine a rank belongs to (ranks of one engine share its value;
	// values are each Membership's own, so two channels on one Balancer may
	// both number their engines from "0"; within one Membership, give each
	// engine a value of its own, across models too: the ranks of two
	// models' engines both labelled "0" are priced as one engine, and one
	// model's prefill hides the other's peaks). Ranks of an engine step together, so P2C prices how far a prompt
	// would raise its engine's step above the prefill of its busiest rank,
	// the candidate included (see the inferlb package doc). Default DefaultDPGroupLabel ("dp_group");
	// an endpoint without the label is an engine of its own, whose step a
	// prompt raises by all of it (what matters where it shares a group
	// with ranks); without any engine nothing changes. It must differ
	// from SubsetLabel.
	DPGroupLabel string
	// AdapterHomes places the calls of rarely asked LoRA adapters by
	// adapter rather than by prompt: a call for an adapter that has at
	// most AdapterHomes times one endpoint's fair share of this
	// process's calls in flight on the model's endpoints (their calls
	// over their number; calls on a Balancer's other pools do not count)
	// takes the adapter's own affinity key, so the
	// adapter runs on its home endpoint (and the next ones on the ring
	// when the load bound spills it) instead of taking a slot wherever its
	// sessions land; popular adapters spread by prompt. It applies where
	// picks heed LoRA slots (a scoring.LLM with LoRAWait not 1, servers
	// that report their adapters; see the package doc), and not to an
	// explicit session (Request.Session). Default DefaultAdapterHomes (1);
	// negative turns it off.
	AdapterHomes float64
	// ScanLimit bounds the full scan: calls of a service whose scorer
	// prices only what this process sees of an endpoint (its own calls in
	// flight, their latency and errors; a scoring.FullScanner, as the
	// default for embeddings and rerankers, scoring.Latency, is) compare
	// every candidate endpoint of their group, up to ScanLimit of them,
	// instead of two drawn at random; a larger group compares ScanLimit in
	// a row from a random start. Generation calls, priced on telemetry
	// that every caller reads alike, keep two random choices: all callers
	// scanning would all pick the endpoint whose last reading looks best.
	// Default DefaultScanLimit (32); at least 2 (a scan of one would
	// compare nothing) and at most MaxScanLimit; negative turns the scan
	// off (two choices for every call).
	ScanLimit int
}

// DefaultScanLimit is Options.ScanLimit's default: a scan of 32 members
// costs a few microseconds, against calls of milliseconds. In the fleet
// simulator's embedding scenario, the scan at 6, 16 and 48 replicas beat
// two choices at every load short of overload, with 1 client and with 8
// (benchmarks/results/embedding.md and SUMMARY.md); ScanLimit 8 and 16
// came close to it at 48 replicas, 32 closer (TestEmbeddingScanWhatIf in
// benchmarks/fleetsim).
const DefaultScanLimit = 32

// MaxScanLimit is the largest Options.ScanLimit: each pick's cost grows
// with it.
const MaxScanLimit = 1024

// processSeed is the AffinitySeed of every Balancer left at 0: drawn from
// crypto/rand once per process, so that the Balancers of one process (two
// Transports, a gRPC channel beside a Transport, the Balancer a channel's
// config push replaces) place a key on the same endpoint, and outsiders
// still cannot predict where.
var processSeed = sync.OnceValue(func() uint64 { return cache.NewKeyer(0).Seed() })

// config is Options with defaults applied; immutable after New.
type config struct {
	clock Clock
	mono  *monoClock // the default clock, read without an interface call; nil when injected
	// monoSrc is an injected Clock that is a MonotonicClock; nil when
	// it is none, or the clock is the default one (mono).
	monoSrc MonotonicClock
	rand    rand.Source
	scorers [inferlb.NumServices]scoring.Scorer
	// fullScan: the service's scorer asks for a full scan
	// (scoring.FullScanner) and ScanLimit does not turn it off.
	fullScan  [inferlb.NumServices]bool
	scanLimit int
	// slotWaits: picks keep a call for a LoRA adapter off endpoints whose
	// slots other adapters hold (the service's scorer is a scoring.LLM
	// that prices the wait; see lora.go).
	slotWaits       [inferlb.NumServices]bool
	store           *telemetry.Store
	telemetryMaxAge time.Duration
	latencyDecay    time.Duration
	errorAlpha      float64
	errorDecay      time.Duration
	panicThreshold  float64
	cooldown        time.Duration
	notServedTTL    time.Duration // 0: off
	maxCooldown     time.Duration
	slowStart       time.Duration
	slowStartMin    float64
	slowStartAggr   float64
	subsetLabel     string
	dpLabel         string
	retryRatio      float64
	retryFloor      float64

	affinity      AffinityMode
	loadBound     float64
	affinitySeed  uint64
	loadBoundHard float64
	stickyTTL     time.Duration
	stickyEntries int
	tenantShard   int
	tenantStrict  bool
	spillTTL      time.Duration // 0: off
	minKeyReuse   float64       // <= 0: affinity whatever the keys
	adapterHomes  float64       // <= 0: off

	breakerFailures    int
	breakerProbes      int
	ejectionTime       time.Duration
	maxEjectionTime    time.Duration
	maxEjected         float64
	outlierInterval    time.Duration
	outlierMinRequests int
	outlierMargin      float64
	onEvent            func(Event)
	// Twice the furthest ahead of the clock (ns) the balancer sets an
	// exclusion, a probation's end or a ramp's start (the longest
	// ejection, or a cooldown and the probation after it, twice
	// MaxCooldown): further ahead, the clock has stepped back. Twice, so
	// that a reading taken a moment before another goroutine's, which set
	// a deadline, is no step (TestProbationSurvivesSmallStepBack: at once
	// the probation's end, it was cut short by a step back of 1ms).
	horizon int64
}

func durationOr(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

func intOr(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func floatOr(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

// minDuration is the least positive duration Options take.
const minDuration = time.Millisecond

// Validate reports the first invalid field, named as in Options. New panics
// on invalid Options; configuration parsers call Validate first so a bad
// config fails at parse time with this message.
func (o *Options) Validate() error {
	bad := func(field, rule string, v any) error {
		return fmt.Errorf("inferlb: balancer.Options.%s = %v: %s", field, v, rule)
	}
	switch {
	case o.ErrorAlpha < 0 || o.ErrorAlpha > 1 || math.IsNaN(o.ErrorAlpha):
		return bad("ErrorAlpha", "must be in [0, 1]", o.ErrorAlpha)
	case o.PanicThreshold > 1 || math.IsNaN(o.PanicThreshold):
		return bad("PanicThreshold", "must be at most 1", o.PanicThreshold)
	case o.SlowStartMinWeight < 0 || o.SlowStartMinWeight > 1 || math.IsNaN(o.SlowStartMinWeight):
		return bad("SlowStartMinWeight", "must be in [0, 1]", o.SlowStartMinWeight)
	case o.SlowStartAggression < 0 || math.IsNaN(o.SlowStartAggression) || math.IsInf(o.SlowStartAggression, 0):
		return bad("SlowStartAggression", "must be positive and finite", o.SlowStartAggression)
	case math.IsNaN(o.RetryRatio) || math.IsInf(o.RetryRatio, 0) || o.RetryRatio > 1:
		return bad("RetryRatio", "must be finite and at most 1", o.RetryRatio)
	case math.IsNaN(o.RetryFloor) || math.IsInf(o.RetryFloor, 0):
		return bad("RetryFloor", "must be finite", o.RetryFloor)
	case o.Affinity > AffinityStrict:
		return bad("Affinity", "must be AffinityPrefer, AffinityOff or AffinityStrict", o.Affinity)
	case o.LoadBound != 0 && !(o.LoadBound > 1) || math.IsInf(o.LoadBound, 0):
		return bad("LoadBound", "must be a finite number above 1 (0 means the default 1.25)", o.LoadBound)
	case o.MinKeyReuse > 1 || math.IsNaN(o.MinKeyReuse):
		return bad("MinKeyReuse", "must be at most 1 (negative turns the check off)", o.MinKeyReuse)
	case math.IsNaN(o.AdapterHomes) || math.IsInf(o.AdapterHomes, 0):
		return bad("AdapterHomes", "must be finite (negative turns it off)", o.AdapterHomes)
	case o.ScanLimit > MaxScanLimit || o.ScanLimit == 1:
		// A scan of one compares nothing: a random endpoint, whatever it costs.
		return bad("ScanLimit", fmt.Sprintf("must be in [2, %d] (0 means the default, negative turns the scan off)", MaxScanLimit), o.ScanLimit)
	case o.TenantShardSize < 0 || o.TenantShardSize > MaxTenantShard:
		return bad("TenantShardSize", fmt.Sprintf("must be in [0, %d] (0 turns sharding off)", MaxTenantShard), o.TenantShardSize)
	case o.TenantShardStrict && o.TenantShardSize == 0:
		return bad("TenantShardStrict", "needs TenantShardSize > 0 (sharding is off)", o.TenantShardStrict)
	case o.StickyEntries < 0 || o.StickyEntries > MaxStickyEntries:
		return bad("StickyEntries", fmt.Sprintf("must be in [0, %d] (0 means the default)", MaxStickyEntries), o.StickyEntries)
	case o.BreakerProbes < 0 || o.BreakerProbes > math.MaxInt32:
		return bad("BreakerProbes", "must be in [0, 2^31-1]", o.BreakerProbes)
	case o.BreakerFailures > math.MaxInt32:
		return bad("BreakerFailures", "must be at most 2^31-1 (negative turns breaking off)", o.BreakerFailures)
	case o.EjectionTime < 0:
		return bad("EjectionTime", "must not be negative", o.EjectionTime)
	case o.MaxEjectionTime < 0:
		return bad("MaxEjectionTime", "must not be negative", o.MaxEjectionTime)
	case o.MaxEjectedFraction < 0 || o.MaxEjectedFraction > 1 || math.IsNaN(o.MaxEjectedFraction):
		return bad("MaxEjectedFraction", "must be in [0, 1]", o.MaxEjectedFraction)
	case o.OutlierMinRequests < 0:
		return bad("OutlierMinRequests", "must not be negative", o.OutlierMinRequests)
	case o.OutlierMargin < 0 || o.OutlierMargin > 1 || math.IsNaN(o.OutlierMargin):
		return bad("OutlierMargin", "must be in [0, 1]", o.OutlierMargin)
	case o.LatencyDecay < 0:
		return bad("LatencyDecay", "must not be negative", o.LatencyDecay)
	case o.ErrorDecay < 0:
		return bad("ErrorDecay", "must not be negative", o.ErrorDecay)
	case o.DefaultCooldown < 0:
		return bad("DefaultCooldown", "must not be negative", o.DefaultCooldown)
	case o.MaxCooldown < 0:
		return bad("MaxCooldown", "must not be negative", o.MaxCooldown)
	case o.NotServedMemory > MaxNotServedMemory:
		return bad("NotServedMemory", fmt.Sprintf("must be at most %v (negative turns it off)", MaxNotServedMemory), o.NotServedMemory)
	// A cap set below the value it caps, both set: one of them is a typo,
	// and the cap would silently win (cooldowns) or lose (ejections).
	case o.MaxCooldown > 0 && o.DefaultCooldown > o.MaxCooldown:
		return bad("MaxCooldown", fmt.Sprintf("must be at least DefaultCooldown (%v)", o.DefaultCooldown), o.MaxCooldown)
	case o.MaxEjectionTime > 0 && o.EjectionTime > o.MaxEjectionTime:
		return bad("MaxEjectionTime", fmt.Sprintf("must be at least EjectionTime (%v)", o.EjectionTime), o.MaxEjectionTime)
	}
	// One label cannot both list an endpoint's models and name its
	// data-parallel engine: the engine names ("0", "node-b") became the
	// models it served, and every call for a real model found no endpoint
	// (or only the unlabelled ones). Named is the field that was set.
	if sub, dp := cmp.Or(o.SubsetLabel, DefaultSubsetLabel), cmp.Or(o.DPGroupLabel, DefaultDPGroupLabel); sub == dp {
		if o.SubsetLabel != "" {
			return bad("SubsetLabel", fmt.Sprintf("must differ from DPGroupLabel (%q): one label cannot list models and name engines", dp), strconv.Quote(sub))
		}
		return bad("DPGroupLabel", fmt.Sprintf("must differ from SubsetLabel (%q): one label cannot list models and name engines", sub), strconv.Quote(dp))
	}
	// A bare number in a Duration is nanoseconds (TelemetryMaxAge: 30,
	// meant as seconds, made every reading stale): no setting here means
	// anything below a millisecond.
	for _, d := range [...]struct {
		field string
		v     time.Duration
	}{
		{"TelemetryMaxAge", o.TelemetryMaxAge}, {"LatencyDecay", o.LatencyDecay},
		{"ErrorDecay", o.ErrorDecay}, {"DefaultCooldown", o.DefaultCooldown},
		{"MaxCooldown", o.MaxCooldown}, {"NotServedMemory", o.NotServedMemory},
		{"SlowStartWindow", o.SlowStartWindow}, {"StickyTTL", o.StickyTTL},
		{"SpillMemory", o.SpillMemory}, {"EjectionTime", o.EjectionTime},
		{"MaxEjectionTime", o.MaxEjectionTime}, {"OutlierInterval", o.OutlierInterval},
	} {
		if d.v > 0 && d.v < minDuration {
			return bad(d.field, "must be 0 (the default) or at least 1ms (a bare number is nanoseconds)", d.v)
		}
	}
	for svc, s := range o.Scorers {
		if int(svc) >= inferlb.NumServices {
			return bad("Scorers", "names an unknown service", svc)
		}
		if s == nil {
			return bad("Scorers["+svc.String()+"]", "must not be nil", s)
		}
		if v, ok := s.(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				return &scorerError{svc: svc, err: err}
			}
		}
	}
	return nil
}

// scorerError names the Scorer whose own Validate failed.
type scorerError struct {
	svc inferlb.Service
	err error
}

func (e *scorerError) Error() string {
	return fmt.Sprintf("inferlb: balancer.Options.Scorers[%s]: %s", e.svc, strings.TrimPrefix(e.err.Error(), "inferlb: "))
}

func (e *scorerError) Unwrap() error { return e.err }

func (o *Options) resolve() (*config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &config{
		clock:           o.Clock,
		rand:            o.Rand,
		store:           o.Telemetry,
		telemetryMaxAge: durationOr(o.TelemetryMaxAge, DefaultTelemetryMaxAge),
		latencyDecay:    durationOr(o.LatencyDecay, DefaultLatencyDecay),
		errorAlpha:      floatOr(o.ErrorAlpha, DefaultErrorAlpha),
		errorDecay:      durationOr(o.ErrorDecay, DefaultErrorDecay),
		panicThreshold:  floatOr(o.PanicThreshold, DefaultPanicThreshold),
		cooldown:        durationOr(o.DefaultCooldown, DefaultCooldown),
		maxCooldown:     durationOr(o.MaxCooldown, DefaultMaxCooldown),
		notServedTTL:    max(durationOr(o.NotServedMemory, DefaultNotServedMemory), 0),
		slowStart:       durationOr(o.SlowStartWindow, DefaultSlowStartWindow),
		slowStartMin:    floatOr(o.SlowStartMinWeight, DefaultSlowStartMin),
		slowStartAggr:   floatOr(o.SlowStartAggression, 1),
		subsetLabel:     o.SubsetLabel,
		retryRatio:      max(floatOr(o.RetryRatio, DefaultRetryRatio), 0),
		retryFloor:      max(floatOr(o.RetryFloor, DefaultRetryFloor), 0),

		affinity:      o.Affinity,
		loadBound:     floatOr(o.LoadBound, DefaultLoadBound),
		affinitySeed:  o.AffinitySeed,
		loadBoundHard: unqueuedSlack * floatOr(o.LoadBound, DefaultLoadBound),
		stickyTTL:     o.StickyTTL,
		stickyEntries: o.StickyEntries,
		tenantShard:   o.TenantShardSize,
		tenantStrict:  o.TenantShardStrict,
		spillTTL:      max(durationOr(o.SpillMemory, DefaultSpillMemory), 0),
		minKeyReuse:   floatOr(o.MinKeyReuse, DefaultMinKeyReuse),
		adapterHomes:  floatOr(o.AdapterHomes, DefaultAdapterHomes),

		breakerFailures:    intOr(o.BreakerFailures, DefaultBreakerFailures),
		breakerProbes:      intOr(o.BreakerProbes, DefaultBreakerProbes),
		ejectionTime:       durationOr(o.EjectionTime, DefaultEjectionTime),
		maxEjectionTime:    durationOr(o.MaxEjectionTime, DefaultMaxEjectionTime),
		maxEjected:         floatOr(o.MaxEjectedFraction, DefaultMaxEjectedFraction),
		outlierInterval:    durationOr(o.OutlierInterval, DefaultOutlierInterval),
		outlierMinRequests: intOr(o.OutlierMinRequests, DefaultOutlierMinRequests),
		outlierMargin:      floatOr(o.OutlierMargin, DefaultOutlierMargin),
		onEvent:            o.OnEvent,
	}
	// A cap below its base's default, with the base unset, lowers the
	// base: raised to the default instead, the cap the caller set was
	// ignored without a word. A base above its cap's default, with the
	// cap unset, raises the cap. (Both set, Validate saw to the order.)
	if o.EjectionTime == 0 {
		c.ejectionTime = min(c.ejectionTime, c.maxEjectionTime)
	}
	if o.DefaultCooldown == 0 {
		c.cooldown = min(c.cooldown, c.maxCooldown)
	}
	c.maxEjectionTime = max(c.maxEjectionTime, c.ejectionTime)
	c.maxCooldown = max(c.maxCooldown, c.cooldown)
	// A probation ends up to twice MaxCooldown ahead (a cooldown, then a
	// probation as long; see Balancer.cooldown).
	c.horizon = 2 * int64(min(max(2*min(c.maxCooldown, maxHold), c.maxEjectionTime), maxHold)) // bounded: at-horizon must not wrap
	if c.clock == nil {
		c.mono = newMonoClock()
		c.clock = c.mono
	}
	if c.mono == nil {
		c.monoSrc, _ = c.clock.(MonotonicClock)
	}
	if c.affinitySeed == 0 {
		c.affinitySeed = processSeed()
	}
	if c.rand == nil {
		c.rand = runtimeRand{}
	}
	if c.store == nil {
		// Its clock is the Balancer's, so the Store tells samples from the
		// future (a clock stepped back) by the same clock that stamps them.
		c.store = &telemetry.Store{Clock: c.clock}
	}
	if c.telemetryMaxAge < 0 {
		c.telemetryMaxAge = 0 // Slot.LoadInto: keep all
	}
	// A Poller publishing into the Store directly (one shared by
	// several Balancers) counts what this Balancer will never read as
	// arrived stale, as Publish does.
	c.store.ReadWithin(c.telemetryMaxAge)
	if c.subsetLabel == "" {
		c.subsetLabel = DefaultSubsetLabel
	}
	c.dpLabel = o.DPGroupLabel
	if c.dpLabel == "" {
		c.dpLabel = DefaultDPGroupLabel
	}
	for svc := range inferlb.NumServices {
		c.scorers[svc] = scoring.DefaultFor(inferlb.Service(svc))
	}
	for svc, s := range o.Scorers {
		c.scorers[svc] = s
	}
	for svc, s := range c.scorers {
		l, ok := s.(*scoring.LLM)
		c.slotWaits[svc] = ok && l.LoRAWait != 1
		fs, ok := s.(scoring.FullScanner)
		c.fullScan[svc] = ok && fs.FullScan() && o.ScanLimit >= 0
	}
	c.scanLimit = intOr(o.ScanLimit, DefaultScanLimit)
	return c, nil
}
