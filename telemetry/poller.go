package telemetry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// Defaults for PollerOptions. Each is what the zero value of its field means.
const (
	// DefaultPollInterval is the scrape interval of Prometheus' example
	// configuration (Prometheus' own default is 1m), so a poller sees each
	// exporter update about once.
	DefaultPollInterval = 15 * time.Second
	// DefaultPollJitter spreads replicas that started together (a rollout)
	// so they do not scrape an exporter in lockstep.
	DefaultPollJitter = 0.1
	// DefaultMaxBackoff caps the delay after repeated failures: a source that
	// comes back is noticed within a minute. A round fails only when no
	// target answers (a fleet rolled out at once, each replica loading its
	// weights for minutes), and polling a fleet that is down once a minute
	// costs it nothing, where a longer cap left the balancer routing
	// without telemetry for minutes after the fleet was back.
	DefaultMaxBackoff = time.Minute
)

// The least Interval and Timeout a PollerOptions may set. Below them the
// value is a slip of units (Interval: 15, meaning seconds, is 15ns) rather
// than a choice: a round scrapes servers over HTTP, which takes
// milliseconds, so every round would time out and no reading arrive.
// Routers that scrape their own fleet poll as often as every 50ms (llm-d's
// endpoint picker), which the floor leaves room for.
const (
	minPollInterval = 10 * time.Millisecond
	minPollTimeout  = time.Millisecond
)

// Clock tells a Poller the time used to stamp samples. Tests inject one; nil
// means the wall clock.
type Clock interface {
	Now() time.Time
}

// PollerOptions configure a Poller. The zero value polls every
// DefaultPollInterval with DefaultPollJitter, a timeout of a third of the interval and
// backoff up to DefaultMaxBackoff, and an early round no sooner than
// Interval/4 after the last.
type PollerOptions struct {
	// Interval is the delay between rounds that succeed. Default
	// DefaultPollInterval; set, at least 10ms.
	Interval time.Duration
	// Jitter spreads each delay uniformly over ±Jitter of it, in [0, 1),
	// and delays each early round (MinInterval) by up to Jitter x
	// MinInterval. Default DefaultPollJitter; negative means none.
	Jitter float64
	// Timeout bounds one Collect; set, at least 1ms. Default: Interval/3
	// (5 s at the default Interval; Prometheus' scrape timeout is a sixth
	// of its interval). A
	// round publishes when its last target answers or Timeout cuts it,
	// and its readings are as old as its start, so one hung target (a
	// node gone down) ages every endpoint's readings by Timeout: the
	// oldest a reading gets before the next arrives is 2 x Timeout +
	// Interval x (1 + Jitter), 26.5 s by default, within a Balancer's
	// default TelemetryMaxAge (30 s). A Timeout of one Interval, the
	// default before, left every endpoint without telemetry for half the
	// time while one target hung. Set it above Interval/3 only with a
	// TelemetryMaxAge above that sum.
	Timeout time.Duration
	// MaxBackoff caps the delay after consecutive failures, which doubles
	// from Interval on each one. Default DefaultMaxBackoff; it is raised to
	// Interval if smaller.
	MaxBackoff time.Duration
	// MinInterval is the least time from the start of a round to the start
	// of an early one. A Poller whose Sink is an ExpiryNotifier (a Store, a
	// balancer.Balancer) runs its next round early when the Sink drops
	// readings (a gRPC reconnect, a failure exclusion): at once, or
	// MinInterval after the last round started if that is later, plus a
	// random delay of up to Jitter x MinInterval (a server's restart
	// reconnects every client process at once: without it their Pollers
	// would all scrape the fleet in the same instant); drops before that
	// round come to one round. The gap bounds the extra load on the
	// Source when the connections to many endpoints are rotated one after
	// another: at most Interval/MinInterval rounds per Interval. Default
	// Interval/4: at most four times the usual load, and dropped readings
	// scraped again within 4.125 s (3.75 s and its 10% jitter) at the
	// default Interval and Jitter. No early round follows a failed one:
	// the Source did not answer, and backoff stands. Negative means no early rounds: choose it for a Source that
	// reads through Prometheus (promapi), whose early round would return
	// the scrape Prometheus took before the drop, which the Store refuses
	// as the old process's (dropped_old).
	MinInterval time.Duration
	// Clock stamps samples a Source left without a time. nil means the wall clock.
	Clock Clock
	// Rand draws the jitter. nil means math/rand/v2's runtime generator.
	Rand rand.Source
	// OnError, if set, is called with each failed or partial round's error
	// (for logging), but not a round cut short because its context ended:
	// stopping the Poller is no target's failure. It runs on the polling
	// goroutine and must not block.
	//
	// It is called too, with an *UnknownEndpointsError (errors.Is
	// ErrUnknownEndpoint), when the Sink is a KnownSink (a
	// balancer.Balancer) that dropped some of a round's samples for IDs it
	// knows no endpoint by: a target named "10.0.0.5:8000" where the
	// endpoint's Addr is "http://10.0.0.5:8000". The error names up to 3 of
	// those IDs and 3 the Sink knows. It comes at the first round that drops
	// any, and again only when a round drops a different number of samples
	// or a different first ID than the last round that published, so one
	// misnamed target is reported once, not at every Interval; a round
	// scraping an endpoint that has just left reports it too. It neither
	// fails the round nor counts in Partial: the Source answered.
	//
	// It is called too, with a *StaleSamplesError (errors.Is
	// ErrStaleSamples), when the Sink is an AgingSink (a
	// balancer.Balancer) and some of a round's samples were already older
	// than its TelemetryMaxAge as they were published: a Source that
	// scrapes less often than that. It comes at the first round with any,
	// then at most once every 10 minutes while they go on, and does not
	// fail the round either.
	OnError func(error)
}

