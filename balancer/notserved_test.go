package balancer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// loraFleet routes calls over three endpoints of which only the first
// serves the model "adapter-a" (a LoRA adapter loaded on one replica); the
// others answer its calls at once that they do not serve it, as vLLM does
// with a 404. The base model "base" is served everywhere. Calls alternate
// between the two models and each served call stays in flight for hold
// picks. It returns how many of the last 300 adapter calls went to an
// endpoint without the adapter, and the Balancer.
func loraFleet(t *testing.T, opts balancer.Options, hold int) (int, *balancer.Balancer) {
	t.Helper()
	clock := testutil.NewClock()
	opts.Clock, opts.Rand, opts.OutlierInterval = clock, testutil.NewRand(3), -1
	b := newBalancer(t, 3, opts)
	owner := endpoints(3)[0].Addr
	var held []balancer.Pick
	missed := 0
	const calls = 1200 // 600 of each model
	for i := range calls {
		model := "base"
		if i%2 == 1 {
			model = "adapter-a"
		}
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, PromptTokens: 100, MaxOutputTokens: 100})
		require.NoError(t, err)
		if model == "adapter-a" && p.ID() != owner {
			p.Done(inferlb.Outcome{NotServedModel: model, Latency: time.Millisecond})
			if i >= calls-600 {
				missed++
			}
		} else {
			held = append(held, p)
			if len(held) > hold {
				held[0].Done(inferlb.Outcome{Latency: 2 * time.Second, OutputTokens: 100})
				held = held[1:]
			}
		}
		clock.Advance(10 * time.Millisecond)
	}
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	return missed, b
}

// TestNotServedModelIsPassedOver: an endpoint that answers at once that
// it does not serve a model has nothing in flight, so priced by load it
// is the best candidate for that model's calls. Without the memory, most
// of the adapter's calls went to the two endpoints without it; with it,
// after the first answer of each, only the rediscoveries once the memory
// lapses (12 s of calls here, 30 s memory: none). The answers count as
// neither success nor failure (no trip however many), and the base
// model's calls still use all three endpoints.
func TestNotServedModelIsPassedOver(t *testing.T) {
	off, _ := loraFleet(t, balancer.Options{NotServedMemory: -1}, 12)
	var events []balancer.Event
	on, b := loraFleet(t, balancer.Options{OnEvent: func(e balancer.Event) { events = append(events, e) }}, 12)
	t.Logf("adapter calls of the last 300 sent to an endpoint without it: %d without the memory, %d with it", off, on)
	assert.Greater(t, off, 150, "without the memory, the endpoints without the adapter look idle")
	assert.Zero(t, on, "with the memory, no adapter call goes where it is not served")

	var notServed, failures, trips uint64
	for _, s := range b.Stats() {
		notServed += s.NotServed
		failures += s.Failures
		trips += s.Trips
		assert.Positive(t, s.Successes, "%s serves the base model", s.ID)
		assert.Equal(t, s.Picks, s.Successes+s.NotServed, "%s: every pick ended as a success or a not-served answer", s.ID)
	}
	assert.Equal(t, uint64(2), notServed, "one answer from each endpoint without the adapter")
	assert.Zero(t, failures)
	assert.Zero(t, trips)
	require.Len(t, events, 2, "one event per endpoint and model")
	for _, e := range events {
		assert.Equal(t, balancer.EventNotServed, e.Kind)
		assert.Equal(t, "adapter-a", e.Model)
		assert.Equal(t, 30*time.Second, e.Until.Sub(e.At), "DefaultNotServedMemory")
		assert.Equal(t, "not-served", e.Kind.String())
	}
}

