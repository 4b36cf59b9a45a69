package scoring_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// randomLLMState draws a State with a random mix of this process's view
// and fresh telemetry fields, each present or absent.
func randomLLMState(r *rand.Rand) scoring.State {
	st := scoring.State{Now: now, Weight: []float64{0.5, 1, 2, 8}[r.IntN(4)]}
	st.InFlight = r.Int64N(40)
	st.InFlightTokens = r.Int64N(1 << 17)
	if r.IntN(3) == 0 {
		st.ErrorRate = r.Float64()
	}
	set := func(f telemetry.Field, v float64) {
		if r.IntN(2) == 0 {
			st.Telemetry.Set(f, v)
		}
	}
	set(telemetry.Running, float64(r.IntN(60)))
	set(telemetry.Waiting, float64(r.IntN(20)))
	set(telemetry.KVCacheUsage, r.Float64()*1.1)
	set(telemetry.AppUtil, r.Float64()*1.2)
	set(telemetry.Asleep, float64(r.IntN(2)))
	if r.IntN(2) == 0 {
		gib := float64(1 << 30)
		st.Telemetry.Set(telemetry.GPUMemTotal, 80*gib)
		st.Telemetry.Set(telemetry.GPUMemUsed, r.Float64()*82*gib)
	}
	if st.Telemetry.Has.Has(telemetry.Running) || st.Telemetry.Has.Has(telemetry.Waiting) {
		st.InFlightSinceReading = r.Int64N(21) - 10
	}
	if st.Telemetry.Has.Has(telemetry.KVCacheUsage) {
		st.InFlightSinceKV = r.Int64N(21) - 10
	}
	return st
}

// More load, all else equal, never makes an endpoint cheaper: each of the
// scorer's load inputs, raised alone (or together, as the balancer raises
// InFlight and the counts since a reading with one pick), must not lower
// its cost. A drop would send the next call to the busier endpoint.
func TestLLMCostIsMonotoneInLoad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	gib := float64(1 << 30)
	bump := func(st *scoring.State, f telemetry.Field, by, limit float64) {
		if v, ok := st.Telemetry.Get(f); ok {
			st.Telemetry.Set(f, min(v+by, limit))
		}
	}
	moves := map[string]func(r *rand.Rand, st *scoring.State){
		"in-flight": func(r *rand.Rand, st *scoring.State) { st.InFlight += 1 + r.Int64N(5) },
		"one more pick": func(r *rand.Rand, st *scoring.State) {
			n := 1 + r.Int64N(5)
			st.InFlight += n
			if st.Telemetry.Has.Has(telemetry.Running) || st.Telemetry.Has.Has(telemetry.Waiting) {
				st.InFlightSinceReading += n
			}
			if st.Telemetry.Has.Has(telemetry.KVCacheUsage) {
				st.InFlightSinceKV += n
			}
		},
		"in-flight tokens": func(r *rand.Rand, st *scoring.State) { st.InFlightTokens += 1 + r.Int64N(1<<14) },
		"error rate":       func(r *rand.Rand, st *scoring.State) { st.ErrorRate += (1 - st.ErrorRate) * r.Float64() },
		"waiting": func(r *rand.Rand, st *scoring.State) {
			bump(st, telemetry.Waiting, float64(1+r.IntN(5)), telemetry.MaxRequests)
		},
		"kv usage":   func(r *rand.Rand, st *scoring.State) { bump(st, telemetry.KVCacheUsage, r.Float64()*0.2, 1.5) },
		"app util":   func(r *rand.Rand, st *scoring.State) { bump(st, telemetry.AppUtil, r.Float64()*0.2, 2) },
		"gpu memory": func(r *rand.Rand, st *scoring.State) { bump(st, telemetry.GPUMemUsed, r.Float64()*4*gib, 100*gib) },
		"sent since reading": func(r *rand.Rand, st *scoring.State) {
			st.InFlightSinceReading += 1 + r.Int64N(5)
		},
		"sent since kv": func(r *rand.Rand, st *scoring.State) { st.InFlightSinceKV += 1 + r.Int64N(5) },
		"falls asleep": func(_ *rand.Rand, st *scoring.State) {
			if a, ok := st.Telemetry.Get(telemetry.Asleep); ok && a == 0 {
				st.Telemetry.Set(telemetry.Asleep, 1)
			}
		},
		"less weight": func(_ *rand.Rand, st *scoring.State) { st.Weight /= 2 },
		// Running is raised only where no call was sent since the KV
		// usage: with calls sent since, more running at the same usage is
		// a smaller share per call (projectKV), a different state; nor from
		// none, which leaves the usage unprojected.
		"running": func(r *rand.Rand, st *scoring.State) {
			if v, _ := st.Telemetry.Get(telemetry.Running); st.InFlightSinceKV <= 0 && v >= 1 {
				bump(st, telemetry.Running, float64(1+r.IntN(5)), telemetry.MaxRequests)
			}
		},
	}
	for _, l := range []*scoring.LLM{{}, {MaxKVPressure: 1000}, {QueueWeight: 0.5, TokenUnit: 1024, ErrorPenalty: 3}} {
		for name, move := range moves {
			for range 5000 {
				st := randomLLMState(r)
				before := l.Cost(req, st)
				more := st
				move(r, &more)
				if after := l.Cost(req, more); after < before*(1-1e-12) {
					t.Fatalf("%+v, %s: cost fell from %v to %v\nbefore: %+v\nafter:  %+v", *l, name, before, after, st, more)
				}
			}
		}
	}
}

func TestLatencyAndLeastLoadedCostsAreMonotoneInLoad(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	random := func() scoring.State {
		st := scoring.State{Now: now, Weight: []float64{0.5, 1, 2}[r.IntN(3)], InFlight: r.Int64N(20), LatencyDecay: 10 * time.Second}
		if r.IntN(4) > 0 {
			st.LatencyEWMA = time.Duration(r.Int64N(int64(500 * time.Millisecond)))
			st.LastLatency = now.Add(-time.Duration(r.Int64N(int64(time.Minute))))
		}
		if r.IntN(3) == 0 {
			st.ErrorRate = r.Float64()
		}
		return st
	}
	moves := map[string]func(st *scoring.State){
		"in-flight":   func(st *scoring.State) { st.InFlight += 1 + r.Int64N(5) },
		"error rate":  func(st *scoring.State) { st.ErrorRate += (1 - st.ErrorRate) * r.Float64() },
		"less weight": func(st *scoring.State) { st.Weight /= 2 },
		"slower": func(st *scoring.State) {
			if st.LatencyEWMA > 0 {
				st.LatencyEWMA += time.Duration(1 + r.Int64N(int64(100*time.Millisecond)))
			}
		},
		"measured more recently": func(st *scoring.State) {
			if st.LatencyEWMA > 0 {
				st.LastLatency = st.LastLatency.Add(time.Duration(r.Int64N(int64(now.Sub(st.LastLatency)) + 1)))
			}
		},
	}
	for _, sc := range []scoring.Scorer{&scoring.Latency{}, &scoring.Latency{Prior: time.Second}, &scoring.LeastLoaded{}} {
		for name, move := range moves {
			for range 5000 {
				st := random()
				before := sc.Cost(nil, st)
				more := st
				move(&more)
				if after := sc.Cost(nil, more); after < before*(1-1e-12) {
					t.Fatalf("%T %+v, %s: cost fell from %v to %v\nbefore: %+v\nafter:  %+v", sc, sc, name, before, after, st, more)
				}
			}
		}
	}
}