// PollerStats counts what a Poller did. Errors are counted, never fatal.
type PollerStats struct {
	Rounds    uint64 // Collect calls
	Failures  uint64 // rounds that returned an error and no usable result (includes timeouts that left none)
	Timeouts  uint64 // rounds cut short by Timeout, failed or partial
	Partial   uint64 // rounds that returned observations with an ErrPartial error
	Published uint64 // samples handed to the Sink
	Skipped   uint64 // observations without an endpoint ID or a field
	// Unknown counts the samples of Published that the Sink dropped as
	// being for an endpoint it does not know (a KnownSink, such as a
	// balancer.Balancer; see UnknownEndpointsError). Always 0 for a Sink
	// that is not a KnownSink (a Store keeps every ID).
	Unknown uint64
	// Early counts rounds run ahead of their Interval because the Sink
	// dropped readings (MinInterval): the extra load on the Source.
	Early uint64
	// Stale counts the samples of Published that were already older than
	// the Sink's TelemetryMaxAge as they were published (an AgingSink,
	// such as a balancer.Balancer; see StaleSamplesError): no reader uses
	// them. The Poller judges by the sample's time, not by what the Sink
	// did with it, so one the Sink dropped for holding a newer reading of
	// its fields (StoreStats.DroppedOld: a load header's beside a
	// Prometheus scrape's) counts here too, and can leave this above the
	// Store's ArrivedStale. Always 0 for a Sink that is not an AgingSink.
	Stale uint64
	// ConsecutiveFailures is the current run of failed rounds (0 after a success).
	ConsecutiveFailures uint64
}

