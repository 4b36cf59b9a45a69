package balancer_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// publishLoRA reports each endpoint's adapter slots as vLLM does: one slot,
// with the adapter named in running[i] in it ("" for none).
func publishLoRA(b *balancer.Balancer, clock *testutil.Clock, slots float64, running ...string) {
	for i, ep := range endpoints(len(running)) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 1)
		s.Set(telemetry.Waiting, 0)
		a := &telemetry.Adapters{Base: "llama"}
		if running[i] != "" {
			a.Running = []string{running[i]}
		}
		s.SetAdapters(slots, a)
		b.Publish(ep.Addr, s)
	}
}

// A call for a LoRA adapter goes where a slot can take it: an endpoint
// whose only slot runs another adapter would hold it until that adapter's
// calls are done.
func TestLoRACallsAvoidFullSlots(t *testing.T) {
	clock := testutil.NewClock()
	// Adapter homes off: calls for one adapter, one at a time, would all
	// go to its home (TestAdapterHomes); here they spread by P2C.
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), AdapterHomes: -1})
	publishLoRA(b, clock, 1, "sql", "", "math", "sql")
	count := func(model string) map[string]int {
		c := map[string]int{}
		for range 400 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
			require.NoError(t, err)
			c[p.ID()]++
			p.Done(inferlb.Outcome{})
		}
		return c
	}
	eps := endpoints(4)
	c := count("math")
	t.Logf("math: %v", c)
	// Half the endpoints are full: a candidate is still full after its
	// two redraws one time in eight, both one pick in sixty-four.
	assert.LessOrEqual(t, c[eps[0].Addr]+c[eps[3].Addr], 400/32, "every slot there runs sql")
	assert.Greater(t, c[eps[2].Addr], c[eps[1].Addr], "running math beats loading it")

	c = count("llama")
	t.Logf("base model: %v", c)
	for _, ep := range eps {
		assert.InDelta(t, 100, c[ep.Addr], 40, "the base model needs no slot")
	}

	// Every slot full: nowhere is better, so no endpoint is passed over.
	clock.Advance(time.Second)
	publishLoRA(b, clock, 1, "sql", "chat", "law", "sql")
	c = count("math")
	t.Logf("all full: %v", c)
	for _, ep := range eps {
		assert.InDelta(t, 100, c[ep.Addr], 40)
	}

	// Stale: the filter and the factors go with the reading.
	publishLoRA(b, clock, 1, "sql", "", "math", "sql")
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	c = count("math")
	t.Logf("stale: %v", c)
	for _, ep := range eps {
		assert.InDelta(t, 100, c[ep.Addr], 40)
	}
}

// Under load the factors weigh against in-flight calls: an endpoint that
// must load the adapter takes calls once the one running it is busier,
// and the filter keeps the calls off the full ones all along.
func TestLoRAUnderLoad(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(4)})
	publishLoRA(b, clock, 1, "sql", "", "math", "sql")
	eps := endpoints(4)
	var held []balancer.Pick
	c := map[string]int{}
	for range 40 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "math"})
		require.NoError(t, err)
		c[p.ID()]++
		held = append(held, p)
	}
	t.Logf("40 held: %v", c)
	assert.LessOrEqual(t, c[eps[0].Addr]+c[eps[3].Addr], 2, "idle, but its slot runs sql")
	assert.Greater(t, c[eps[1].Addr], 10, "loading the adapter beats a queue")
	assert.Greater(t, c[eps[2].Addr], c[eps[1].Addr])
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
}

func TestLoRAPickDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock})
	publishLoRA(b, clock, 1, "sql", "", "math", "sql")
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "math", AffinityKey: 9}))
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "math"}))
}

