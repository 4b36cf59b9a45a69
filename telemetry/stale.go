package telemetry

import (
	"errors"
	"fmt"
	"time"
)

// AgingSink is a Sink whose readers ignore a sample observed more than
// TelemetryMaxAge before now. A balancer.Balancer is one (its
// Options.TelemetryMaxAge), and so is a Store (the largest max age its
// readers declared with ReadWithin). A Poller publishing into an AgingSink
// counts the samples already that old as it publishes them
// (PollerStats.Stale) and reports them through PollerOptions.OnError
// (StaleSamplesError): a Source whose readings arrive too old to use (a
// Prometheus server scraping once a minute, read through promapi, against
// the default 30 s) otherwise leaves every endpoint scored without
// telemetry, and only a counter says so.
type AgingSink interface {
	Sink
	// TelemetryMaxAge returns the age past which the Sink's readers ignore
	// a sample, or 0 (or less) when some reader keeps every sample
	// whatever its age. A Poller calls it once a round.
	TelemetryMaxAge() time.Duration
}

// ErrStaleSamples is what errors.Is matches in the error a Poller reports
// (a *StaleSamplesError) when samples it published were already older than
// its Sink's TelemetryMaxAge.
var ErrStaleSamples = errors.New("telemetry: samples arrived stale")

// staleReportEvery is how often at most a Poller reports stale samples
// through OnError while they go on arriving. Their age moves with the
// Source's own scrape times from round to round, so a Source that scrapes
// about as often as the max age sends some rounds stale and others not: a
// report at every change would come every few rounds.
const staleReportEvery = 10 * time.Minute

// StaleSamplesError is reported through PollerOptions.OnError when a
// round's samples were already older than the Sink's TelemetryMaxAge as
// they were published (an AgingSink): the Sink keeps them but no reader
// uses them, so the endpoints they describe are scored as without
// telemetry. It comes at the first round with any, then at most once every
// 10 minutes while they go on (counting those in between: Since). It does
// not fail the round. errors.Is(err, ErrStaleSamples) matches it.
type StaleSamplesError struct {
	// Stale counts the round's samples that arrived stale, of Published
	// handed to the Sink.
	Stale, Published int
	// Oldest is the age of the round's oldest stale sample as it was
	// published: how far behind the Source's readings are.
	Oldest time.Duration
	// MaxAge is the Sink's TelemetryMaxAge.
	MaxAge time.Duration
	// Since counts the samples that arrived stale since the last report,
	// this round's included.
	Since uint64
}

// Error says how old the readings were, against what, and the fix.
func (e *StaleSamplesError) Error() string {
	s := fmt.Sprintf("telemetry: %d of %d samples arrived stale: the oldest was observed %v before it was published, and the Sink ignores readings older than %v", e.Stale, e.Published, e.Oldest, e.MaxAge)
	if e.Since > uint64(e.Stale) {
		s += fmt.Sprintf(" (%d stale since the last report)", e.Since)
	}
	return s + "; the endpoints they describe are scored without them: raise TelemetryMaxAge above the Source's scrape interval plus a round's duration, or have it scrape more often"
}

// Is reports whether target is ErrStaleSamples.
func (e *StaleSamplesError) Is(target error) bool { return target == ErrStaleSamples }

// reportStale counts a round's stale samples (stale of sent, the oldest
// that old against maxAge, at now) and reports them through OnError at the
// first round with any and then at most once every staleReportEvery.
func (p *Poller) reportStale(stale, sent int, oldest, maxAge time.Duration, now time.Time) {
	if stale == 0 {
		return
	}
	p.stale.Add(uint64(stale))
	p.staleSince += uint64(stale)
	if !p.lastStaleReport.IsZero() && now.Sub(p.lastStaleReport) < staleReportEvery && !now.Before(p.lastStaleReport) {
		return
	}
	p.lastStaleReport = now
	e := &StaleSamplesError{Stale: stale, Published: sent, Oldest: oldest, MaxAge: maxAge, Since: p.staleSince}
	p.staleSince = 0
	p.report(e)
}
