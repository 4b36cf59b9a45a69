// Package scoring turns what the balancer knows about an endpoint into a cost:
// lower is better. Scorers are pure functions of the request and a read-only
// State snapshot; they do no I/O, take no locks and keep no state, so the
// picker can call them for each candidate of a pick on any goroutine: two
// drawn at random, or, for a FullScanner (Latency), every endpoint of the
// group up to balancer.Options.ScanLimit.
//
// One scorer per kind of traffic, because each kind has a different signal:
//   - LLM generation routes on reliability and current load (in-flight
//     requests and tokens, the server's queue, KV-cache pressure, GPU
//     memory pressure for servers that neither report KV-cache usage nor
//     pre-allocate a KV cache (telemetry.KVCachePreallocated), and for
//     a LoRA adapter's call the server's adapter slots; a server that
//     sleeps, telemetry.Asleep, costs a millionfold; one whose callers
//     gave up on two or more calls in a row with nothing back costs more
//     with each, State.Abandoned), not on
//     completion latency, which mostly measures prompt and output length.
//   - Embeddings and rerankers are short and uniform, so recent latency is a
//     good signal: peak-EWMA latency x (in-flight + 1), as in Finagle and
//     Linkerd. That cost is this process's own view of each endpoint, so
//     nothing stale is shared to herd on, and a pick compares every
//     endpoint (FullScanner) rather than two.
//   - Unknown traffic goes to the least-loaded endpoint.
//
// Each scorer's zero fields take documented defaults; its Validate method
// refuses settings that cannot be meant, and the balancer calls it (on any
// Scorer that has one) when it is built.
package scoring

import (
	"math"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/decay"
	"github.com/inferlb/inferlb/telemetry"
)

// Scorer returns the cost of sending req to the endpoint described by s; the
// lower cost wins. The balancer passes the call's own Request, never nil.
// Implementations must be safe for concurrent use and must not
// block, allocate or do I/O. The balancer reads a NaN cost as +Inf: the
// endpoint loses to any candidate with a number. A cost may be negative:
// the factors the balancer adds (a generation call's recent prefill, decode
// speed, the data-parallel barrier) make any cost dearer, dividing a
// negative one.
//
// Costs are only compared, between the candidates of one pick, so their
// unit is the Scorer's own; but since the balancer's factors multiply
// (or divide) them, a cost of 0 hides those factors. Keep costs above 0,
// as the built-in ones do (in-flight + 1, a latency of at least a
// microsecond). A Scorer that also has a Validate() error method, as the
// built-in ones do, is validated when the balancer is built
// (ExampleScorer).
type Scorer interface {
	Cost(req *inferlb.Request, s State) float64
}

// FullScanner is an optional interface of a Scorer. A Scorer whose
// FullScan reports true has its calls compared over every candidate
// endpoint of their group (up to balancer.Options.ScanLimit) rather than
// over two drawn at random. Report true only for a cost made of what this
// process sees of an endpoint (State's InFlight, latency and ErrorRate):
// over Telemetry, a reading every caller shares, all callers scanning pick
// the same endpoint until its next reading, where two random choices
// spread them. Latency reports true; LLM and LeastLoaded (the default for
// unknown traffic; see there why) do not implement it. The balancer asks
// the Scorer it was given, so a Scorer that wraps a Latency scans only if
// it has a FullScan of its own (Example_wrap).
type FullScanner interface {
	FullScan() bool
}

