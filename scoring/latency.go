package scoring

import (
	"time"

	"github.com/inferlb/inferlb"
)

// DefaultLatencyPrior is the latency assumed for an endpoint with no history.
const DefaultLatencyPrior = 50 * time.Millisecond

// Latency scores short, uniform calls (embeddings, rerankers) on recent
// latency: peak-EWMA latency x (in-flight + 1) / weight, the cost function of
// Finagle's and Linkerd's P2C-PeakEWMA balancers. Peak-EWMA jumps up to a slow
// response at once and decays slowly, so one slow replica is avoided quickly.
// With two or more calls out and none finished for longer than that latency
// (State.Pending), the wait is the latency: an endpoint whose calls hang
// stops drawing calls as its wait grows, where an EWMA fed only by finished
// calls would price it as fast as before.
// The zero value uses the documented defaults.
type Latency struct {
	// Prior is the latency assumed for an endpoint with no history while
	// calls to it are in flight. Default DefaultLatencyPrior. With none in
	// flight such an endpoint costs least, so it is probed (as Finagle's
	// PeakEwma does): priced at the prior, it would lose every comparison
	// to a peer faster than the prior and never be measured, so a replica
	// added to a fleet of fast embedders would get no traffic at all. Its
	// EWMA decayed while idle, an endpoint is probed the same way; once
	// calls are out to it, or while it has a recent error rate, it is
	// priced at least at its last EWMA, or at the prior if that is less.
	// The balancer counts an endpoint with one answer as without
	// history (see State.LatencyEWMA), so a slow first call, which paid
	// for a new connection, does not keep it out of rotation until its
	// EWMA has decayed below its peers'.
	Prior time.Duration
	// ErrorPenalty scales the odds of failure into a multiplier, as in LLM. Default 10.
	ErrorPenalty float64
}

// FullScan implements FullScanner: a Latency cost is this process's own
// view of an endpoint.
func (l *Latency) FullScan() bool { return true }

// Cost implements Scorer.
func (l *Latency) Cost(_ *inferlb.Request, s State) float64 {
	lat := s.Latency()
	prior := l.Prior
	if prior <= 0 {
		prior = DefaultLatencyPrior
	}
	// An endpoint with a recent error rate is not idle either: only
	// successes feed its latency, so one failing its calls fast has an
	// EWMA that decays to nothing, or none at all, and priced as a probe
	// it took every pick that drew it.
	measuring := s.InFlight > 0 || s.ErrorRate > 0
	switch {
	case s.LatencyEWMA <= 0 && measuring:
		lat = prior
	case measuring:
		// An EWMA that decayed while the endpoint was idle makes it the
		// next probe (as intended), but once calls are out to it, it is
		// being measured: priced by what is left of its EWMA, an
		// endpoint idle for a few time constants would cost about nothing
		// whatever its in-flight count, and take every pick that drew it
		// until its first answer came back. It is priced at least at its
		// last EWMA, or the prior if that is less.
		lat = max(lat, min(s.LatencyEWMA, prior))
	}
	// Calls out for longer than that, with none finished since, say the
	// endpoint is at least that slow now: its calls may hang (a stuck
	// GPU, a dead connection the kernel has not noticed), and neither the
	// EWMA, fed only by finished calls, nor the floor above moves while
	// they do, so a stuck endpoint kept drawing calls until it held as
	// many as its peers (several times that, floored at a prior below its
	// EWMA). One call alone out is left to the EWMA: a single slow call
	// on an endpoint that serves others meanwhile is an outlier, and
	// counted, its wait took the endpoint out of rotation until it ended.
	if s.InFlight >= 2 {
		lat = max(lat, s.Pending)
	}
	// With nothing in flight, an EWMA that decayed to nothing, or none yet,
	// makes it the next probe; the floor keeps in-flight meaningful.
	lat = max(lat, time.Microsecond)
	cost := lat.Seconds() * (float64(max(s.InFlight, 0)) + 1) / s.weight()
	return reliability(cost, l.ErrorPenalty, s.ErrorRate)
}

// LeastLoaded scores on in-flight requests per unit of capacity, with
// reliability as in LLM. It is the default for ServiceUnknown.
//
// It keeps two random choices rather than scanning every endpoint
// (FullScanner), though its cost is this process's alone: in the fleet
// simulator a scan on calls in flight gave better medians, but with one
// replica four times slower it kept that replica's share of long calls
// and the end-to-end p99 rose from 38.5 s to 52.0 s (chat, the failures
// scenario's slow replica alone; FLEETSIM_WHATIF=1 go test -run
// TestLeastLoadedScanWhatIf -v ./benchmarks/fleetsim/). Latency, which
// prices the slow replica's seconds too, scans.
type LeastLoaded struct {
	// ErrorPenalty scales the odds of failure (rate / (1 - rate)) into a
	// multiplier, as in LLM. Default 10.
	ErrorPenalty float64
}

// Cost implements Scorer.
func (l *LeastLoaded) Cost(_ *inferlb.Request, s State) float64 {
	return reliability((float64(max(s.InFlight, 0))+1)/s.weight(), l.ErrorPenalty, s.ErrorRate)
}
