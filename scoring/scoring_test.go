package scoring_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

var now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func withTelemetry(st scoring.State, kv ...float64) scoring.State {
	for i := 0; i+1 < len(kv); i += 2 {
		st.Telemetry.Set(telemetry.Field(kv[i]), kv[i+1])
	}
	return st
}

func TestPressureIsFlatThenSteep(t *testing.T) {
	assert.Equal(t, 1.0, scoring.Pressure(0.5, 0.9, 4))
	assert.Equal(t, 1.0, scoring.Pressure(0.9, 0.9, 4))
	assert.InDelta(t, 5, scoring.Pressure(0.95, 0.9, 4), 1e-9)
	assert.InDelta(t, 37, scoring.Pressure(0.99, 0.9, 4), 1e-9)
	assert.False(t, math.IsInf(scoring.Pressure(1, 0.9, 4), 0), "a full GPU is very expensive, not infinite")
	assert.Equal(t, 1.0, scoring.Pressure(math.NaN(), 0.9, 4))
	// Steep, not linear: the last 4% cost more than the 5% before them.
	lo := scoring.Pressure(0.95, 0.9, 4) - scoring.Pressure(0.9, 0.9, 4)
	hi := scoring.Pressure(0.99, 0.9, 4) - scoring.Pressure(0.95, 0.9, 4)
	assert.Greater(t, hi, 5*lo)
}

func TestLLMCost(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	base := scoring.State{Now: now, Weight: 1}
	idle := l.Cost(req, base)
	assert.InDelta(t, 1, idle, 1e-9)

	busy := base
	busy.InFlight = 3
	assert.InDelta(t, 4, l.Cost(req, busy), 1e-9, "in-flight requests")

	tokens := base
	tokens.InFlightTokens = 8192
	assert.InDelta(t, 3, l.Cost(req, tokens), 1e-9, "8192 in-flight tokens count as two requests")

	big := busy
	big.Weight = 2
	assert.InDelta(t, 2, l.Cost(req, big), 1e-9, "capacity weight divides load")

	flaky := base
	flaky.ErrorRate = 0.5
	assert.InDelta(t, 11, l.Cost(req, flaky), 1e-9, "reliability: 1 + 10 x the odds of failure")

	// Server-side counts see other clients' load.
	assert.InDelta(t, 8, l.Cost(req, withTelemetry(busy, float64(telemetry.Running), 7)), 1e-9, "running on the server beats our own view")
	assert.InDelta(t, 4, l.Cost(req, withTelemetry(busy, float64(telemetry.Running), 1)), 1e-9, "never below our own in-flight")
	assert.InDelta(t, 5, l.Cost(req, withTelemetry(base, float64(telemetry.Waiting), 2)), 1e-9, "a queued request counts double")

	// Memory and KV pressure multiply.
	gib := float64(1 << 30)
	full := withTelemetry(base, float64(telemetry.GPUMemUsed), 76*gib, float64(telemetry.GPUMemTotal), 80*gib)
	assert.Greater(t, l.Cost(req, full), 3.0, "95% GPU memory is expensive")
	normal := withTelemetry(base, float64(telemetry.GPUMemUsed), 72*gib, float64(telemetry.GPUMemTotal), 80*gib)
	assert.InDelta(t, 1, l.Cost(req, normal), 1e-9, "vLLM's usual 90% is normal")
	// A server that reports its KV cache pre-allocated it: its GPU memory
	// is how it was started (gpu_memory_utilization), and only the KV
	// cache counts.
	fullKV := withTelemetry(full, float64(telemetry.KVCacheUsage), 0.5)
	normalKV := withTelemetry(normal, float64(telemetry.KVCacheUsage), 0.5)
	assert.InDelta(t, l.Cost(req, normalKV), l.Cost(req, fullKV), 1e-9, "95% GPU memory with a half-empty KV cache is no pressure")
	assert.InDelta(t, 1, l.Cost(req, fullKV), 1e-9)
	assert.Greater(t, l.Cost(req, withTelemetry(base, float64(telemetry.KVCacheUsage), 0.95)), 3.0)
	assert.Greater(t, l.Cost(req, withTelemetry(base, float64(telemetry.AppUtil), 0.99)), 10.0)
}