// State is a read-only snapshot of one endpoint, assembled by the balancer for
// a single cost evaluation.
type State struct {
	// Endpoint is the endpoint being scored, as last given to the balancer's
	// Update. Treat it as read-only.
	Endpoint *inferlb.Endpoint
	// Now is the picker's clock reading; scorers use it, never time.Now.
	Now time.Time
	// Weight is the endpoint's capacity weight (> 0). Slow start does not
	// change it: the balancer ramps a joining endpoint by how often it is a
	// candidate, not by its cost.
	Weight float64
	// InFlight and InFlightTokens count calls this process has picked the
	// endpoint for and not yet finished, and their estimated tokens.
	InFlight       int64
	InFlightTokens int64
	// LatencyEWMA is the peak-EWMA of the latency of the endpoint's
	// successful calls of the scored request's service, as of LastLatency;
	// 0 means no history. For embeddings and rerankers the balancer
	// holds an endpoint's first answer aside and starts the EWMA at the
	// smaller of its first two (the first call over a new connection
	// pays for the handshake), so it is 0 until the second answer, or
	// until a call given up on with nothing back, which starts it at the
	// first (below); later answers that may include a new connection's
	// setup (inferlb.Outcome.Dialed) are held aside alike, the smaller of
	// each and the next answer counting. For them, a call its caller
	// gave up on with nothing back (inferlb.Outcome.Unanswered) raises it,
	// or moves LastLatency on, so that Latency is at least its wait. Each service keeps its own, so an embedding on an
	// endpoint that also serves chats is not priced by a chat's seconds.
	// Use Latency to read it decayed to Now.
	LatencyEWMA time.Duration
	// LastLatency is when LatencyEWMA was last updated.
	LastLatency time.Time
	// LatencyDecay is the EWMA time constant (how fast old latency is forgotten).
	LatencyDecay time.Duration
	// Pending is how long this process's calls to the endpoint have gone
	// unanswered: the time since the later of the last call to it that
	// ended with an answer or a failure (a call its caller cancelled does
	// not count: abandoned one by one, hung calls would each make the
	// endpoint look freshly busy) and the first of its current run of
	// calls in flight. When that first call was itself cancelled, it may
	// exceed the age of the oldest call still out, by at most the time
	// between the two. 0 with nothing in flight. An EWMA fed by finished
	// calls cannot see an endpoint whose calls hang; this can.
	Pending time.Duration
	// Abandoned is how many generation calls to the endpoint, since it
	// last answered or failed one of this process's calls of any kind,
	// their callers gave up on with nothing back (inferlb.Outcome.
	// Unanswered) after waiting at least as long as its generation
	// answers take (their latency's peak-EWMA; before it has answered
	// one, the longest of its peers' among the endpoints serving its
	// models, once two of them have one), the endpoint answering no
	// generation call (nor the first token of a stream its caller then
	// stopped; a stream still out tells nothing) from that point of the
	// wait on. A replica whose engine hangs
	// while its server stays up runs it up call by call; a healthy one
	// ends it with its next answer. A user stopping a stream after its
	// first token does not count, nor does one giving up sooner than the
	// endpoint answers, nor one who waited out a long call while the
	// endpoint answered others (a busy replica, working).
	Abandoned int64
	// TTFTEWMA is the EWMA of time to first token of streamed calls (0 = none).
	TTFTEWMA time.Duration
	// ErrorRate is the EWMA of failures over recent outcomes, 0..1, already
	// decayed towards 0 for the time since the last outcome.
	ErrorRate float64
	// InFlightSinceReading is how much InFlight has grown (negative: shrunk)
	// since the server's load reading in Telemetry (Running, Waiting) was
	// measured: the calls this process sent there that the reading cannot
	// count yet. For a reading that arrived within a couple of seconds of
	// its measurement it counts from when a pick first saw it; for a later
	// one (read from Prometheus) from the balancer's per-second history of
	// InFlight at the reading's time. 0 without such a reading. A Waiting
	// newer than the Running (a load header's queue beside a scrape's
	// running count) already holds the calls sent between the two that
	// the server queued, so the count is at least the calls sent since the
	// Waiting and at least those since the Running less Waiting, so a
	// queued call is not counted twice; with nothing waiting, those since
	// the Running. Calls that ended between the two are not taken off
	// while the Waiting shows a queue: the server filled their places from
	// it, and the Waiting is shorter by them already.
	InFlightSinceReading int64
	// InFlightSinceKV is the same count since the KV-cache usage in
	// Telemetry was measured, which may be later than the load reading:
	// a load header (vLLM's carries the usage and the queue, not the
	// running count) comes after every response, a scrape every 15-30 s.
	// It equals InFlightSinceReading when the usage came with the reading,
	// and is 0 without a fresh usage.
	InFlightSinceKV int64
	// Telemetry holds the endpoint's fresh telemetry fields only: stale or
	// never-reported fields are absent (neutral). When the balancer
	// compares two candidates that do not have the same fresh counts of
	// the server's calls (one has Running or Waiting and the other not,
	// or one Running and Waiting, the other Waiting alone: a load
	// header's), it leaves those counts out of both (and
	// InFlightSinceReading is 0): the other's count would be this
	// caller's calls alone, and the two are compared on what both have.
	Telemetry telemetry.Sample
}