// TestNotServedMemoryLapses: once NotServedMemory has passed, the endpoint
// is a candidate for the model again (the adapter may have been loaded
// since); while it lasts, it is passed over for that model only.
func TestNotServedMemoryLapses(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(1), NotServedMemory: 5 * time.Second})
	lacking := endpoints(2)[1].Addr
	reportNotServed(t, b, lacking, "m")
	assert.False(t, reaches(t, b, lacking, "m"), "remembered")
	assert.True(t, reaches(t, b, lacking, "other"), "another model's picks are not affected")
	clock.Advance(4900 * time.Millisecond)
	assert.False(t, reaches(t, b, lacking, "m"), "still remembered before NotServedMemory has passed")
	clock.Advance(200 * time.Millisecond)
	assert.True(t, reaches(t, b, lacking, "m"), "a candidate again once the memory lapsed")
}

// reportNotServed picks embedding calls for model, which the other
// endpoints serve, until one lands on lacking, which answers that it does
// not serve it.
func reportNotServed(t *testing.T, b *balancer.Balancer, lacking, model string) {
	t.Helper()
	for {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: model})
		require.NoError(t, err)
		if p.ID() == lacking {
			p.Done(inferlb.Outcome{NotServedModel: model})
			return
		}
		p.Done(inferlb.Outcome{Latency: time.Millisecond})
	}
}

// reaches reports whether any of 60 embedding calls for model is picked
// for the endpoint to, each answered at once (so load does not decide).
func reaches(t *testing.T, b *balancer.Balancer, to, model string) bool {
	t.Helper()
	for range 60 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: model})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Latency: time.Millisecond})
		if p.ID() == to {
			return true
		}
	}
	return false
}

// TestNotServedEverywhereStillPicks: when every endpoint is remembered not
// to serve a model (a typo, or memory older than the adapter's loading),
// its calls are picked as if nothing were remembered, never failed by the
// balancer: the server's answer is the caller's to see.
func TestNotServedEverywhereStillPicks(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(2)})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "typo"}
	seen := map[string]int{}
	for range 90 {
		p, err := b.Pick(req)
		require.NoError(t, err, "a model no endpoint serves is still picked")
		seen[p.ID()]++
		p.Done(inferlb.Outcome{NotServedModel: "typo"})
		clock.Advance(time.Millisecond)
	}
	assert.Len(t, seen, 3, "spread over all: %v", seen)
	for _, s := range b.Stats() {
		assert.False(t, s.BreakerOpen)
		assert.Zero(t, s.Failures)
	}
}

// TestNotServedMemoryIsBounded: model names are request data; however many
// an endpoint is reported not to serve, the memory stays its fixed size
// (lackPairs pairs, lackModels models) and keeps the latest: of a thousand
// made-up names, the last ones are remembered, the first ones forgotten.
func TestNotServedMemoryIsBounded(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(4), AffinitySeed: 1})
	lacking := endpoints(2)[1].Addr
	model := func(i int) string { return fmt.Sprintf("model-%d", i) }
	const n = 1000
	for i := range n {
		reportNotServed(t, b, lacking, model(i))
		clock.Advance(time.Millisecond)
	}
	for i := n - 8; i < n; i++ {
		assert.False(t, reaches(t, b, lacking, model(i)), "model %d is among the latest", i)
	}
	forgotten := 0
	for i := range 100 {
		if reaches(t, b, lacking, model(i)) {
			forgotten++
		}
	}
	assert.GreaterOrEqual(t, forgotten, 90, "the first 100 of %d made room", n)
}

func TestNotServedMemoryValidation(t *testing.T) {
	err := (&balancer.Options{NotServedMemory: 25 * time.Hour}).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NotServedMemory")
	require.NoError(t, (&balancer.Options{NotServedMemory: -1}).Validate())
}