// A knee of 1 turns its factor off: the endpoint costs what its load
// says, however full its KV cache, memory or utilization (ORCA's above 1
// included), and the other factors stay on.
func TestLLMKneeOfOneTurnsItsFactorOff(t *testing.T) {
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	base := scoring.State{Now: now, Weight: 1, InFlight: 1}
	gib := float64(1 << 30)
	kv := withTelemetry(base, float64(telemetry.KVCacheUsage), 0.99)
	mem := withTelemetry(base, float64(telemetry.GPUMemUsed), 79*gib, float64(telemetry.GPUMemTotal), 80*gib)
	util := withTelemetry(base, float64(telemetry.AppUtil), 1.2)
	for _, tc := range []struct {
		name string
		l    *scoring.LLM
		off  scoring.State
		on   []scoring.State
	}{
		{"KVKnee", &scoring.LLM{KVKnee: 1}, kv, []scoring.State{mem, util}},
		{"MemoryKnee", &scoring.LLM{MemoryKnee: 1}, mem, []scoring.State{kv, util}},
		{"UtilKnee", &scoring.LLM{UtilKnee: 1}, util, []scoring.State{kv, mem}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.l.Validate())
			assert.InDelta(t, 2, tc.l.Cost(req, tc.off), 1e-9, "off: the load alone")
			assert.Greater(t, (&scoring.LLM{}).Cost(req, tc.off), 5.0, "on by default")
			for _, s := range tc.on {
				assert.Greater(t, tc.l.Cost(req, s), 5.0, "the other factors stay on")
			}
		})
	}
}

func TestLLMCostBringsAReadingUpToNow(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	// The server counted 10 running at the last scrape; this process has
	// sent 3 more since (it has 5 in flight, the server counts some of them).
	read := withTelemetry(scoring.State{Now: now, Weight: 1, InFlight: 5}, float64(telemetry.Running), 10)
	assert.InDelta(t, 11, l.Cost(req, read), 1e-9, "the reading as it is")
	since := read
	since.InFlightSinceReading = 3
	assert.InDelta(t, 14, l.Cost(req, since), 1e-9, "plus what was sent since")
	since.InFlightSinceReading = -4
	assert.InDelta(t, 7, l.Cost(req, since), 1e-9, "less what ended since, never below our own in-flight + 1")
	since.InFlightSinceReading = -9
	assert.InDelta(t, 6, l.Cost(req, since), 1e-9, "never below our own in-flight")

	// KV-cache usage moves by the mean share of a running call: 90% with 9
	// running is 100% after one more, and as expensive as a full cache.
	kv := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 9, float64(telemetry.KVCacheUsage), 0.9)
	kv1 := kv
	kv1.InFlightSinceReading, kv1.InFlightSinceKV = 1, 1
	full := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 10, float64(telemetry.KVCacheUsage), 1)
	assert.InDelta(t, l.Cost(req, full), l.Cost(req, kv1), 1e-9)
	assert.Greater(t, l.Cost(req, kv1), 3*l.Cost(req, kv), "one more call on a nearly full cache costs far more")
	kv1.InFlightSinceReading, kv1.InFlightSinceKV = -3, -3
	assert.InDelta(t, l.Cost(req, withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 6, float64(telemetry.KVCacheUsage), 0.6)),
		l.Cost(req, kv1), 1e-9, "calls that ended since free their share")

	// The usage moves by the calls sent since its own time: a load header
	// measured after the scrape that gave Running already counts the calls
	// sent between the two.
	header := kv
	header.InFlightSinceReading = 3
	atScrape := kv
	atScrape.InFlightSinceReading, atScrape.InFlightSinceKV = 3, 3
	assert.InDelta(t, (9+3+1)*scoring.Pressure(0.9, 0.85, 4), l.Cost(req, header), 1e-9, "the usage as the header read it")
	assert.Greater(t, l.Cost(req, atScrape), 3*l.Cost(req, header), "the same calls sent since a usage as old as the scrape")

	// Without a running count there is no share to move by.
	alone := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.KVCacheUsage), 0.9)
	moved := alone
	moved.InFlightSinceReading, moved.InFlightSinceKV = 5, 5
	assert.InDelta(t, l.Cost(req, alone)+5*scoring.Pressure(0.9, 0.85, 4), l.Cost(req, moved), 1e-9, "load grows, KV usage stands")
}