// Latency returns the peak-EWMA latency decayed towards zero for the time
// since it was last observed, so an endpoint that stopped receiving traffic
// because it was slow is probed again later (Finagle's PeakEwma does the same).
func (s *State) Latency() time.Duration {
	if s.LatencyEWMA <= 0 {
		return 0
	}
	dt := s.Now.Sub(s.LastLatency)
	if dt <= 0 || s.LatencyDecay <= 0 {
		return s.LatencyEWMA
	}
	w := decay.Weight(float64(dt) / float64(s.LatencyDecay))
	if w >= 1 {
		// Under a long time constant a moment rounds to no decay, and
		// the largest Duration, through float64, to 2^63: converted
		// back it wrapped to the most negative latency.
		return s.LatencyEWMA
	}
	return time.Duration(float64(s.LatencyEWMA) * w)
}

// weight is Weight, or 1 for a non-positive, NaN or infinite one, as
// inferlb.Endpoint.Capacity reads it: dividing by +Inf would price every
// load at 0.
func (s *State) weight() float64 {
	if s.Weight > 0 && s.Weight <= math.MaxFloat64 {
		return s.Weight
	}
	return 1
}

// reliability scales cost by 1 + penalty x rate / (1 - rate): the odds of
// failure, not the rate, so the factor has no ceiling as the rate nears 1.
// An endpoint that fails its calls fast has nothing in flight and looks
// idle; with a bounded factor (1 + penalty x rate, at most 11x) it won
// every comparison with a peer carrying more than ten calls, which a
// generation server under load always does. The odds leave low rates
// about as they were (0.1: 2.1x; 0.5: 11x; 0.9: 91x; 0.99: 991x). A rate
// that is not positive (NaN too) leaves it as it is: a negative rate would
// make a failing endpoint cheap, and an infinite penalty ("never route to
// a failing endpoint") times a zero rate would be NaN, which loses or wins
// every comparison whatever the load.
func reliability(cost, penalty, rate float64) float64 {
	if rate > 0 {
		const floor = 0.001 // keeps a rate of 1 finite, as in Pressure
		return cost * (1 + orDefault(penalty, 10)*rate/max(1-rate, floor))
	}
	return cost
}

// Pressure maps a utilization u in 0..1 to a cost multiplier that is 1 up to
// knee and rises steeply (hyperbolically) towards the ceiling:
//
//	1 + steepness * (u - knee) / (1 - u)
//
// With knee 0.9 and steepness 4, 95% costs 5x and 99% costs 37x. The
// denominator is floored at 0.001, so from 0.999 on (and above 1, which an
// ORCA utilization may be) the multiplier rises linearly: 401x at 1. The
// hyperbola, not a line, is the point: near a full GPU the next request evicts
// KV cache or preempts others, so the cost of filling the last percent is far
// higher than that of the percent before. A Scorer of your own that calls it
// should hold its knee to [0, 1) and its steepness to 0 or more (LLM.Validate
// also takes a knee of 1, for which LLM leaves the curve out): with a
// negative steepness a fuller endpoint costs less.
func Pressure(u, knee, steepness float64) float64 {
	if !(u > knee) { // also false for NaN
		return 1
	}
	const floor = 0.001 // keeps 100% finite
	return 1 + steepness*(u-knee)/max(1-u, floor)
}

var (
	_ Scorer = (*LLM)(nil)
	_ Scorer = (*Latency)(nil)
	_ Scorer = (*LeastLoaded)(nil)
)

// DefaultFor returns the scorer the balancer uses for svc when none is configured.
func DefaultFor(svc inferlb.Service) Scorer {
	switch svc {
	case inferlb.ServiceLLM:
		return &LLM{}
	case inferlb.ServiceEmbedding, inferlb.ServiceRerank:
		return &Latency{}
	default:
		return &LeastLoaded{}
	}
}