// TestNotServedProbeSlotComesBack: a not-served answer to a
// half-open probe gives the probe slot back (it says nothing about
// health, as a cancellation does), so the endpoint is not stuck waiting
// for probes that never report.
func TestNotServedProbeSlotComesBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), PanicThreshold: -1, BreakerProbes: 1, OutlierInterval: -1})
	for range 5 {
		p, err := b.Pick(&inferlb.Request{Model: "m"})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.True(t, b.Stats()[0].BreakerOpen)
	clock.Advance(time.Minute)
	// The probe, answered "not served".
	p, err := b.Pick(&inferlb.Request{Model: "other"})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{NotServedModel: "other"})
	p, err = b.Pick(&inferlb.Request{Model: "m"})
	require.NoError(t, err, "the probe slot came back")
	p.Done(inferlb.Outcome{Latency: time.Millisecond})
	assert.False(t, b.Stats()[0].BreakerOpen, "the next probe closed the breaker")
}

// TestRetryNeverGoesWhereTheModelIsNotServed: a retry (PickRetry) is never
// sent to an endpoint remembered not to serve the call's model: it would
// only fetch that answer again, on the retry budget. When every other
// endpoint is remembered so, the retry has nowhere to go and spends
// nothing; a first pick still goes ahead (the memory may be stale).
func TestRetryNeverGoesWhereTheModelIsNotServed(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(8)})
	eps := endpoints(3)
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "typo"}
	for {
		p, err := b.Pick(req)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{NotServedModel: "typo"})
		done := 0
		for _, s := range b.Stats() {
			if s.NotServed > 0 {
				done++
			}
		}
		if done == 2 {
			break
		}
		clock.Advance(time.Millisecond)
	}
	var fresh string // the one endpoint not yet remembered
	for _, s := range b.Stats() {
		if s.NotServed == 0 {
			fresh = s.ID
		}
	}
	require.NotEmpty(t, fresh)
	var other string
	for _, e := range eps {
		if e.Addr != fresh {
			other = e.Addr
		}
	}
	p, err := b.PickRetry(req, other)
	require.NoError(t, err, "the endpoint not remembered takes the retry")
	assert.Equal(t, fresh, p.ID())
	p.Done(inferlb.Outcome{NotServedModel: "typo"})

	before := b.RetryStats()
	_, err = b.PickRetry(req, fresh)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints, "every other endpoint is remembered without the model")
	assert.Equal(t, before, b.RetryStats(), "nothing spent")
	p, err = b.Pick(req)
	require.NoError(t, err, "a first pick goes ahead")
	p.Done(inferlb.Outcome{})
	p, err = b.PickRetry(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "served"}, fresh)
	require.NoError(t, err, "another model's retries are not affected")
	p.Done(inferlb.Outcome{})
}

// TestNotServedMemoryDoesNotRevive: an entry that lapsed long ago stays
// lapsed, however long the process runs (times in the entries must not
// wrap: a 32-bit time of 16.8 ms units read an entry 500 days old as live
// again once any new entry made the memory worth consulting).
func TestNotServedMemoryDoesNotRevive(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(12)})
	lacking := endpoints(2)[1].Addr
	reportNotServed(t, b, lacking, "old")
	clock.Advance(500 * 24 * time.Hour)
	reportNotServed(t, b, lacking, "new")
	assert.True(t, reaches(t, b, lacking, "old"), "the entry of 500 days ago lapsed for good")
}

// TestKeysOfAModelFewServeStayHome: an affinity key whose ring owner is
// remembered not to serve the call's model has, as its owner, the first
// endpoint in its order that has the model, as any key has: at no load,
// no such call is a spill. Counted as spills past the missing owner, these
// keys moved between the model's replicas by load, each move a cold
// prefill of the conversation (the fleet simulator's lora scenario: 167
// of 3,855 later adapter turns moved, against 7 with labels).
func TestKeysOfAModelFewServeStayHome(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(13), MinKeyReuse: -1})
	eps := endpoints(4)
	serves := map[string]bool{eps[2].Addr: true, eps[3].Addr: true}
	// Learn which endpoints lack the adapter.
	for n := 0; n < 2; {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "adapter"})
		require.NoError(t, err)
		if serves[p.ID()] {
			p.Done(inferlb.Outcome{})
			continue
		}
		p.Done(inferlb.Outcome{NotServedModel: "adapter"})
		n++
	}
	home := map[uint64]string{}
	for round := range 3 {
		for k := uint64(1); k <= 100; k++ {
			key := k * 0x9e3779b97f4a7c15
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "adapter", AffinityKey: key})
			require.NoError(t, err)
			require.True(t, serves[p.ID()], "never where the adapter is missing")
			if round == 0 {
				home[key] = p.ID()
			} else {
				assert.Equal(t, home[key], p.ID(), "key %d stays with its owner", k)
			}
			p.Done(inferlb.Outcome{})
			clock.Advance(time.Millisecond)
		}
	}
	for _, s := range b.Stats() {
		assert.Zero(t, s.WarmSpills+s.ColdSpills, "%s: no call is a spill at no load", s.ID)
	}
}

