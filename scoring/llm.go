package scoring

import (
	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// LLM scores generation endpoints on reliability and current load. The zero
// value uses the documented defaults.
//
// cost = (load + 1) / weight x reliability x kvPressure x memPressure x utilPressure, where
//
//	load        = max(in-flight here, running + QueueWeight x waiting on the server)
//	              + in-flight tokens / TokenUnit
//	reliability = 1 + ErrorPenalty x error rate
//	kvPressure  = Pressure(KV-cache usage, KVKnee, Steepness)
//	memPressure = Pressure(GPU memory used/total, MemoryKnee, MemorySteepness)
//	utilPressure = Pressure(ORCA application utilization, UtilKnee, Steepness)
//
// Server-side running and waiting counts see every client's traffic, so they
// correct this process's partial view when fresh; they replace it rather than
// add to it, because this process's in-flight calls are among them. When
// telemetry is absent or stale the factors are neutral (1) and the cost is
// this process's own view.
// Completion latency is deliberately ignored: it measures prompt and output
// length more than the endpoint.
type LLM struct {
	// QueueWeight is what one request waiting on the server counts for,
	// relative to one running. Default 2: a queued request has not even
	// started prefill.
	QueueWeight float64
	// TokenUnit is how many in-flight tokens count as one more request.
	// Default 4096.
	TokenUnit float64
	// ErrorPenalty scales the error rate into the reliability factor.
	// Default 10: an endpoint failing half its calls costs 6x.
	ErrorPenalty float64
	// KVKnee is the KV-cache usage above which cost rises steeply. Default 0.85.
	KVKnee float64
	// MemoryKnee is the GPU memory usage above which cost rises steeply.
	// Default 0.92: engines such as vLLM pre-allocate about 90% of GPU memory,
	// so usage up to there is normal.
	MemoryKnee float64
	// MemorySteepness scales the memory pressure curve. Default 8: memory
	// has no queue to absorb a burst, so 95% already costs 5.8x and 97% 14x.
	MemorySteepness float64
	// UtilKnee is the ORCA application utilization above which cost rises
	// steeply. Default 0.9.
	UtilKnee float64
	// Steepness scales the KV-cache and utilization curves. Default 4.
	Steepness float64
}

func orDefault(v, d float64) float64 {
	if v > 0 {
		return v
	}
	return d
}

// Cost implements Scorer.
func (l *LLM) Cost(req *inferlb.Request, s State) float64 {
	tel := &s.Telemetry
	load := float64(s.InFlight)
	if tel.Has != 0 {
		server := 0.0
		if r, ok := tel.Get(telemetry.Running); ok {
			server += r
		}
		if w, ok := tel.Get(telemetry.Waiting); ok {
			server += orDefault(l.QueueWeight, 2) * w
		}
		load = max(load, server)
	}
	load += float64(s.InFlightTokens) / orDefault(l.TokenUnit, 4096)
	cost := (load + 1) / s.weight()
	cost *= 1 + orDefault(l.ErrorPenalty, 10)*s.ErrorRate
	if tel.Has == 0 {
		return cost // no fresh telemetry: every other factor is 1
	}
	steep := orDefault(l.Steepness, 4)
	if kv, ok := tel.Get(telemetry.KVCacheUsage); ok {
		cost *= Pressure(kv, orDefault(l.KVKnee, 0.85), steep)
	}
	if mem, ok := tel.MemoryUsage(); ok {
		cost *= Pressure(mem, orDefault(l.MemoryKnee, 0.92), orDefault(l.MemorySteepness, 8))
	}
	if u, ok := tel.Get(telemetry.AppUtil); ok {
		cost *= Pressure(u, orDefault(l.UtilKnee, 0.9), steep)
	}
	return cost
}
