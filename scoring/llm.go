package scoring

import (
	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// LLM scores generation endpoints on reliability and current load. The zero
// value uses the documented defaults.
//
// cost = (load + 1) / weight x reliability x silence x kvPressure x memPressure x utilPressure x loraFactor x sleep, where
//
//	load        = max(in-flight here, running + QueueWeight x waiting on the server + sent since)
//	              + in-flight tokens / TokenUnit
//	reliability = 1 + ErrorPenalty x error rate / (1 - error rate)
//	silence     = 1 + State.Abandoned while calls are out to it and two or more
//	              calls in a row were given up on with nothing back, each after
//	              waiting as long as its answers take, with no answer between
//	              nor any while either waited past that
//	              (a hung engine behind a live API server), else 1. With nothing
//	              in flight it is 1, so a replica that recovers draws a call,
//	              and its answer ends the run; until then it takes one call at
//	              a time
//	kvPressure  = min(Pressure(KV-cache usage + sent since it x usage / running, in 0..1, KVKnee, Steepness), MaxKVPressure)
//	memPressure = Pressure(GPU memory used/total, MemoryKnee, MemorySteepness), for a server
//	              that reports no KV-cache usage and is not marked as pre-allocating
//	              one (see telemetry.Sample.MemoryPressure)
//	utilPressure = Pressure(ORCA application utilization, UtilKnee, Steepness); ORCA
//	              allows a utilization above 1, where the curve goes on rising
//	              linearly (401x at 1, 601x at 1.05, 1201x at 1.2 with the defaults)
//	loraFactor  = LoRAWait when the request names a LoRA adapter the server runs no
//	              request of and every one of its adapter slots is taken by others
//	              (it would wait for a slot, as the adapter's requests waiting there
//	              do), LoRALoad when a slot is free and no request of the adapter
//	              waits there (it is loaded for this one), else 1 (see
//	              telemetry.Sample.SlotWait)
//	sleep       = 1e6 when the server is asleep (telemetry.Asleep 1: vLLM's sleep mode),
//	              else 1: it serves nothing until it is woken, however idle it
//	              reads, so it loses to any awake endpoint. The balancer already
//	              keeps calls off it (its two-choice draws and affinity pass it
//	              over); the price decides between candidates that all sleep, and
//	              a call then goes to one of them, to wait for its wake-up, rather
//	              than failing
//
// Server-side running and waiting counts see every client's traffic, so they
// correct this process's partial view when fresh; they replace it rather than
// add to it, because this process's in-flight calls are among them. They are
// as old as the last scrape, though, so "sent since" (State.InFlightSinceReading,
// the calls this process sent there since the reading, less those that
// ended) brings the reading up to now, and the same count since the KV-cache
// usage was measured (State.InFlightSinceKV: a load header's usage is newer
// than the scrape's Running) brings the usage up to now; without them the
// endpoint that looked emptiest at the last scrape would take every pick
// until the next. When telemetry is absent or stale the factors are neutral
// (1) and the cost is this process's own view. A server count, an
// in-flight token count, a load or an error rate below zero (a broken
// reading or counter) counts as zero.
// Completion latency is deliberately ignored: it measures prompt and output
// length more than the endpoint. (The balancer's P2C does weigh decode speed,
// the time per output token of streamed calls, on top of this cost.)
type LLM struct {
	// QueueWeight is what one request waiting on the server counts for,
	// relative to one running. Default 2: a queued request has not even
	// started prefill.
	QueueWeight float64
	// TokenUnit is how many in-flight tokens count as one more request.
	// Default 4096.
	TokenUnit float64
	// ErrorPenalty scales the odds of failure (rate / (1 - rate)) into
	// the reliability factor. Default 10: an endpoint failing one call in
	// ten costs 2.1x, half its calls 11x, nine in ten 91x, so one that
	// fails fast (and so looks idle) does not outbid busy healthy peers.
	ErrorPenalty float64
	// KVKnee is the KV-cache usage above which cost rises steeply. Default
	// 0.85; 1 turns the KV-cache factor off (MaxKVPressure 1 does too).
	KVKnee float64
	// MemoryKnee is the GPU memory usage above which cost rises steeply,
	// for servers that report no KV-cache usage: those that do (vLLM,
	// SGLang, TensorRT-LLM) pre-allocate their KV cache, so their GPU
	// memory says how they were started, not how loaded they are, and only
	// their KV-cache usage counts. So do TGI, llama.cpp and Triton's vLLM
	// and TensorRT-LLM backends, which may report none: their source marks them
	// (telemetry.KVCachePreallocated) and their memory does not count
	// either. Default 0.92: a server that allocates as it goes has little
	// headroom left above it. 1 turns the memory factor off.
	MemoryKnee float64
	// MemorySteepness scales the memory pressure curve. Default 8: memory
	// has no queue to absorb a burst, so 95% already costs 5.8x and 97% 14x.
	MemorySteepness float64
	// UtilKnee is the ORCA application utilization above which cost rises
	// steeply. Default 0.9; 1 turns the utilization factor off (a
	// utilization above 1, which ORCA allows, included).
	UtilKnee float64
	// Steepness scales the KV-cache and utilization curves. Default 4.
	Steepness float64
	// MaxKVPressure caps the KV-cache factor. Default 10, which the curve
	// reaches at about 95.4% with the default knee and steepness. A server
	// under full load runs its KV cache at 95-100% by design, so past that
	// point every replica is as full as the next and small differences in
	// a second-old reading would outweigh their queues: in the fleet
	// simulator's heavy/light mix at 30 req/s (past saturation) p99 TTFT
	// was 54 s uncapped and 41 s with the cap (means of seeds 1-3; seeds
	// 4-6: 41 s -> 31 s), while a cap of 4 (tried in a temporary edit) no longer kept a replica at 95%
	// below a fifth of its share when its peers were at 30%.
	MaxKVPressure float64
	// LoRALoad is the cost factor of an endpoint that would load the
	// request's LoRA adapter to serve it: a free adapter slot, but no
	// request of that adapter running or waiting there, so it is
	// probably not on the GPU, and taking a slot narrows what the
	// server's next batches can mix. Default 1.5 (3 did no better in
	// the fleet simulator's lora-slots scenario: better on 3 seeds of
	// 4, worse for the least used adapters on 2); 1 turns it off.
	LoRALoad float64
	// LoRAWait is the cost factor of an endpoint whose adapter slots
	// (vLLM's --max-loras) are all taken by other adapters: vLLM's
	// scheduler holds a request for another adapter until every
	// running request of one of them has finished, however short the
	// queue looks, while joining a running batch elsewhere costs little.
	// Default 16: an idle endpoint with its slots full costs as much as
	// one running the adapter with 15 calls (at 4, an idle full one beat
	// one running the adapter with a dozen calls, which vLLM would have
	// admitted at once). Its size matters only where the balancer's
	// redraws of full endpoints fail (see the balancer's lora.go): in the
	// fleet simulator's lora-slots scenario 4, 16 and 64 gave the same
	// runs. 1 turns it off, and the redraws with it.
	LoRAWait float64
}

// projectKV moves a KV-cache usage reading by the calls sent (or ended)
// since it was taken, each at the mean share of the running calls: a replica
// at 95% with 20 running is at about 100% once this process has sent it one
// more. Without it the pressure curve, steepest exactly where a saturated
// fleet sits, would turn a stale reading a few points lower than its
// neighbours' into every pick until the next scrape. Without a running
// count the reading stands. Either way the usage is a fraction: a reading
// above 1 is a full cache, as a projected one is, or the endpoint with
// calls sent since (clamped to 1) cost less than the same one without.
func projectKV(kv float64, tel *telemetry.Sample, delta int64) float64 {
	kv = min(max(kv, 0), 1)
	if delta == 0 {
		return kv
	}
	r, ok := tel.Get(telemetry.Running)
	if !ok || r < 1 {
		return kv
	}
	return min(max(kv+float64(delta)*kv/r, 0), 1)
}

// MinAbandoned is the run of generation calls abandoned with nothing back
// (State.Abandoned) from which LLM prices an endpoint up, and from which
// the balancer's affinity passes over a key's owner with calls out. One
// is a user's stop; two in a row, each as long as the endpoint's answers
// take and no answer between nor while either waited past that, a
// replica that answers nothing. A hung vLLM engine
// behind a live API server reads as healthy otherwise: its /metrics
// answers with frozen gauges, so its telemetry stays fresh, and its
// callers' cancellations are neither success nor failure. Its calls out
// then held it at its peers' load, and it drew about half its share of
// calls, each to hang until its caller gave up.
const MinAbandoned = 2

// asleepFactor is LLM's price of a server that sleeps (telemetry.Asleep):
// above any load an awake server reports, so an awake one always wins.
const asleepFactor = 1e6

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
		// A count below zero is a broken reading and counts as none (Get
		// gives 0 for an absent field): it must not cancel the other
		// count. Skipping an empty queue also keeps an infinite
		// QueueWeight from making 0 x Inf.
		server := 0.0
		if r, _ := tel.Get(telemetry.Running); r > 0 {
			server += r
		}
		if w, _ := tel.Get(telemetry.Waiting); w > 0 {
			server += orDefault(l.QueueWeight, 2) * w
		}
		// The reading is as old as the last scrape: what this process sent
		// since is not in it.
		load = max(load, server+float64(s.InFlightSinceReading))
	}
	// A negative token count is a broken counter and counts as none: with
	// a TokenUnit small enough to make it -Inf beside a queue priced at
	// +Inf (an infinite QueueWeight), the sum was NaN.
	load += float64(max(s.InFlightTokens, 0)) / orDefault(l.TokenUnit, 4096)
	// Counters below zero would make the busier endpoint the cheaper one.
	cost := (max(load, 0) + 1) / s.weight()
	cost = reliability(cost, l.ErrorPenalty, s.ErrorRate)
	if s.Abandoned >= MinAbandoned && s.InFlight > 0 {
		cost *= 1 + float64(s.Abandoned)
	}
	if tel.Has == 0 {
		return cost // no fresh telemetry: every other factor is 1
	}
	steep := orDefault(l.Steepness, 4)
	if kv, ok := tel.Get(telemetry.KVCacheUsage); ok && l.KVKnee < 1 {
		cost *= min(Pressure(projectKV(kv, tel, s.InFlightSinceKV), orDefault(l.KVKnee, 0.85), steep), orDefault(l.MaxKVPressure, 10))
	}
	if mem, ok := tel.MemoryPressure(); ok && l.MemoryKnee < 1 {
		cost *= Pressure(mem, orDefault(l.MemoryKnee, 0.92), orDefault(l.MemorySteepness, 8))
	}
	if u, ok := tel.Get(telemetry.AppUtil); ok && l.UtilKnee < 1 {
		cost *= Pressure(u, orDefault(l.UtilKnee, 0.9), steep)
	}
	if a, _ := tel.Get(telemetry.Asleep); a == 1 {
		cost *= asleepFactor
	}
	if tel.Adapters != nil {
		switch adapter, full := tel.SlotWait(req.Model); {
		case full:
			cost *= orDefault(l.LoRAWait, 16)
		case adapter:
			cost *= orDefault(l.LoRALoad, 1.5)
		}
	}
	return cost
}