// A keyed call's owner is passed over while its slots are full for the
// call's adapter, and the key comes back once a slot is free; a scorer
// that does not price the wait (LoRAWait 1) keeps the key home.
func TestLoRAAffinityPassesOverFullSlots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		scorer *scoring.LLM
		moved  bool
	}{
		{"default", nil, true},
		{"LoRAWait 1", &scoring.LLM{LoRAWait: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			// Homes off: the call follows its prompt's key, 77.
			opts := balancer.Options{Clock: clock, Rand: testutil.NewRand(5), AdapterHomes: -1}
			if tc.scorer != nil {
				opts.Scorers = map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: tc.scorer}
			}
			b := affine(t, 4, opts)
			const key = 77
			home := owner(t, b, key)
			running := make([]string, 4)
			for i, ep := range endpoints(4) {
				if ep.Addr == home {
					running[i] = "sql"
				}
			}
			publishLoRA(b, clock, 1, running...)
			pick := func(model string) string {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: key})
				require.NoError(t, err)
				p.Done(inferlb.Outcome{})
				return p.ID()
			}
			assert.Equal(t, home, pick("sql"), "its adapter runs there")
			assert.Equal(t, home, pick("llama"), "the base model takes no slot")
			if tc.moved {
				assert.NotEqual(t, home, pick("math"), "math would wait for sql's slot")
			} else {
				assert.Equal(t, home, pick("math"))
			}

			clock.Advance(1)
			publishLoRA(b, clock, 2, running...)
			assert.Equal(t, home, pick("math"), "a second slot is free")
		})
	}
}

// A Service the balancer does not know (a caller's own value) is routed
// as unknown traffic, LoRA readings or not.
func TestLoRAUnknownService(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock})
	publishLoRA(b, clock, 1, "sql", "", "math", "sql")
	p, err := b.Pick(&inferlb.Request{Service: inferlb.Service(200), Model: "math", AffinityKey: 5})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
}

// A scrape is as old as its interval: the calls this process sent since
// take slots too. Two endpoints, two slots each, one running sql in the
// last reading, the other made busier: once a call for math is in flight
// on the first, it is full for law, and free again when the call ends; a
// base-model call takes no slot.
func TestLoRACountsOwnCallsInFlight(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(8), AdapterHomes: -1})
	publishLoRA(b, clock, 2, "sql", "")
	eps := endpoints(2)
	on := func(model string, ep int) balancer.Pick {
		t.Helper()
		p, err := b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model}, eps[1-ep].Addr)
		require.NoError(t, err)
		require.Equal(t, eps[ep].Addr, p.ID())
		return p
	}
	lawOn0 := func() int {
		n := 0
		for range 100 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "law"})
			require.NoError(t, err)
			if p.ID() == eps[0].Addr {
				n++
			}
			p.Done(inferlb.Outcome{})
		}
		return n
	}
	for range 3 {
		busy := on("llama", 1)
		defer busy.Done(inferlb.Outcome{})
	}
	assert.Equal(t, 100, lawOn0(), "a free slot, and less load")

	math := on("math", 0)
	assert.LessOrEqual(t, lawOn0(), 100/8, "sql and math take its two slots")
	math.Done(inferlb.Outcome{})
	assert.Equal(t, 100, lawOn0(), "a slot is free again")

	base := on("llama", 0)
	assert.Equal(t, 100, lawOn0(), "a base-model call takes no slot")
	base.Done(inferlb.Outcome{})

	// A second call for the same adapter counts in the same entry, and
	// both must end before the slot is free.
	m1, m2 := on("math", 0), on("math", 0)
	m1.Done(inferlb.Outcome{})
	assert.LessOrEqual(t, lawOn0(), 100/8, "math still in flight")
	m2.Done(inferlb.Outcome{})
	assert.Equal(t, 100, lawOn0())
}

// A call sent to a given endpoint (PickAt: a Responses API follow-up)
// takes a slot there too.
func TestLoRAPickAtCountsTheCall(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(9)})
	publishLoRA(b, clock, 2, "sql", "")
	eps := endpoints(2)
	first, err := b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama"}, eps[1].Addr)
	require.NoError(t, err)
	serial := first.Serial()
	first.Done(inferlb.Outcome{})
	p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "math"}, serial)
	require.NoError(t, err)
	require.Equal(t, eps[0].Addr, p.ID())
	n := 0
	for range 100 {
		q, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "law"})
		require.NoError(t, err)
		if q.ID() == eps[0].Addr {
			n++
		}
		q.Done(inferlb.Outcome{})
	}
	assert.LessOrEqual(t, n, 100/8, "sql and math take its two slots")
	p.Done(inferlb.Outcome{})
}

