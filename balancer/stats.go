package balancer

import (
	"slices"
	"strings"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// EndpointStats is a point-in-time view of one endpoint's live state, for
// metrics, debugging and tests.
type EndpointStats struct {
	ID    string
	Ready bool // ready in at least one membership that lists it
	// ExcludedUntil is when the endpoint's exclusion from rotation ends: a
	// breaker trip or failed probe, an outlier ejection or an overload
	// cooldown, whichever ends last (they extend one deadline); zero when
	// none is in force. A breaker past it is half-open and takes only its
	// probes (BreakerOpen stays true).
	ExcludedUntil time.Time
	// EjectedUntil is when the outlier ejection in force ends, zero with
	// none; ExcludedUntil is at least it. An exclusion with BreakerOpen
	// false and no ejection in force is an overload cooldown.
	EjectedUntil time.Time
	// ProbationUntil is when the endpoint stops being second choice after
	// an overload cooldown (see Options.DefaultCooldown), zero when it is
	// not; past ExcludedUntil while it is. OverloadStreak is its overload
	// answers in a row to calls sent after its cooldown ended, which
	// lengthen the probation; 0 once it serves such a call.
	ProbationUntil time.Time
	OverloadStreak int
	Weight         float64 // capacity weight (Endpoint.Capacity)
	RampFactor     float64 // slow-start fraction of Weight now, 1 when done
	InFlight       int64
	InFlightTokens int64
	// Latency is the peak-EWMA of successful calls' latency as last
	// observed (not decayed; raised by the waits of embedding and rerank
	// calls abandoned with no answer, Outcome.Unanswered), for the service
	// of the latest such call:
	// each service keeps its own (ServiceLatency), as the scorers read
	// them, so on an endpoint that serves chats and embeddings alike an
	// embedding is not priced by a chat's seconds. After an endpoint's
	// first embedding or rerank answer it is that answer's latency, which
	// the scorer does not see: the second answer's starts the peak-EWMA
	// if it is the shorter (the first may include the connection's setup).
	Latency time.Duration
	// ServiceLatency is Latency per Service (indexed by it); 0 for a
	// service the endpoint has not answered.
	ServiceLatency [inferlb.NumServices]time.Duration
	TTFT           time.Duration // EWMA of time to first token
	// TimePerOutputToken is the EWMA of decode time per output token after
	// the first, from streamed calls (0 until one reports TTFT and 4+ tokens).
	TimePerOutputToken time.Duration
	ErrorRate          float64 // decayed to now
	Picks              uint64
	Successes          uint64
	Failures           uint64
	Overloads          uint64
	// NotServed counts the answers that the endpoint does not serve the
	// call's model (Outcome.NotServedModel).
	NotServed uint64
	// TooLong counts the answers that the call is longer than the
	// endpoint's context window (Outcome.ContextWindow).
	TooLong uint64
	// ModelFailures counts the failures held against their model on the
	// endpoint rather than against the endpoint (Outcome.Model; see the
	// package doc and EventModelFailing); Failures does not count them.
	ModelFailures uint64
	// ClientErrors counts the answers that the call was bad or not
	// allowed (Outcome.ClientError): neither success nor failure.
	ClientErrors uint64
	// ClientErrorShare is the decaying share of the endpoint's answers
	// that were client errors (see package doc), decayed to now: near 1
	// for a replica with a wrong API key or without the route, which the
	// balancer then passes over for peers whose share is far lower.
	ClientErrorShare float64
	// RefusedTenants is the number of tenants whose calls the Balancer
	// passes the endpoint over for now, because it refused a run of their
	// calls (client errors that name their tenant, Outcome.Tenant) too
	// long to be their own bad calls: a replica that lacks some tenants'
	// API keys.
	// A tenant counts for ErrorDecay after its last refusal there, or
	// until the endpoint serves one of its calls. A pick still takes the
	// endpoint for such a tenant when passing it over would hold out more
	// than MaxEjectedFraction of its pool or leave no candidate.
	RefusedTenants int
	// Canceled counts the calls that ended canceled (Outcome.Canceled):
	// neither success nor failure. With the counts above and InFlight
	// they make up Picks.
	Canceled uint64
	// Unanswered counts, of Canceled, the calls given up on while the
	// endpoint had sent nothing back (Outcome.Unanswered), of any service:
	// many on one endpoint, against few on its peers, say its calls hang.
	Unanswered uint64
	// Abandoned is the current run of generation calls given up on with
	// nothing back, each after waiting as long as the endpoint's answers
	// take (its peers', before it has answered one) and no generation
	// answered (nor the first token of a stream its caller then stopped)
	// from then on, with no answer or failure since
	// (scoring.State.Abandoned): at
	// scoring.MinAbandoned or more, with calls out, the endpoint looks
	// hung (an engine stuck behind a live API server) and is priced up and
	// passed over for its affinity keys.
	Abandoned int64
	// Resilience: whether the breaker holds the endpoint out (or is
	// probing it), how often it tripped, recovered and was ejected as an
	// outlier, and the last detection time (first failure to exclusion) and
	// downtime (exclusion to recovery).
	BreakerOpen   bool
	Trips         uint64
	Recoveries    uint64
	Ejections     uint64
	LastDetection time.Duration
	LastDowntime  time.Duration
	// Affinity: calls with an affinity key that the endpoint took although
	// it is not the key's owner (the owner was over its bound, out of
	// standing or under memory pressure), split by whether the spill memory
	// knew the endpoint as holding the key's prefix. Many cold spills mean
	// cold prefills: a fleet too small for its keys, or a LoadBound too tight.
	WarmSpills, ColdSpills uint64
	// Telemetry is the endpoint's telemetry as the scorers see it now: the
	// fields no older than TelemetryMaxAge; Time is the oldest of them
	// (zero with none).
	Telemetry telemetry.Sample
}

// Stats returns the live state of the current endpoints, sorted by ID. It
// allocates and takes the Balancer's mutex: call it from metrics, not per request.
func (b *Balancer) Stats() []EndpointStats {
	b.mu.Lock()
	eps := make([]*endpoint, 0, len(b.eps))
	for _, e := range b.eps {
		eps = append(eps, e)
	}
	b.mu.Unlock()
	slices.SortFunc(eps, func(a, b *endpoint) int { return strings.Compare(a.id, b.id) })
	nowNs := b.cfg.clock.Now().UnixNano()
	refused := b.refusedTenants(nowNs)
	out := make([]EndpointStats, len(eps))
	for i, e := range eps {
		var latest int64
		var lat [inferlb.NumServices]time.Duration
		latency := time.Duration(0)
		for svc := range e.lat {
			lat[svc] = time.Duration(e.lat[svc].ewma.Load())
			if lat[svc] == 0 {
				lat[svc] = time.Duration(e.latDialed[svc].Load()) // the first answer, held aside (see observe)
			}
			if at := e.lat[svc].at.Load(); lat[svc] > 0 && (latency == 0 || at > latest) {
				latest, latency = at, lat[svc]
			}
		}
		s := EndpointStats{
			Latency:            latency,
			ServiceLatency:     lat,
			ID:                 e.id,
			Ready:              e.readyMask.Load() != 0,
			Weight:             e.info.Load().Capacity(),
			RampFactor:         e.rampFactor(b.cfg, nowNs),
			InFlight:           e.inFlight.Load(),
			InFlightTokens:     e.inFlightTokens.Load(),
			TTFT:               time.Duration(e.ttftEWMA.Load()),
			TimePerOutputToken: time.Duration(e.tpotEWMA.Load()),
			ErrorRate:          e.errorRate(b.cfg, nowNs),
			Successes:          e.successes.Load(),
			Failures:           e.failures.Load(),
			Overloads:          e.overloads.Load(),
			NotServed:          e.notServed.Load(),
			TooLong:            e.tooLong.Load(),
			ModelFailures:      e.modelFailures.Load(),
			ClientErrors:       e.clientErrors.Load(),
			ClientErrorShare:   e.clientErrorShare(b.cfg, nowNs),
			RefusedTenants:     refused[e.serial],
			Canceled:           e.canceled.Load(),
			Unanswered:         e.unanswered.Load(),
			Abandoned:          e.abandoned.Load(),
			BreakerOpen:        e.brOpen.Load(),
			Trips:              e.trips.Load(),
			Recoveries:         e.recoveries.Load(),
			Ejections:          e.ejectCount.Load(),
			LastDetection:      time.Duration(e.lastDetection.Load()),
			LastDowntime:       time.Duration(e.lastDowntime.Load()),
			WarmSpills:         e.spillsWarm.Load(),
			ColdSpills:         e.spillsCold.Load(),
		}
		s.Picks = e.pickCount()
		e.slot.Load().LoadInto(&s.Telemetry, time.Unix(0, nowNs), b.cfg.telemetryMaxAge)
		if u := e.excludedUntil.Load(); u > nowNs {
			s.ExcludedUntil = time.Unix(0, u)
		}
		if u := e.ejectedUntil.Load(); u > nowNs {
			s.EjectedUntil = time.Unix(0, u)
		}
		if u := e.probationUntil.Load(); u > nowNs {
			s.ProbationUntil = time.Unix(0, u)
		}
		s.OverloadStreak = int(e.shedStreak.Load())
		out[i] = s
	}
	return out
}
