package fleetsim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
	"github.com/inferlb/inferlb/telemetry"
)

// loraServer is one replica that runs at most slots adapters in a batch.
func loraServer(slots int, load time.Duration) []fleetsim.ReplicaSpec {
	p := fleetsim.LLMServer()
	p.MaxLoRAs, p.LoRALoad = slots, load
	return []fleetsim.ReplicaSpec{{Server: p}}
}

// adapterCall is a call for model (an adapter, or fleetsim.Model), classed
// class so the run's LoRA result reports its latency alone.
func adapterCall(id uint64, model, class string, out int) *fleetsim.Request {
	c := llmCall(id, 200, out)
	c.Model, c.Class = model, class
	return c
}

// byClass returns the run's latency of each class.
func byClass(t *testing.T, res fleetsim.Result) map[string]fleetsim.LoRAClass {
	t.Helper()
	require.NotNil(t, res.LoRA)
	out := map[string]fleetsim.LoRAClass{}
	for _, c := range res.LoRA.Classes {
		out[c.Class] = c
	}
	return out
}

// vLLM V1's scheduler, with --max-loras 2: while lora-a and lora-b run, a
// request for lora-c is skipped (it keeps its place in the queue), and
// admitted once every request of one running adapter has finished
// (lora-b's), not when the whole batch has. A base-model request is never
// held, and a lora-a request behind the held one is admitted at once: no
// head-of-line blocking.
func TestAThirdAdapterWaitsForASlot(t *testing.T) {
	w := calls{
		adapterCall(1, "lora-a", "a long", 2000),
		adapterCall(2, "lora-b", "b", 200),
		adapterCall(3, "lora-c", "c", 10),
		adapterCall(4, fleetsim.Model, "base", 10),
		adapterCall(5, "lora-a", "a later", 10),
	}
	res := runScripted(loraServer(2, 0), w, &scripted{script: []int{0, 0, 0, 0, 0}})
	require.Equal(t, 5, res.Completed)
	c := byClass(t, res)
	t.Logf("%+v", c)
	assert.Greater(t, c["c"].TTFTP50, c["b"].E2EP50, "lora-c starts after lora-b's only request has finished")
	assert.Less(t, c["c"].E2EP50, c["a long"].E2EP50/2, "and long before lora-a's does")
	assert.Less(t, c["base"].TTFTP50, 0.1, "the base model takes no slot")
	assert.Less(t, c["a later"].TTFTP50, 0.1, "a running adapter's request passes the held one")
	assert.Greater(t, c["b"].E2EP50, 2.0, "200 tokens at 12 ms or more a step")

	l := res.LoRA
	assert.Equal(t, 4, l.AdapterCalls)
	assert.Equal(t, 1, l.SlotWaited)
	assert.InDelta(t, c["c"].TTFTP50, c["c"].SlotWaitMean, 0.05, "lora-c's wait is nearly all its time to first token")
	assert.InDelta(t, c["c"].SlotWaitMean/4, l.SlotWaitMean, 1e-9, "one adapter call of four waited")
	assert.Equal(t, []int{3}, l.Loads, "lora-a, lora-b, then lora-c in lora-b's slot")

	// Without the limit, nothing waits.
	res = runScripted(loraServer(0, 0), w, &scripted{script: []int{0, 0, 0, 0, 0}})
	assert.Nil(t, res.LoRA, "no replica limits adapters")
	assert.Less(t, res.TTFTP99, 0.1)
}

// timed is one request of an at workload.
type timed struct {
	d   time.Duration
	req *fleetsim.Request
}

// at sends each request at its own time.
type at []timed

func (a at) Start(s fleetsim.Sim) {
	for _, c := range a {
		s.After(c.d, func() { s.Submit(c.req) })
	}
}

func (at) Done(fleetsim.Sim, *fleetsim.Request, bool) {}

// The GPU holds max_loras adapters, least recently used out first, and a
// step that admits a request whose adapter is not among them is longer
// by the load. Requests one at a time for lora-a, b, a, c, b on 2 slots:
// a and b load, a is resident, c replaces b (used less recently than a),
// and b loads again.
func TestAdapterSlotsAreAnLRUAndALoadCostsTime(t *testing.T) {
	order := []string{"lora-a", "lora-b", "lora-a", "lora-c", "lora-b"}
	run := func(load time.Duration) fleetsim.Result {
		var w at
		for i, m := range order {
			w = append(w, timed{time.Duration(i+1) * time.Second, adapterCall(uint64(10*(i+1)), m, string(rune('0'+i)), 5)})
		}
		s := &fleetsim.Scenario{Name: "lru", Fleet: loraServer(2, load), DiscoveryDelay: 10 * time.Second,
			Workload: func(float64) fleetsim.Workload { return w }}
		rt := &scripted{script: make([]int, len(order))}
		return fleetsim.Run(s, rt.policy(), fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: time.Minute, Drain: time.Minute, Scrape: time.Second})
	}
	slow, fast := run(20*time.Millisecond), run(0)
	require.Equal(t, 5, slow.Completed)
	assert.Equal(t, []int{4}, slow.LoRA.Loads, "a, b, c in b's slot, b in a's")
	assert.Equal(t, []int{4}, fast.LoRA.Loads)
	assert.Zero(t, slow.LoRA.SlotWaited, "one request at a time never waits for a slot")
	s, f := byClass(t, slow), byClass(t, fast)
	for i, want := range []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 0, 20 * time.Millisecond, 20 * time.Millisecond} {
		k := string(rune('0' + i))
		assert.InDelta(t, want.Seconds(), s[k].TTFTP50-f[k].TTFTP50, 1e-9, "request %d (%s): the load's delay", i, order[i])
	}
}