// Calls for many adapters at once, from many goroutines, count and
// uncount without locks: once all are done every endpoint is free again.
func TestLoRAInFlightUnderConcurrency(t *testing.T) {
	clock := testutil.NewClock()
	// Homes off: "late", asked alone, would go home (see
	// TestAdapterHomesUnderConcurrency for the homes' own counts).
	b := newBalancer(t, 4, balancer.Options{Clock: clock, AdapterHomes: -1})
	publishLoRA(b, clock, 4, "", "", "", "")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("lora-%d", (g+i)%12)})
				if err != nil {
					t.Error(err)
					return
				}
				p.Done(inferlb.Outcome{})
			}
		}()
	}
	wg.Wait()
	// Nothing in flight: a fifth adapter finds every endpoint free.
	c := map[string]int{}
	for range 400 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "late"})
		require.NoError(t, err)
		c[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	for _, ep := range endpoints(4) {
		assert.InDelta(t, 100, c[ep.Addr], 40, "%s: %v", ep.Addr, c)
	}
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "late"}))
}

// homesOf picks n calls of model, each with its own prompt key, one at a
// time, and returns how many went to each endpoint.
func homesOf(t *testing.T, b *balancer.Balancer, model string, n int, req inferlb.Request) map[string]int {
	t.Helper()
	c := map[string]int{}
	for i := range n {
		r := req
		r.Service, r.Model, r.AffinityKey = inferlb.ServiceLLM, model, uint64(i+1)*0x9e3779b97f4a7c15
		p, err := b.Pick(&r)
		require.NoError(t, err)
		c[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	return c
}

// A rarely asked adapter goes to its home endpoint, whatever its calls'
// prompt keys, so it takes a slot on one endpoint instead of on every one
// its sessions reach; the base model, an explicit session and a Balancer
// with homes off follow the calls' own keys. Two Balancers with one
// AffinitySeed agree on each adapter's home.
func TestAdapterHomes(t *testing.T) {
	clock := testutil.NewClock()
	opts := balancer.Options{Clock: clock, Rand: testutil.NewRand(6), AffinitySeed: 42}
	b := affine(t, 8, opts)
	other := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(7), AffinitySeed: 42})
	off := opts
	off.AdapterHomes = -1
	spread := affine(t, 8, off)
	for _, x := range []*balancer.Balancer{b, other, spread} {
		publishLoRA(x, clock, 4, "", "", "", "", "", "", "", "")
	}
	homes := map[string]bool{}
	for _, model := range []string{"sql", "math", "law", "bio"} {
		c := homesOf(t, b, model, 50, inferlb.Request{})
		require.Len(t, c, 1, "%s: %v", model, c)
		for home := range c {
			homes[home] = true
			assert.Equal(t, c, homesOf(t, other, model, 50, inferlb.Request{}), "%s: another caller with the seed agrees", model)
		}
		assert.Greater(t, len(homesOf(t, spread, model, 50, inferlb.Request{})), 4, "%s: homes off, its prompts' keys spread it", model)
		assert.Greater(t, len(homesOf(t, b, model, 50, inferlb.Request{Session: true})), 4, "%s: a session keeps its key", model)
	}
	assert.Greater(t, len(homes), 1, "adapters have homes of their own")
	assert.Greater(t, len(homesOf(t, b, "llama", 50, inferlb.Request{})), 4, "the base model is no adapter")

	// Without a reading of the adapters (stale telemetry), nothing is
	// known to be an adapter: calls follow their keys.
	clock.Advance(time.Hour)
	assert.Greater(t, len(homesOf(t, b, "sql", 50, inferlb.Request{})), 4)
}