// TestNotServedMemoryHoldsAManyAdapterFleet: 8 endpoints and 32 adapters,
// each loaded on 2 of them: once each endpoint has answered once for each
// adapter it lacks (192 pairs), no adapter call goes where it is not
// served. Four slots per endpoint, the memory's first layout, held 4 of the
// 24 adapters each endpoint lacks, and the rest kept coming back.
//
// The memory's sets are chosen by hashes of AffinitySeed. With one set per
// entry, the seeds below after 1 (13 of 1,000) put 5 of the 32 models in one
// 4-way set of the models' table, or 5 of the 192 pairs in one set of the
// pairs', and an adapter's memory thrashed (more than 192 pairs met, and
// calls missed after learning); with two sets per entry none of 1,000 does.
func TestNotServedMemoryHoldsAManyAdapterFleet(t *testing.T) {
	for _, seed := range []uint64{1, 14, 32, 84, 144, 246, 401, 406, 546, 637, 643, 799, 907, 949} {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) { holdsManyAdapterFleet(t, seed) })
	}
}

func holdsManyAdapterFleet(t *testing.T, seed uint64) {
	clock := testutil.NewClock()
	const n, adapters = 8, 32
	b := newBalancer(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(14), AffinitySeed: seed})
	eps := endpoints(n)
	serves := func(j int, id string) bool { return id == eps[j%n].Addr || id == eps[(j+4)%n].Addr }
	call := func(j int) (missed bool) {
		model := fmt.Sprintf("adapter-%d", j)
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
		require.NoError(t, err)
		if !serves(j, p.ID()) {
			p.Done(inferlb.Outcome{NotServedModel: model})
			return true
		}
		p.Done(inferlb.Outcome{})
		return false
	}
	learned := 0
	for range 40 { // rounds of one call per adapter, until nothing is missed
		for j := range adapters {
			if call(j) {
				learned++
			}
		}
		clock.Advance(100 * time.Millisecond)
	}
	assert.Equal(t, adapters*(n-2), learned, "each missing pair met once")
	missed := 0
	for range 10 {
		for j := range adapters {
			if call(j) {
				missed++
			}
		}
	}
	assert.Zero(t, missed, "of 320 adapter calls after learning")
}

