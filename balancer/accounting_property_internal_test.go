package balancer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// accountingFleet is a fleet of model groups, LoRA slots and a
// data-parallel engine, so that a pick touches every counter there is.
func accountingFleet() []inferlb.Endpoint {
	ep := func(id, models, dp string) inferlb.Endpoint {
		e := inferlb.Endpoint{ID: id, Addr: id + ":1", Labels: map[string]string{}}
		if models != "" {
			e.Labels[DefaultSubsetLabel] = models
		}
		if dp != "" {
			e.Labels[DefaultDPGroupLabel] = dp
		}
		return e
	}
	return []inferlb.Endpoint{
		ep("e1", "base,sql,chat", ""), ep("e2", "base,sql", ""), ep("e3", "base,chat", "g1"),
		ep("e4", "base", "g1"), ep("e5", "", ""), ep("e6", "other", ""),
	}
}

var (
	// Values past 32 bits are capped at math.MaxInt, for 32-bit platforms.
	accTokens   = []int{0, 1, 100, 4096, -1, -100, 1 << 22, math.MaxInt32, min(math.MaxInt32+1, math.MaxInt), math.MaxInt, math.MinInt, min(1<<40, math.MaxInt)}
	accModels   = []string{"", "base", "sql", "chat", "other", "nosuch"}
	accDuration = []time.Duration{0, -time.Second, time.Millisecond, 2 * time.Second, math.MaxInt64, math.MinInt64, time.Hour * 24 * 365}
)

func randOutcome(r *rand.Rand, model string) inferlb.Outcome {
	o := inferlb.Outcome{
		Latency:      accDuration[r.IntN(len(accDuration))],
		TTFT:         accDuration[r.IntN(len(accDuration))],
		OutputTokens: accTokens[r.IntN(len(accTokens))],
	}
	if r.IntN(2) == 0 {
		o.Model = model
	}
	switch r.IntN(8) {
	case 0: // success
	case 1:
		o.Err = errors.New("boom")
	case 2:
		o.Overloaded, o.RetryAfter = true, accDuration[r.IntN(len(accDuration))]
	case 3:
		o.Err = fmt.Errorf("wrapped: %w", context.Canceled)
	case 4:
		o.NotServedModel = accModels[r.IntN(len(accModels))]
		if o.NotServedModel == "" {
			o.NotServedModel = "x"
		}
	case 5:
		o.ContextWindow = accTokens[r.IntN(len(accTokens))]
		o.PromptWindow = r.IntN(2) == 0
	case 6:
		o.Err, o.Overloaded = errors.New("busy"), true
	case 7:
		o.Err, o.NotServedModel, o.ContextWindow = context.Canceled, "sql", 10
	}
	return o
}

func randRequest(r *rand.Rand) *inferlb.Request {
	req := &inferlb.Request{
		Service:              inferlb.Service(r.IntN(inferlb.NumServices + 1)),
		Model:                accModels[r.IntN(len(accModels))],
		PromptTokens:         accTokens[r.IntN(len(accTokens))],
		MaxOutputTokens:      accTokens[r.IntN(len(accTokens))],
		SequenceOutputTokens: int32(accTokens[r.IntN(len(accTokens))]),
		Session:              r.IntN(4) == 0,
	}
	if r.IntN(3) == 0 {
		req.LongestInput = accTokens[r.IntN(len(accTokens))]
	}
	if r.IntN(2) == 0 {
		req.AffinityKey = r.Uint64()%16 + 1
	}
	if r.IntN(2) == 0 {
		req.Tenant = fmt.Sprint("t", r.IntN(4))
	}
	return req
}

func checkStatsSane(t *testing.T, b *Balancer, step int) {
	t.Helper()
	for _, s := range b.Stats() {
		ok := s.InFlight >= 0 && s.InFlightTokens >= 0 && s.Latency >= 0 && s.TTFT >= 0 &&
			s.TimePerOutputToken >= 0 && s.ErrorRate >= 0 && s.ErrorRate <= 1 && !math.IsNaN(s.ErrorRate) &&
			s.RampFactor > 0 && s.RampFactor <= 1 && s.Weight > 0 && s.LastDetection >= 0 && s.LastDowntime >= 0
		for _, l := range s.ServiceLatency {
			ok = ok && l >= 0
		}
		if !assert.True(t, ok, "step %d: %+v", step, s) {
			t.FailNow()
		}
	}
}