func TestKVPressureIsCapped(t *testing.T) {
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	at := func(l *scoring.LLM, kv float64) float64 {
		return l.Cost(req, withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.KVCacheUsage), kv))
	}
	l := &scoring.LLM{}
	assert.InDelta(t, 9, at(l, 0.95), 1e-9, "below the cap the curve applies")
	assert.InDelta(t, 10, at(l, 0.97), 1e-9, "past it every fuller cache costs the same")
	assert.InDelta(t, 10, at(l, 1), 1e-9)
	assert.InDelta(t, 17, at(&scoring.LLM{MaxKVPressure: 100}, 0.97), 1e-9, "a higher cap lets the curve go on")
}

func TestLLMCostIgnoresLatency(t *testing.T) {
	l := &scoring.LLM{}
	fast := scoring.State{Now: now, Weight: 1, LatencyEWMA: time.Second, LastLatency: now}
	slow := fast
	slow.LatencyEWMA = time.Minute
	assert.Equal(t, l.Cost(nil, fast), l.Cost(nil, slow), "completion latency measures output length, not the endpoint")
}

func TestLatencyCost(t *testing.T) {
	l := &scoring.Latency{}
	st := scoring.State{Now: now, Weight: 1, LatencyEWMA: 20 * time.Millisecond, LastLatency: now, LatencyDecay: 10 * time.Second}
	assert.InDelta(t, 0.020, l.Cost(nil, st), 1e-9)
	st.InFlight = 2
	assert.InDelta(t, 0.060, l.Cost(nil, st), 1e-9, "latency x (in-flight + 1)")

	unknown := scoring.State{Now: now, Weight: 1, InFlight: 1}
	assert.InDelta(t, 2*scoring.DefaultLatencyPrior.Seconds(), l.Cost(nil, unknown), 1e-9, "prior for no history with a call in flight")
	assert.InDelta(t, 0.4, (&scoring.Latency{Prior: 200 * time.Millisecond}).Cost(nil, unknown), 1e-9)
	unknown.InFlight = 0
	assert.Less(t, l.Cost(nil, unknown), l.Cost(nil, st), "no history, nothing in flight: probe it, or it is never measured")

	// Peak-EWMA decays towards zero while unobserved, so a slow endpoint is
	// probed again after a while.
	old := scoring.State{Now: now.Add(10 * time.Second), Weight: 1, LatencyEWMA: 100 * time.Millisecond, LastLatency: now, LatencyDecay: 10 * time.Second}
	assert.InDelta(t, 0.1/math.E, l.Cost(nil, old), 0.002, "one time constant: about 1/e")

	// Decayed to almost nothing after ten idle minutes: the next probe. With
	// probes out it is being measured, and costs what its last EWMA (or the
	// prior, if less) says per call, not a near-zero that would win every
	// pick that drew it until the first answer.
	idle := scoring.State{Now: now.Add(10 * time.Minute), Weight: 1, LatencyEWMA: 20 * time.Millisecond, LastLatency: now, LatencyDecay: 10 * time.Second}
	assert.Less(t, l.Cost(nil, idle), l.Cost(nil, st), "idle and decayed: probe it")
	idle.InFlight = 3
	assert.InDelta(t, 0.080, l.Cost(nil, idle), 1e-9, "20ms x 4 while probes are out")
	slowIdle := idle
	slowIdle.LatencyEWMA = time.Second
	assert.InDelta(t, 4*scoring.DefaultLatencyPrior.Seconds(), l.Cost(nil, slowIdle), 1e-9, "a slow EWMA is priced at the prior at most")
}

func TestLeastLoaded(t *testing.T) {
	l := &scoring.LeastLoaded{}
	assert.InDelta(t, 3, l.Cost(nil, scoring.State{Weight: 1, InFlight: 2}), 1e-9)
	assert.InDelta(t, 1.5, l.Cost(nil, scoring.State{Weight: 2, InFlight: 2}), 1e-9)
	assert.InDelta(t, 1, l.Cost(nil, scoring.State{InFlight: 0}), 1e-9, "zero weight reads as 1")
}