// Poller calls a Source periodically and publishes what it returns into a
// Sink. Rounds never overlap. After a failed round the next delay doubles
// (exponential backoff, capped at MaxBackoff) and a successful round resets
// it; every delay is jittered. When the Sink drops readings (ExpiryNotifier),
// the next round starts early, MinInterval after the last one started or at
// once if that has passed, delayed by up to Jitter x MinInterval so that
// clients woken together (a server's restart) do not scrape together. A Poller never stops on an error: telemetry is
// advisory, and a source that is down now may be back at the next round.
//
// A Sink that keeps samples only for the endpoints it knows (a
// balancer.Balancer, a KnownSink) drops those for any other ID; the
// Poller counts them (PollerStats.Unknown) and tells OnError of them
// (UnknownEndpointsError), so a Source whose targets are named otherwise
// than the endpoints does not go unnoticed. A round whose IDs are all known
// allocates nothing for this.
//
// Stats may be called from any goroutine while Run is going; Run may be
// active in only one goroutine at a time (ErrPollerRunning).
type Poller struct {
	// Concurrency: src, sink and the options are immutable after
	// NewPoller; the counters are atomic.

	src  Source
	sink Sink
	opts PollerOptions

	running atomic.Bool

	rounds, failures, timeouts, partial, published, skipped, streak, early, unknown, stale atomic.Uint64

	// The unknown IDs of the last round that published (reportUnknown),
	// and the stale samples since the last report of them (reportStale):
	// touched by Poll only, which never runs concurrently with itself.
	lastDropped      int
	lastFirstUnknown string
	lastStaleReport  time.Time
	staleSince       uint64
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

type runtimeRand struct{}

func (runtimeRand) Uint64() uint64 { return rand.Uint64() }

// NewPoller validates opts (and src, when it is a Validator), applies the
// defaults and returns a Poller that reads src and publishes into sink.
func NewPoller(src Source, sink Sink, opts PollerOptions) (*Poller, error) {
	switch {
	case src == nil:
		return nil, errors.New("telemetry: NewPoller: Source is nil")
	case sink == nil:
		return nil, errors.New("telemetry: NewPoller: Sink is nil")
	case opts.Interval < 0:
		return nil, fmt.Errorf("telemetry: PollerOptions.Interval is %v, want >= 0", opts.Interval)
	case opts.Interval > 0 && opts.Interval < minPollInterval:
		return nil, fmt.Errorf("telemetry: PollerOptions.Interval is %v, want 0 (the default) or at least %v (a bare number is nanoseconds)", opts.Interval, minPollInterval)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("telemetry: PollerOptions.Timeout is %v, want >= 0", opts.Timeout)
	case opts.Timeout > 0 && opts.Timeout < minPollTimeout:
		return nil, fmt.Errorf("telemetry: PollerOptions.Timeout is %v, want 0 (the default) or at least %v (a bare number is nanoseconds)", opts.Timeout, minPollTimeout)
	case opts.MaxBackoff < 0:
		return nil, fmt.Errorf("telemetry: PollerOptions.MaxBackoff is %v, want >= 0", opts.MaxBackoff)
	case opts.Jitter >= 1 || math.IsNaN(opts.Jitter):
		return nil, fmt.Errorf("telemetry: PollerOptions.Jitter is %v, want < 1", opts.Jitter)
	}
	if v, ok := src.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("telemetry: NewPoller: %w", err)
		}
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultPollInterval
	}
	switch {
	case opts.Jitter == 0:
		opts.Jitter = DefaultPollJitter
	case opts.Jitter < 0:
		opts.Jitter = 0
	}
	if opts.Timeout == 0 {
		opts.Timeout = opts.Interval / 3
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.Interval)
	if opts.MinInterval == 0 {
		opts.MinInterval = opts.Interval / 4
	}
	if opts.Clock == nil {
		opts.Clock = wallClock{}
	}
	if opts.Rand == nil {
		opts.Rand = runtimeRand{}
	}
	return &Poller{src: src, sink: sink, opts: opts}, nil
}

// ErrPollerRunning is returned by Run when the Poller is already running.
var ErrPollerRunning = errors.New("telemetry: Poller is already running")

// Run polls until ctx is done, starting with an immediate round so routing
// has telemetry as soon as possible, and returns ctx's error. It starts no
// goroutine of its own. Its schedule (Interval, backoff, MinInterval) runs
// on the runtime's timers; Clock only stamps samples.
func (p *Poller) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrPollerRunning
	}
	defer p.running.Store(false)
	notifier, _ := p.sink.(ExpiryNotifier)
	if p.opts.MinInterval < 0 {
		notifier = nil // no early rounds
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		wake       <-chan struct{} // closed when the Sink drops readings; nil when not waiting on it
		start, due time.Time       // when the last round started; when the timer fires
		early      bool            // the timer was brought forward by a wake
	)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
			// Readings were dropped: scrape them again as soon as
			// MinInterval after the last round's start allows, plus a
			// jittered delay: a server's restart reconnects every client
			// process at once, whose Pollers would otherwise all scrape
			// the fleet in the same instant.
			wake = nil
			soon := time.Now()
			if s := start.Add(p.opts.MinInterval); s.After(soon) {
				soon = s
			}
			soon = soon.Add(p.earlyJitter())
			if soon.Before(due) {
				due, early = soon, true
				timer.Reset(time.Until(soon))
			}
			continue
		case <-timer.C:
		}
		if early {
			p.early.Add(1)
			early = false
		}
		if notifier != nil {
			// Taken before the round: a drop while it runs (its scrape,
			// taken before, is then refused as the old process's) asks
			// for another.
			wake = notifier.Expired()
		}
		start = time.Now()
		ok := p.Poll(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := p.nextDelay(ok)
		due = time.Now().Add(d)
		timer.Reset(d)
		if !ok {
			wake = nil // backing off: the Source did not answer
		}
	}
}