// After any sequence of picks and Dones, with every kind of outcome, Done
// called twice, absurd token counts, latencies and clock steps, every
// in-flight counter is back at zero and Stats reports nothing negative or
// NaN.
func TestAccountingProperty(t *testing.T) {
	defer func(n int) { countedGroup = n }(countedGroup)
	countedGroup = 0 // every group keeps a counter
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, seed*7))
			clock := testutil.NewClock()
			if seed%4 == 0 {
				clock.Set(time.Time{}) // a fake clock from the zero Time
			}
			opts := Options{Clock: clock, Rand: testutil.NewRand(seed), StickyTTL: time.Minute}
			switch seed % 3 {
			case 1:
				opts.TenantShardSize, opts.Affinity = 2, AffinityPrefer
			case 2:
				opts.TenantShardSize, opts.TenantShardStrict, opts.MinKeyReuse = 3, true, 0.1
			}
			b := New(opts)
			other, err := b.NewMembership()
			require.NoError(t, err)
			fleet := accountingFleet()
			require.NoError(t, b.Update(fleet))
			require.NoError(t, other.Update(fleet[2:]))
			publish := func() {
				for i, e := range fleet {
					var s telemetry.Sample
					s.Time = clock.Now()
					s.Set(telemetry.Running, float64(i))
					s.SetAdapters(2, &telemetry.Adapters{Base: "base", Running: []string{"sql"}})
					b.Publish(e.ID, s)
				}
			}
			publish()
			var out []Pick
			touched := map[*endpoint]uint64{}
			for step := range 6000 {
				switch k := r.IntN(100); {
				case k < 45:
					req := randRequest(r)
					var p Pick
					var err error
					switch r.IntN(6) {
					case 0:
						p, err = other.Pick(req)
					case 1:
						p, err = b.PickRetry(req, fleet[r.IntN(len(fleet))].ID)
					case 2:
						p, err = b.PickNotServedRetry(req, fleet[r.IntN(len(fleet))].ID)
					case 3:
						p, err = b.PickAt(req, uint64(r.IntN(8)))
					default:
						p, err = b.Pick(req)
					}
					if err == nil {
						touched[p.e]++
						out = append(out, p)
					}
				case k < 85 && len(out) > 0:
					i := r.IntN(len(out))
					o := randOutcome(r, accModels[r.IntN(len(accModels))])
					out[i].Done(o)
					if r.IntN(4) == 0 {
						out[i].Done(randOutcome(r, "sql"))
					}
					out = append(out[:i], out[i+1:]...)
				case k < 93:
					clock.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
				case k < 95:
					clock.Advance(-time.Duration(r.IntN(7200)) * time.Second)
				case k < 97:
					publish()
				case k < 99:
					n := 2 + r.IntN(len(fleet)-1)
					require.NoError(t, b.Update(fleet[:n]))
				default:
					b.SetReady(fleet[r.IntN(len(fleet))].ID, r.IntN(2) == 0)
				}
				if step%100 == 0 {
					checkStatsSane(t, b, step)
				}
			}
			for i := range out {
				out[i].Done(inferlb.Outcome{})
			}
			checkStatsSane(t, b, -1)
			for e, n := range touched {
				assert.Equal(t, n, e.pickCount(), "%s picks", e.id)
				assert.GreaterOrEqual(t, b.retry.tokens.Load(), int64(0), "retry budget")
				assert.Zero(t, e.inFlight.Load(), "%s in flight", e.id)
				assert.Zero(t, e.inFlightTokens.Load(), "%s tokens in flight", e.id)
				for i := range e.lora {
					assert.Zero(t, uint32(e.lora[i].Load()), "%s lora entry %d", e.id, i)
				}
				// What ended calls leave of the recent-prefill estimate is
				// rounding and the decay's approximation, gone once it decays.
				left := e.prefill.at(clock.Now().UnixNano())
				assert.True(t, left >= 0 && !math.IsInf(left, 0), "%s prefill left %g", e.id, left)
				assert.Zero(t, e.prefill.at(clock.Now().Add(32*prefillWindow).UnixNano()), "%s prefill decayed", e.id)
				for svc := range e.lat {
					assert.GreaterOrEqual(t, e.lat[svc].ewma.Load(), int64(0), "%s latency", e.id)
				}
			}
			for i := range b.adapters.flight {
				assert.Zero(t, uint32(b.adapters.flight[i].Load()), "adapter entry %d", i)
			}
			for _, m := range []*Membership{b.def, other} {
				for key, c := range m.loads {
					assert.Zero(t, c.Load(), "membership %d group %q load", m.idx, key)
				}
			}
		})
	}
}

// The same under concurrency: pickers on several goroutines end their
// calls with every kind of outcome while the clock moves both ways and
// the fleet changes.
func TestAccountingPropertyConcurrent(t *testing.T) {
	defer func(n int) { countedGroup = n }(countedGroup)
	countedGroup = 0
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(5), StickyTTL: time.Minute, TenantShardSize: 2, BreakerFailures: 3})
	other, err := b.NewMembership()
	require.NoError(t, err)
	fleet := accountingFleet()
	require.NoError(t, b.Update(fleet))
	require.NoError(t, other.Update(fleet[2:]))
	var mu sync.Mutex
	touched := map[*endpoint]uint64{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			var out []Pick
			seen := map[*endpoint]uint64{}
			for range 5000 {
				switch k := r.IntN(100); {
				case k < 50:
					req := randRequest(r)
					pick := b.Pick
					if r.IntN(3) == 0 {
						pick = other.Pick
					}
					if p, err := pick(req); err == nil {
						seen[p.e]++
						out = append(out, p)
					}
				case k < 95 && len(out) > 0:
					i := r.IntN(len(out))
					out[i].Done(randOutcome(r, accModels[r.IntN(len(accModels))]))
					out[i].Done(inferlb.Outcome{})
					out = append(out[:i], out[i+1:]...)
				case k < 98:
					clock.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
				case k < 99:
					clock.Advance(-time.Duration(r.IntN(600)) * time.Second)
				default:
					_ = b.Update(fleet[:2+r.IntN(len(fleet)-1)])
				}
			}
			for i := range out {
				out[i].Done(inferlb.Outcome{Err: errors.New("late")})
			}
			mu.Lock()
			for e, n := range seen {
				touched[e] += n
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	checkStatsSane(t, b, -1)
	for e, n := range touched {
		assert.Equal(t, n, e.pickCount(), "%s picks", e.id)
		assert.Zero(t, e.inFlight.Load(), "%s in flight", e.id)
		assert.Zero(t, e.inFlightTokens.Load(), "%s tokens in flight", e.id)
		assert.GreaterOrEqual(t, e.probeSlots.Load(), int32(0), "%s probe slots", e.id)
		assert.LessOrEqual(t, e.probeSlots.Load(), int32(b.cfg.breakerProbes), "%s probe slots", e.id)
	}
	for _, m := range []*Membership{b.def, other} {
		for key, c := range m.loads {
			assert.Zero(t, c.Load(), "membership %d group %q load", m.idx, key)
		}
	}
}