// TestNotServedMemoryUnderConcurrency: picks and not-served reports from
// many goroutines at once (run under -race in CI): the memory's table is
// made once, entries are written with compare-and-swap, and afterwards no
// call of a model goes to an endpoint announced without it (EventNotServed).
func TestNotServedMemoryUnderConcurrency(t *testing.T) {
	const n, workers, adapters = 8, 8, 16
	var mu sync.Mutex
	announced := map[[2]string]int{}
	b := newBalancer(t, n, balancer.Options{Rand: testutil.NewRand(15), NotServedMemory: balancer.MaxNotServedMemory,
		OnEvent: func(e balancer.Event) {
			if e.Kind == balancer.EventNotServed {
				mu.Lock()
				announced[[2]string{e.Endpoint, e.Model}]++
				mu.Unlock()
			}
		}})
	eps := endpoints(n)
	serves := func(j int, id string) bool { return id == eps[j%n].Addr || id == eps[(j+1)%n].Addr }
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			for i := range 400 {
				j := (w*31 + i) % adapters
				model := fmt.Sprintf("adapter-%d", j)
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, AffinityKey: uint64(i%7 + 1)})
				if err != nil {
					return err
				}
				if serves(j, p.ID()) {
					p.Done(inferlb.Outcome{})
				} else {
					p.Done(inferlb.Outcome{NotServedModel: model})
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	var notServed uint64
	for _, s := range b.Stats() {
		notServed += s.NotServed
		assert.Zero(t, s.InFlight)
	}
	require.NotEmpty(t, announced)
	assert.LessOrEqual(t, notServed, uint64(len(announced)*workers), "each pair met at most once per worker before it was remembered")
	for j := range adapters {
		model := fmt.Sprintf("adapter-%d", j)
		for range 40 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
			require.NoError(t, err)
			assert.Zero(t, announced[[2]string{p.ID(), model}], "%s went to %s, announced without it", model, p.ID())
			p.Done(inferlb.Outcome{})
		}
	}
}

// A failover (Membership.PickFailover, the gRPC policy's) of a call that
// failed on the only endpoint serving its model goes back there, not to
// an endpoint remembered not to serve the model, which would only answer
// so: it used to go ahead to one of them as a first pick would. PickExcept
// then finds none.
func TestFailoverReturnsToTheServerWithTheModel(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(4)})
	m, err := b.NewMembership()
	require.NoError(t, err)
	eps := endpoints(3)
	require.NoError(t, m.Update(eps))
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "adapter"}
	for _, ep := range eps[1:] { // they answer that they lack it
		p, err := m.PickExcept(req, eps[0].Addr)
		require.NoError(t, err)
		for p.ID() != ep.Addr {
			p.Done(inferlb.Outcome{Err: context.Canceled})
			p, err = m.PickExcept(req, eps[0].Addr)
			require.NoError(t, err)
		}
		p.Done(inferlb.Outcome{NotServedModel: "adapter"})
	}
	_, err = m.PickExcept(req, eps[0].Addr)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints, "no other endpoint can serve it")
	for range 20 {
		p, err := m.PickFailover(req, eps[0].Addr)
		require.NoError(t, err)
		assert.Equal(t, eps[0].Addr, p.ID(), "the only endpoint with the model takes the failover")
		p.Done(inferlb.Outcome{})
	}
	p, err := m.PickFailover(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "base"}, eps[0].Addr)
	require.NoError(t, err)
	assert.NotEqual(t, eps[0].Addr, p.ID(), "another model's failover avoids the failed endpoint")
	p.Done(inferlb.Outcome{})
}

// TestNotServedMemorySurvivesAClockStepBack: the memory lapses at a
// deadline on the clock; stepped back an hour, an endpoint remembered
// just before the step not to serve a model was passed over for that hour
// on top of NotServedMemory, though it may have loaded the adapter since.
// Like the core's deadlines set before a step, the entry ends at the
// step. One written after the step is remembered as any, and so is one
// across a step of less than a second (goroutines' readings race).
func TestNotServedMemorySurvivesAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(1), NotServedMemory: 5 * time.Second})
	lacking := endpoints(2)[1].Addr
	reportNotServed(t, b, lacking, "m")
	clock.Advance(-500 * time.Millisecond)
	assert.False(t, reaches(t, b, lacking, "m"), "a step within a second is no step")

	clock.Advance(-time.Hour)
	require.True(t, reaches(t, b, lacking, "m"), "forgotten at the step, not held for an hour and five seconds")

	reportNotServed(t, b, lacking, "m")
	assert.False(t, reaches(t, b, lacking, "m"), "remembered after the step")
	clock.Advance(5100 * time.Millisecond)
	assert.True(t, reaches(t, b, lacking, "m"), "and forgotten after NotServedMemory")
}