// recorder routes every call to replica 0 and keeps every sample
// published to it.
type recorder struct {
	scripted
	samples []telemetry.Sample
}

func (r *recorder) Pick(*fleetsim.Request) (int, func(inferlb.Outcome), error) { return 0, noop, nil }
func (r *recorder) Publish(i int, s telemetry.Sample) {
	if i == 0 {
		r.samples = append(r.samples, s)
	}
}
func (r *recorder) router(fleetsim.Env) fleetsim.Router { return r }

func noop(inferlb.Outcome) {}

// A replica that limits its adapters publishes them as vLLM's
// vllm:lora_requests_info does: its slots (max_lora), the base model, and
// the adapters of its running and of its waiting requests, sorted, once
// each, and without the base model; a new Adapters for each scrape. One
// that does not limit them publishes neither.
func TestScrapePublishesTheAdaptersInUse(t *testing.T) {
	w := calls{
		adapterCall(1, "lora-b", "", 2000),
		adapterCall(2, "lora-a", "", 2000),
		adapterCall(3, "lora-a", "", 2000),
		adapterCall(4, "lora-c", "", 2000), // held: two adapters run
		adapterCall(5, fleetsim.Model, "", 2000),
		adapterCall(6, "lora-d", "", 2000), // held
		adapterCall(7, "lora-c", "", 2000), // held
	}
	scrape := func(slots int) []telemetry.Sample {
		rt := &recorder{}
		sc := &fleetsim.Scenario{Name: "scrape", Fleet: loraServer(slots, 0), DiscoveryDelay: 10 * time.Second,
			Workload: func(float64) fleetsim.Workload { return w }}
		fleetsim.Run(sc, fleetsim.Policy{Name: "recorder", New: rt.router},
			fleetsim.RunConfig{Rate: 1, Seed: 1, Duration: 3 * time.Second, Drain: time.Second, Scrape: time.Second})
		return rt.samples
	}
	got := scrape(2)
	require.GreaterOrEqual(t, len(got), 3, "scrapes at 0s, 1s, 2s, ...")
	assert.Nil(t, got[0].Adapters.Running, "nothing sent yet at 0s")
	for _, s := range got[1:3] {
		v, ok := s.Get(telemetry.LoRASlots)
		require.True(t, ok)
		assert.Equal(t, 2.0, v)
		assert.Equal(t, &telemetry.Adapters{Base: fleetsim.Model, Running: []string{"lora-a", "lora-b"}, Waiting: []string{"lora-c", "lora-d"}}, s.Adapters)
		n, _ := s.Get(telemetry.Running)
		assert.Equal(t, 4.0, n, "3 adapter calls and the base model's")
	}
	assert.NotSame(t, got[1].Adapters, got[2].Adapters, "built anew for each scrape")

	for _, s := range scrape(0) {
		assert.False(t, s.Has.Has(telemetry.LoRASlots))
		assert.Nil(t, s.Adapters)
	}
}

// shortLoRASlots is the lora-slots scenario cut to run in seconds under
// -race: a 1-minute window.
func shortLoRASlots() *fleetsim.Scenario {
	sc := fleetsim.LoRASlotsScenario()
	sc.Warmup, sc.Duration, sc.Drain = 30*time.Second, 90*time.Second, 60*time.Second
	return sc
}

// The scenario is deterministic, inferlb's real Balancer included, and
// it has the contention it is about: with every adapter on every
// replica, round-robin's calls wait for slots and load adapters.
func TestLoRASlotsScenarioIsDeterministic(t *testing.T) {
	t.Parallel()
	sc := shortLoRASlots()
	for _, p := range []fleetsim.Policy{fleetsim.RoundRobin(), fleetsim.InferLB(fleetsim.Variant{Name: "inferlb"})} {
		a, b := runAt(sc, p, 1, 3), runAt(sc, p, 1, 3)
		assert.Equal(t, a, b, "%s: same seed, same result", p.Name)
		require.NotNil(t, a.LoRA, p.Name)
		assert.Positive(t, a.LoRA.AdapterCalls, p.Name)
		assert.Len(t, a.LoRA.Loads, len(sc.Fleet), p.Name)
		var classes []string
		for _, c := range a.LoRA.Classes {
			classes = append(classes, c.Class)
		}
		assert.Equal(t, []string{"base", "cold", "hot", "warm"}, classes, p.Name)
	}
	rr := runAt(sc, fleetsim.RoundRobin(), 1, 3)
	assert.Positive(t, rr.LoRA.SlotWaited, "round-robin puts every adapter on every replica")
	assert.Positive(t, rr.LoRA.TotalLoads())
	assert.NotEqual(t, rr, runAt(sc, fleetsim.RoundRobin(), 1, 4), "the seed matters")
}