func TestDefaultFor(t *testing.T) {
	assert.IsType(t, &scoring.LLM{}, scoring.DefaultFor(inferlb.ServiceLLM))
	assert.IsType(t, &scoring.Latency{}, scoring.DefaultFor(inferlb.ServiceEmbedding))
	assert.IsType(t, &scoring.Latency{}, scoring.DefaultFor(inferlb.ServiceRerank))
	assert.IsType(t, &scoring.LeastLoaded{}, scoring.DefaultFor(inferlb.ServiceUnknown))
}

// A NaN cost loses or wins every comparison whatever the load, and a
// negative one wins them all; neither may come out of a scorer, whatever a
// State holds (a State is public: custom balancers and tests fill it) and
// however a scorer is configured (an infinite ErrorPenalty is "never
// route to a failing endpoint", not a NaN for a healthy one).
func TestScorersNeverReturnNaNOrNegative(t *testing.T) {
	inf := math.Inf(1)
	scorers := map[string]scoring.Scorer{
		"LLM":                 &scoring.LLM{},
		"LLM infinite config": &scoring.LLM{ErrorPenalty: inf, QueueWeight: inf, TokenUnit: inf, Steepness: inf, MemorySteepness: inf, MaxKVPressure: inf},
		"Latency":             &scoring.Latency{},
		"Latency infinite":    &scoring.Latency{ErrorPenalty: inf},
		"LeastLoaded":         &scoring.LeastLoaded{},
		"LeastLoaded inf":     &scoring.LeastLoaded{ErrorPenalty: inf},

		// Valid too: a queue counted at +Inf, and tokens divided by the
		// least positive float, which makes a token count +-Inf.
		"LLM infinite queue, tiny token unit": &scoring.LLM{QueueWeight: inf, TokenUnit: math.SmallestNonzeroFloat64},
	}
	base := scoring.State{Now: now, Weight: 1, LatencyEWMA: 20 * time.Millisecond, LastLatency: now, LatencyDecay: 10 * time.Second}
	states := map[string]scoring.State{}
	add := func(name string, f func(*scoring.State)) {
		st := base
		f(&st)
		states[name] = st
	}
	add("NaN error rate", func(s *scoring.State) { s.ErrorRate = math.NaN() })
	add("negative error rate", func(s *scoring.State) { s.ErrorRate = -1 })
	add("infinite weight", func(s *scoring.State) { s.Weight = inf })
	add("infinite weight, huge utilization", func(s *scoring.State) {
		s.Weight = inf
		s.Telemetry.Set(telemetry.AppUtil, math.MaxFloat64)
	})
	add("negative in-flight", func(s *scoring.State) { s.InFlight = -5 })
	add("in-flight at the int64 limit", func(s *scoring.State) { s.InFlight = math.MaxInt64 })
	add("negative in-flight tokens", func(s *scoring.State) { s.InFlightTokens = -1 << 40 })
	add("negative in-flight tokens beside a queue", func(s *scoring.State) {
		s.InFlightTokens = -1 << 40
		s.Telemetry.Set(telemetry.Waiting, 3)
	})
	add("negative server counts", func(s *scoring.State) {
		s.Telemetry.Set(telemetry.Running, -1e9)
		s.Telemetry.Set(telemetry.Waiting, -1e9)
		s.InFlightSinceReading, s.InFlightSinceKV = -1<<40, -1<<40
	})
	add("empty queue", func(s *scoring.State) { s.Telemetry.Set(telemetry.Waiting, 0) })
	add("huge server counts", func(s *scoring.State) {
		s.Telemetry.Set(telemetry.Running, math.MaxFloat64)
		s.Telemetry.Set(telemetry.Waiting, math.MaxFloat64)
		s.Telemetry.Set(telemetry.KVCacheUsage, math.MaxFloat64)
		s.Telemetry.Set(telemetry.AppUtil, math.MaxFloat64)
	})
	add("negative usage", func(s *scoring.State) {
		s.Telemetry.Set(telemetry.KVCacheUsage, -math.MaxFloat64)
		s.Telemetry.Set(telemetry.AppUtil, -math.MaxFloat64)
		s.Telemetry.Set(telemetry.GPUMemUsed, -1)
		s.Telemetry.Set(telemetry.GPUMemTotal, 1)
	})
	add("negative latency", func(s *scoring.State) { s.LatencyEWMA, s.LatencyDecay = -time.Second, -time.Second })
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	for sn, sc := range scorers {
		for name, st := range states {
			c := sc.Cost(req, st)
			assert.False(t, math.IsNaN(c), "%s, %s: cost is NaN", sn, name)
			assert.GreaterOrEqual(t, c, 0.0, "%s, %s: negative cost", sn, name)
		}
	}
}

