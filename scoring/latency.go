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
// The zero value uses the documented defaults.
type Latency struct {
	// Prior is the latency assumed for an endpoint with no history while
	// calls to it are in flight. Default DefaultLatencyPrior. With none in
	// flight such an endpoint costs least, so it is probed (as Finagle's
	// PeakEwma does): priced at the prior, it would lose every comparison
	// to a peer faster than the prior and never be measured, so a replica
	// added to a fleet of fast embedders would get no traffic at all.
	Prior time.Duration
	// ErrorPenalty scales the error rate into a multiplier, as in LLM. Default 10.
	ErrorPenalty float64
}

// Cost implements Scorer.
func (l *Latency) Cost(_ *inferlb.Request, s State) float64 {
	lat := s.Latency()
	prior := l.Prior
	if prior <= 0 {
		prior = DefaultLatencyPrior
	}
	if s.LatencyEWMA <= 0 && s.InFlight > 0 {
		lat = prior
	}
	// An EWMA that decayed to nothing while the endpoint was idle, or none
	// yet, makes it the next probe (as intended); the floor keeps in-flight
	// meaningful.
	lat = max(lat, time.Microsecond)
	cost := lat.Seconds() * (float64(max(s.InFlight, 0)) + 1) / s.weight()
	return reliability(cost, l.ErrorPenalty, s.ErrorRate)
}

// LeastLoaded scores on in-flight requests per unit of capacity, with
// reliability as in LLM. It is the default for ServiceUnknown.
type LeastLoaded struct {
	// ErrorPenalty scales the error rate into a multiplier. Default 10.
	ErrorPenalty float64
}

// Cost implements Scorer.
func (l *LeastLoaded) Cost(_ *inferlb.Request, s State) float64 {
	return reliability((float64(max(s.InFlight, 0))+1)/s.weight(), l.ErrorPenalty, s.ErrorRate)
}