// An adapter with more than one endpoint's fair share of the calls in
// flight is popular: its calls spread by their keys, while a rare one
// still goes home; once the popular one's calls end, it is rare again.
func TestAdapterHomesSpreadPopularAdapters(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(6)})
	publishLoRA(b, clock, 4, "", "", "", "", "", "", "", "")
	var held []balancer.Pick
	hold := func(model string, n int) {
		for i := range n {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: uint64(1000 + i)})
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	// 24 calls in flight, 8 endpoints: a fair share is 3. hot has 12 (and
	// it became popular on the way), the base model 12.
	hold("hot", 12)
	hold("llama", 12)
	assert.Greater(t, len(homesOf(t, b, "hot", 50, inferlb.Request{})), 4, "hot spreads by prompt")
	assert.Len(t, homesOf(t, b, "cold", 50, inferlb.Request{}), 1, "cold goes home")
	hold("cold", 3)
	assert.Len(t, homesOf(t, b, "cold", 50, inferlb.Request{}), 1, "3 of 27 in flight: still at most a fair share")
	hold("cold", 1)
	assert.Greater(t, len(homesOf(t, b, "cold", 50, inferlb.Request{})), 4, "4 of 28: more than a fair share")
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	assert.Len(t, homesOf(t, b, "hot", 50, inferlb.Request{}), 1, "nothing in flight: hot is rare again")
}

// The homes' counts are lock-free: after calls for many adapters from
// many goroutines end, every adapter asked alone goes home again (a count
// left behind would make it look popular).
func TestAdapterHomesUnderConcurrency(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock})
	publishLoRA(b, clock, 4, "", "", "", "")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []balancer.Pick
			for i := range 200 {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprintf("lora-%d", (g+i)%12), AffinityKey: uint64(g*1000 + i + 1)})
				if err != nil {
					t.Error(err)
					return
				}
				held = append(held, p)
				if len(held) == 5 {
					for _, h := range held {
						h.Done(inferlb.Outcome{})
					}
					held = held[:0]
				}
			}
			for _, h := range held {
				h.Done(inferlb.Outcome{})
			}
		}()
	}
	wg.Wait()
	for k := range 12 {
		model := fmt.Sprintf("lora-%d", k)
		assert.Len(t, homesOf(t, b, model, 20, inferlb.Request{}), 1, model)
	}
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "lora-1", AffinityKey: 5}))
}

func TestAdapterHomesValidate(t *testing.T) {
	assert.ErrorContains(t, (&balancer.Options{AdapterHomes: math.NaN()}).Validate(), "AdapterHomes")
	assert.ErrorContains(t, (&balancer.Options{AdapterHomes: math.Inf(1)}).Validate(), "AdapterHomes")
	assert.NoError(t, (&balancer.Options{AdapterHomes: -1}).Validate())
	assert.NoError(t, (&balancer.Options{AdapterHomes: 0.5}).Validate())
}

// publishBases publishes a reading of one running call to endpoint i of
// endpoints(len(bases)), with LoRA slots and base model bases[i], or
// without a LoRA reading where bases[i] is "" (a server without LoRA).
func publishBases(b *balancer.Balancer, clock *testutil.Clock, bases []string) {
	for i, ep := range endpoints(len(bases)) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 1)
		s.Set(telemetry.Waiting, 0)
		if bases[i] != "" {
			s.SetAdapters(4, &telemetry.Adapters{Base: bases[i]})
		}
		b.Publish(ep.Addr, s)
	}
}

// In a fleet of two base models whose endpoints carry no subset labels
// (the not-served memory sorts out who serves what), a call for one
// base model is a base-model call where it lands: it follows its prompt
// key, whichever base the group's first reading names. adapterCall
// judges by that one reading, and the base model of the other endpoints
// was taken for a rarely asked adapter (its calls never count as an
// adapter's, so it never grew popular): every call of it went to one
// home, whatever its prompt.
func TestAdapterHomesLeaveAnotherBaseModelAlone(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(6)})
	bases := slices.Repeat([]string{"mistral"}, 8)
	bases[0] = "llama" // the first member's reading
	publishBases(b, clock, bases)
	assert.Greater(t, len(homesOf(t, b, "mistral", 50, inferlb.Request{})), 4, "mistral is the base model of seven endpoints")
	assert.Greater(t, len(homesOf(t, b, "llama", 50, inferlb.Request{})), 4, "and llama of the first")
	assert.Len(t, homesOf(t, b, "sql", 50, inferlb.Request{}), 1, "an adapter still goes home")
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "mistral", AffinityKey: 5}))
}