// A server count below zero is a broken reading: it must not cancel the
// other count (a queue of 10 hidden by running = -100).
func TestLLMCostIgnoresNegativeServerCounts(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	base := scoring.State{Now: now, Weight: 1}
	queued := withTelemetry(base, float64(telemetry.Waiting), 10)
	broken := withTelemetry(queued, float64(telemetry.Running), -100)
	assert.InDelta(t, l.Cost(req, queued), l.Cost(req, broken), 1e-9)
}

// An infinite weight reads as 1, as inferlb.Endpoint.Capacity and the
// placement ring read it, not as "every load costs 0".
func TestInfiniteWeightReadsAsOne(t *testing.T) {
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	for _, sc := range []scoring.Scorer{&scoring.LLM{}, &scoring.Latency{}, &scoring.LeastLoaded{}} {
		st := scoring.State{Now: now, Weight: 1, InFlight: 3, LatencyEWMA: time.Millisecond, LastLatency: now}
		want := sc.Cost(req, st)
		st.Weight = math.Inf(1)
		assert.InDelta(t, want, sc.Cost(req, st), 1e-12, "%T", sc)
	}
}

// TestFailingEndpointIsNeverCheap: an endpoint that fails its calls fast
// has nothing in flight and, its latency fed by successes only, no recent
// latency: priced by load and latency it is the cheapest endpoint there
// is. The error rate must outweigh any load: with the factor 1 + 10r
// (at most 11x) an endpoint failing 99% of its calls cost 10.9 and beat
// a generation peer with 11 calls in flight; and with no successful call
// (no latency history) an embedding endpoint failing half its calls was
// priced as an unmeasured probe, 1us, and beat every measured peer.
func TestFailingEndpointIsNeverCheap(t *testing.T) {
	now := time.Unix(1000, 0)
	req := &inferlb.Request{}
	idle := scoring.State{Now: now, Weight: 1}
	failing := idle
	failing.ErrorRate = 0.99
	busy := idle
	busy.InFlight = 100
	for _, s := range []scoring.Scorer{&scoring.LLM{}, &scoring.LeastLoaded{}} {
		assert.Greater(t, s.Cost(req, failing), s.Cost(req, busy), "%T: 99%% failing vs 100 in flight", s)
	}

	l := &scoring.Latency{}
	measured := idle
	measured.LatencyEWMA, measured.LastLatency, measured.LatencyDecay = 50*time.Millisecond, now, 10*time.Second
	measured.InFlight = 2
	flaky := idle
	flaky.ErrorRate = 0.5
	assert.Greater(t, l.Cost(req, flaky), l.Cost(req, measured), "failing half its calls, never measured, vs measured with 2 in flight")
	// Its latency decayed while it failed: still not a probe.
	flaky.LatencyEWMA, flaky.LastLatency, flaky.LatencyDecay = 50*time.Millisecond, now.Add(-time.Minute), 10*time.Second
	assert.Greater(t, l.Cost(req, flaky), l.Cost(req, measured), "failing half its calls, latency decayed, vs measured with 2 in flight")
	// Unmeasured and clean, it is the next probe, as before.
	assert.Less(t, l.Cost(req, idle), l.Cost(req, measured))
}