// Poll runs one round: Collect under Timeout, then Publish every usable
// observation. It reports whether the round succeeded (a partial result
// counts as success: the source answered). Run calls it; tests and callers
// that schedule rounds themselves may too, but not concurrently with Run or
// with another Poll: it compares a round's unknown endpoint IDs with the
// last round's (OnError).
func (p *Poller) Poll(ctx context.Context) bool {
	p.rounds.Add(1)
	start := p.opts.Clock.Now()
	cctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	obs, err := p.src.Collect(cctx)
	timedOut := errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	cancel()

	if err != nil && (!errors.Is(err, ErrPartial) || len(obs) == 0) {
		if ctx.Err() != nil {
			return false // shutting down: not the source's fault
		}
		p.failures.Add(1)
		p.streak.Add(1)
		if timedOut {
			p.timeouts.Add(1)
			err = fmt.Errorf("telemetry: poll timed out after %v: %w", p.opts.Timeout, err)
		}
		p.report(err)
		return false
	}
	if err != nil && ctx.Err() == nil { // targets cut short by shutting down are no fault of theirs
		p.partial.Add(1)
		if timedOut {
			// Cut short too: the targets that answered waited for the
			// one that did not (a node gone down) until the deadline.
			p.timeouts.Add(1)
			err = fmt.Errorf("telemetry: poll timed out after %v: %w", p.opts.Timeout, err)
		}
		p.report(err)
	}
	p.streak.Store(0)
	known, _ := p.sink.(KnownSink)
	var (
		maxAge time.Duration // the Sink's, when it declares one
		stale  int           // samples published older than maxAge
		oldest time.Duration // the oldest of them
	)
	if a, ok := p.sink.(AgingSink); ok {
		maxAge = a.TelemetryMaxAge()
	}
	var (
		end     time.Time
		unknown [maxNamedIDs]string // the first distinct unknown IDs; on the stack
		nu      int                 // how many of unknown are set
		dropped int                 // samples the Sink dropped as unknown
		sent    int                 // samples handed to the Sink
		more    bool                // more distinct unknown IDs than unknown holds
	)
	for _, o := range obs {
		if o.EndpointID == "" || o.Sample.Empty() {
			p.skipped.Add(1)
			continue
		}
		if o.Sample.Time.IsZero() {
			// The round's start, not its end: values are at least this old,
			// so they expire no later than they should.
			o.Sample.Time = start
		} else {
			// A source's own time (a Prometheus scrape's, a federated
			// sample's) from a clock that runs ahead of ours would be newer than any local
			// reading for as long as it is ahead: the Store would keep it
			// over fresher ones and never age it out. It is read as now.
			if end.IsZero() {
				end = p.opts.Clock.Now()
			}
			if o.Sample.Time.After(end) {
				o.Sample.Time = end
			}
		}
		p.sink.Publish(o.EndpointID, o.Sample)
		p.published.Add(1)
		sent++
		// Asked after Publish, not through a Publish that reports it: a
		// Sink that embeds a Balancer to wrap its Publish would have its
		// own Publish passed over.
		if known == nil || known.Known(o.EndpointID) {
			// A sample without a usable time (the Unix epoch a Source
			// wrote for a missing timestamp) is dropped by the Store as
			// such (DroppedEmpty), not kept stale: not counted here.
			if maxAge > 0 && o.Sample.usable() {
				if end.IsZero() {
					end = p.opts.Clock.Now()
				}
				if age := end.Sub(o.Sample.Time); age > maxAge {
					stale++
					oldest = max(oldest, age)
				}
			}
			continue
		}
		dropped++
		if !slices.Contains(unknown[:nu], o.EndpointID) {
			if nu < len(unknown) {
				unknown[nu] = o.EndpointID
				nu++
			} else {
				more = true
			}
		}
	}
	if dropped > 0 {
		p.unknown.Add(uint64(dropped))
	}
	p.reportUnknown(known, dropped, sent, unknown[:nu], more)
	p.reportStale(stale, sent, oldest, maxAge, end)
	return true
}