// In a fleet without subset labels where only some servers run with LoRA
// enabled (the others export no vllm:lora_requests_info), a call for the
// other servers' model is read as an adapter's by adapterCall (it is not
// the base model of the first reading) and sent to a home; landing on a
// server without a reading it was never counted as an adapter's call
// (countLoRA reads the endpoint's own reading), so it never grew
// popular: every call of that model went to one server, whatever its
// prompt. A homed pick whose endpoint has no reading of its adapters is
// made again with the call's own key, as one whose endpoint reads the
// call as its base model is.
func TestAdapterHomesLeaveServersWithoutAReadingAlone(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(6)})
	// llama with LoRA; the other four serve mistral without
	publishBases(b, clock, []string{"llama", "llama", "llama", "llama", "", "", "", ""})
	assert.Greater(t, len(homesOf(t, b, "mistral", 50, inferlb.Request{})), 4, "mistral calls follow their prompt keys")
	assert.Greater(t, len(homesOf(t, b, "llama", 50, inferlb.Request{})), 4, "and so do llama's")
	sql := homesOf(t, b, "sql", 50, inferlb.Request{})
	require.Len(t, sql, 1, "an adapter still goes home: %v", sql)
	for home := range sql {
		assert.Contains(t, []string{endpoints(8)[0].Addr, endpoints(8)[1].Addr, endpoints(8)[2].Addr, endpoints(8)[3].Addr}, home, "a server that reports its adapters")
	}
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "mistral", AffinityKey: 5}))
}

// A home whose reading of its adapters was dropped (a reconnect, its
// failures: Telemetry().Expire) or went stale still serves adapters; only
// which it holds is not known for now. It keeps its homes: a rare
// adapter's calls, made again with their own keys, would each load the
// adapter wherever their prompts go until the next scrape.
func TestAdapterHomeWithoutAFreshReadingKeepsItsHomes(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(6)})
	publishBases(b, clock, slices.Repeat([]string{"llama"}, 8))
	sql := homesOf(t, b, "sql", 50, inferlb.Request{})
	require.Len(t, sql, 1, "a rare adapter goes home: %v", sql)
	var home string
	for h := range sql {
		home = h
	}
	clock.Advance(time.Second)
	require.True(t, b.Telemetry().Expire(home, telemetry.ProcessLoad, clock.Now()))
	assert.Equal(t, map[string]int{home: 50}, homesOf(t, b, "sql", 50, inferlb.Request{}), "the home kept its adapter's calls")
}

// Adapter names are request data: one that shares another adapter's tag
// in the LoRA tables (32 bits of a hash) would be counted as that
// adapter. Of the unseeded model hash, such names take a birthday search
// of about 2^16 names to find (these two were found so:
// "sql-lora-112419" and "sql-lora-131351" share the high 32 bits of
// their xxhash); under the Balancer's seed they are two adapters.
func TestLoRATagsAreSeeded(t *testing.T) {
	const a, b2 = "sql-lora-112419", "sql-lora-131351"
	require.Equal(t, xxhash.Sum64String(a)>>32, xxhash.Sum64String(b2)>>32, "the names' unseeded tags collide")
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(8), AdapterHomes: -1, AffinitySeed: 7})
	publishLoRA(b, clock, 2, "sql", "")
	eps := endpoints(2)
	for range 3 { // endpoint 1 is the busier: every call prefers 0 unless its slots are full
		p, err := b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama"}, eps[0].Addr)
		require.NoError(t, err)
		defer p.Done(inferlb.Outcome{})
	}
	// a runs on endpoint 0 beside sql: its two slots are taken.
	pa, err := b.PickExcept(&inferlb.Request{Service: inferlb.ServiceLLM, Model: a}, eps[1].Addr)
	require.NoError(t, err)
	require.Equal(t, eps[0].Addr, pa.ID())
	defer pa.Done(inferlb.Outcome{})
	on0 := 0
	for range 100 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: b2})
		require.NoError(t, err)
		if p.ID() == eps[0].Addr {
			on0++
		}
		p.Done(inferlb.Outcome{})
	}
	assert.LessOrEqual(t, on0, 100/8, "%s waits for a slot on endpoint 0, where %s and sql run", b2, a)
}