// A request for a LoRA adapter prices what the server's adapter slots
// would make it do: nothing for the base model or an adapter running
// there, a load where a slot is free, a wait where every slot is taken by
// others (also for an adapter already waiting there for one).
func TestLLMCostPricesLoRASlots(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "math"}
	base := scoring.State{Now: now, Weight: 1, InFlight: 3}
	lora := func(slots float64, running ...string) scoring.State {
		st := base
		st.Telemetry.SetAdapters(slots, &telemetry.Adapters{Base: "llama", Running: running, Waiting: []string{"law"}})
		return st
	}
	plain := l.Cost(req, base)
	assert.InDelta(t, 4, plain, 1e-9)

	assert.InDelta(t, plain, l.Cost(req, lora(2, "math", "sql")), 1e-9, "the adapter runs there")
	assert.InDelta(t, plain*1.5, l.Cost(req, lora(4, "sql", "chat")), 1e-9, "a free slot: the adapter is loaded")
	assert.InDelta(t, plain*16, l.Cost(req, lora(2, "sql", "chat")), 1e-9, "every slot taken: the request waits")
	for _, m := range []string{"llama", ""} {
		r := *req
		r.Model = m
		assert.InDelta(t, plain, l.Cost(&r, lora(2, "sql", "chat")), 1e-9, "%q: the base model, or none", m)
	}
	law := *req
	law.Model = "law"
	assert.InDelta(t, plain, l.Cost(&law, lora(4, "sql", "chat")), 1e-9, "waiting there with a slot free: about to run")
	assert.InDelta(t, plain*16, l.Cost(&law, lora(2, "sql", "chat")), 1e-9, "waiting there for a slot: held")

	// The factors multiply the load: an idle server that must load the
	// adapter beats a busy one running it, and one whose slots are full
	// loses to a moderately busy one running it.
	idleFree, idleFull := lora(4, "sql"), lora(1, "sql")
	idleFree.InFlight, idleFull.InFlight = 0, 0
	running := lora(2, "math")
	running.InFlight = 6
	assert.Less(t, l.Cost(req, idleFree), l.Cost(req, running))
	full := lora(1, "sql")
	full.InFlight = 2
	assert.Less(t, l.Cost(req, running), l.Cost(req, full))
	// LoRAWait's doc: an idle endpoint with its slots full costs as much
	// as one running the adapter with 15 calls.
	running.InFlight = 15
	assert.InDelta(t, l.Cost(req, running), l.Cost(req, idleFull), 1e-9)

	off := &scoring.LLM{LoRALoad: 1, LoRAWait: 1}
	assert.InDelta(t, plain, off.Cost(req, lora(2, "sql", "chat")), 1e-9, "1 turns the factors off")
	tuned := &scoring.LLM{LoRALoad: 2, LoRAWait: 10}
	assert.InDelta(t, plain*10, tuned.Cost(req, lora(2, "sql", "chat")), 1e-9)
	assert.InDelta(t, plain*2, tuned.Cost(req, lora(4, "sql", "chat")), 1e-9)
}

// Stale telemetry is neutral: a vLLM replica whose KV-cache reading went
// stale (it was idle, so no load header came back) while DCGM still
// reports the GPU memory it pre-allocated costs what an idle peer with a
// fresh, low KV reading costs, not 5.8x (the memory curve at 0.95).
func TestStaleKVCacheLeavesGPUMemoryNeutral(t *testing.T) {
	var st telemetry.Store
	gib := float64(1 << 30)
	var kv, mem telemetry.Sample
	kv.Time = now
	kv.Set(telemetry.KVCacheUsage, 0.1)
	mem.Time = now.Add(time.Minute)
	mem.Set(telemetry.GPUMemUsed, 76*gib)
	mem.Set(telemetry.GPUMemTotal, 80*gib)
	for _, id := range []string{"idle", "busy"} {
		st.Publish(id, kv)
		st.Publish(id, mem)
	}
	kv.Time = mem.Time
	st.Publish("busy", kv) // a response just came back with a fresh header

	at := now.Add(time.Minute + time.Second)
	cost := func(id string) float64 {
		s := scoring.State{Now: at, Weight: 1}
		st.Slot(id).LoadInto(&s.Telemetry, at, 30*time.Second)
		return (&scoring.LLM{}).Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, s)
	}
	assert.InDelta(t, cost("busy"), cost("idle"), 1e-9)
	assert.InDelta(t, 1, cost("idle"), 1e-9)
}