// reportUnknown reports through OnError a round whose samples the Sink
// dropped as unknown (dropped of sent; ids the first of them), when it
// differs from the round before that published: in how many were dropped,
// or in the first unknown ID. A Source that names its targets otherwise
// than the Balancer names its endpoints does so at every round, and a
// report at each (every 15 s by default) would flood a log with one
// mistake; once per change still tells of it when the Poller starts and
// when it gets worse, better, or comes back after a round without it.
// Every drop is counted all the same (PollerStats.Unknown,
// StoreStats.DroppedUnknown).
func (p *Poller) reportUnknown(sink KnownSink, dropped, sent int, ids []string, more bool) {
	var first string
	if len(ids) > 0 {
		first = ids[0]
	}
	if dropped == p.lastDropped && first == p.lastFirstUnknown {
		return // as the round before: reported then, or nothing to report
	}
	p.lastDropped, p.lastFirstUnknown = dropped, first
	if dropped == 0 || p.opts.OnError == nil {
		return
	}
	e := &UnknownEndpointsError{Dropped: dropped, Published: sent, IDs: slices.Clone(ids), moreIDs: more}
	if c, ok := sink.(interface{ Closed() bool }); ok && c.Closed() {
		e.SinkClosed = true
		p.opts.OnError(e)
		return
	}
	if known := sink.KnownIDs(maxNamedIDs + 1); len(known) > maxNamedIDs {
		e.Known, e.moreKnown = known[:maxNamedIDs], true
	} else {
		e.Known = known
	}
	p.opts.OnError(e)
}

func (p *Poller) report(err error) {
	if p.opts.OnError != nil {
		p.opts.OnError(err)
	}
}

// nextDelay is Interval after a success, Interval·2^n after n consecutive
// failures (capped at MaxBackoff), jittered by ±Jitter.
func (p *Poller) nextDelay(ok bool) time.Duration {
	d := p.opts.Interval
	if !ok {
		for n := p.streak.Load(); n > 0 && d < p.opts.MaxBackoff; n-- {
			if d > p.opts.MaxBackoff/2 {
				d = p.opts.MaxBackoff // doubling would pass the cap (or overflow)
				break
			}
			d *= 2
		}
	}
	if j := p.opts.Jitter; j > 0 {
		u := float64(p.opts.Rand.Uint64()>>11) / (1 << 53) // [0, 1)
		// In float, bounded before converting: a delay near the largest
		// Duration must not overflow into a negative one.
		d = time.Duration(min(float64(d)*(1+j*(2*u-1)), float64(math.MaxInt64/2)))
	}
	return max(d, time.Millisecond)
}

// earlyJitter is the delay added to an early round: uniform in
// [0, Jitter·MinInterval).
func (p *Poller) earlyJitter() time.Duration {
	j := p.opts.Jitter
	if j <= 0 {
		return 0
	}
	u := float64(p.opts.Rand.Uint64()>>11) / (1 << 53) // [0, 1)
	return time.Duration(u * j * float64(p.opts.MinInterval))
}

// Stats returns the counters.
func (p *Poller) Stats() PollerStats {
	return PollerStats{
		Rounds:              p.rounds.Load(),
		Failures:            p.failures.Load(),
		Timeouts:            p.timeouts.Load(),
		Partial:             p.partial.Load(),
		Published:           p.published.Load(),
		Skipped:             p.skipped.Load(),
		Unknown:             p.unknown.Load(),
		Early:               p.early.Load(),
		Stale:               p.stale.Load(),
		ConsecutiveFailures: p.streak.Load(),
	}
}