// TGI (and Triton's vLLM backend) reserve their KV cache at start and
// report no usage of it: with DCGM's memory beside their queue, two
// replicas started at 0.95 and 0.97 of their GPU, equally loaded, cost
// 5.8x and 14.3x their load, and the first took most of the calls. Their
// source marks them (KVCachePreallocated): only their load counts, fresh
// and once the mark went stale (a failed scrape) while DCGM's memory did
// not.
func TestPreallocatingServersAreNotPricedByMemory(t *testing.T) {
	l := &scoring.LLM{}
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	gib := float64(1 << 30)
	var st telemetry.Store
	for id, used := range map[string]float64{"at95": 76 * gib, "at97": 77.6 * gib} {
		var tgi, mem telemetry.Sample
		tgi.Time = now
		tgi.Set(telemetry.Running, 4)
		tgi.Set(telemetry.Waiting, 1)
		tgi.Set(telemetry.KVCachePreallocated, 1)
		mem.Time = now
		mem.Set(telemetry.GPUMemUsed, used)
		mem.Set(telemetry.GPUMemTotal, 80*gib)
		st.Publish(id, tgi)
		st.Publish(id, mem)
		mem.Time = now.Add(time.Minute) // DCGM keeps coming; the scrape of TGI failed
		st.Publish(id+"-stale", tgi)
		st.Publish(id+"-stale", mem)
	}
	cost := func(id string, at time.Time) float64 {
		s := scoring.State{Now: at, Weight: 1}
		st.Slot(id).LoadInto(&s.Telemetry, at, 30*time.Second)
		return l.Cost(req, s)
	}
	want := 4 + 2*1 + 1.0 // running + QueueWeight x waiting + 1, nothing else
	assert.InDelta(t, want, cost("at95", now), 1e-9, "fresh, at 0.95")
	assert.InDelta(t, want, cost("at97", now), 1e-9, "fresh, at 0.97")
	later := now.Add(time.Minute + time.Second)
	assert.InDelta(t, cost("at95-stale", later), cost("at97-stale", later), 1e-9, "stale mark, fresh memory")
	assert.InDelta(t, 1, cost("at97-stale", later), 1e-9, "stale telemetry is neutral")

	// Without the mark the memory is load, as for a server that allocates as it goes.
	custom := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 4, float64(telemetry.Waiting), 1,
		float64(telemetry.GPUMemUsed), 77.6*gib, float64(telemetry.GPUMemTotal), 80*gib)
	assert.InDelta(t, want*scoring.Pressure(0.97, 0.92, 8), l.Cost(req, custom), 1e-6)
}

// A KV-cache usage is a fraction: a reading above 1 (a Source or a
// Publish that passed a percentage, or an overshoot) is a full cache,
// whether or not calls were sent since it. Clamped only when projected,
// it priced an endpoint with calls sent since (busier) below the same
// endpoint without them once MaxKVPressure let the curve run: 1.5 with
// none sent since cost 11 x 2601, with one sent since 12 x 401.
func TestKVAboveOneIsAFullCache(t *testing.T) {
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	for _, l := range []*scoring.LLM{{}, {MaxKVPressure: math.Inf(1)}, {MaxKVPressure: 1000}} {
		full := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 10, float64(telemetry.KVCacheUsage), 1)
		over := withTelemetry(scoring.State{Now: now, Weight: 1}, float64(telemetry.Running), 10, float64(telemetry.KVCacheUsage), 1.5)
		assert.InDelta(t, l.Cost(req, full), l.Cost(req, over), 1e-9, "MaxKVPressure %v: above 1 is full", l.MaxKVPressure)
		busier := over
		busier.InFlightSinceReading, busier.InFlightSinceKV = 1, 1
		assert.GreaterOrEqual(t, l.Cost(req, busier), l.Cost(req, over), "MaxKVPressure %v: a call sent since makes it dearer", l.MaxKVPressure)
	}
}

// State.Latency decays the EWMA by a weight that rounds to 1 a moment
// after the last update under a long time constant; converting the
// largest Duration times 1 back from float64 overflowed to a negative
// latency, the fastest there is. A custom scorer may read State.Latency of
// any State, not only the balancer's (which holds reports below 2^50 ns).
func TestStateLatencyOfTheLargestDurationStaysPositive(t *testing.T) {
	for _, ewma := range []time.Duration{math.MaxInt64, math.MaxInt64 - 512, 1 << 62} {
		for _, decay := range []time.Duration{10 * time.Second, 1000 * time.Hour, math.MaxInt64} {
			st := scoring.State{Now: now, LatencyEWMA: ewma, LastLatency: now.Add(-time.Nanosecond), LatencyDecay: decay}
			assert.Positive(t, st.Latency(), "EWMA %d, decay %v", ewma, decay)
			assert.LessOrEqual(t, st.Latency(), ewma, "EWMA %d, decay %v", ewma, decay)
		}
	}
}
