package balancer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// twoModelFleet routes calls over four endpoints that each serve the
// models "x" and "y", alternating between them, one every 10 ms; a served
// call stays in flight for hold picks. fails says whether call i for
// model, sent to endpoint e, fails at once (an answer of the server:
// the outcome carries the model unless noModel). It returns the Balancer,
// the picks made, per endpoint and model, in the last 1,000 calls, and the
// failed calls in them.
type twoModelRun struct {
	b      *balancer.Balancer
	last   [4]map[string]int // calls per endpoint and model in the last 1,000
	failed map[string]int    // failed calls per model in the last 1,000
	events []balancer.Event
	// failedBeforeTrip is how many calls failed on endpoint 0 before its
	// breaker first tripped (-1: it never did).
	failedBeforeTrip int
}

func twoModelFleet(t *testing.T, opts balancer.Options, hold int, noModel bool, fails func(i, e int, model string) bool) *twoModelRun {
	t.Helper()
	return modelFleet(t, []string{"y", "x"}, opts, hold, noModel, false, fails)
}

// modelFleet is twoModelFleet with the models given, in turn. With burst,
// the calls in flight at call 1,000 whose model and endpoint fail from then
// on end at once: one of them well, the others failing, as the calls under
// way do when a model's backend crashes.
func modelFleet(t *testing.T, models []string, opts balancer.Options, hold int, noModel, burst bool, fails func(i, e int, model string) bool) *twoModelRun {
	t.Helper()
	clock := testutil.NewClock()
	run := &twoModelRun{failed: map[string]int{}, failedBeforeTrip: -1}
	for e := range run.last {
		run.last[e] = map[string]int{}
	}
	opts.Clock = clock
	if opts.Rand == nil {
		opts.Rand = testutil.NewRand(3)
	}
	opts.OnEvent = func(ev balancer.Event) { run.events = append(run.events, ev) }
	b := newBalancer(t, 4, opts)
	run.b = b
	idx := map[string]int{}
	for i, e := range endpoints(4) {
		idx[e.Addr] = i
	}
	type held struct {
		p     balancer.Pick
		model string
	}
	var inFlight []held
	failed0 := 0
	const calls = 4000
	for i := range calls {
		if burst && i == 1000 {
			// The crash: of the calls under way that now fail, one ends
			// well just before (the endpoints' latest success is of the
			// failing model), and the others fail together.
			kept, first := inFlight[:0], true
			for _, h := range inFlight {
				e := idx[h.p.ID()]
				switch {
				case !fails(i, e, h.model):
					kept = append(kept, h)
				case first:
					h.p.Done(inferlb.Outcome{Latency: time.Second, Model: h.model})
					first = false
				default:
					o := inferlb.Outcome{Err: errors.New("500 Internal Server Error"), Latency: time.Second, Model: h.model}
					if noModel {
						o.Model = ""
					}
					h.p.Done(o)
					if e == 0 {
						failed0++
					}
				}
			}
			inFlight = kept
		}
		model := models[i%len(models)]
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model, PromptTokens: 100, MaxOutputTokens: 100})
		require.NoError(t, err)
		e := idx[p.ID()]
		if i >= calls-1000 {
			run.last[e][model]++
		}
		if fails(i, e, model) {
			o := inferlb.Outcome{Err: errors.New("500 Internal Server Error"), Latency: 5 * time.Millisecond, Model: model}
			if noModel {
				o.Model = ""
			}
			p.Done(o)
			if i >= calls-1000 {
				run.failed[model]++
			}
			if e == 0 {
				failed0++
			}
		} else {
			inFlight = append(inFlight, held{p, model})
			if len(inFlight) > hold {
				o := inferlb.Outcome{Latency: 2 * time.Second, OutputTokens: 100, Model: inFlight[0].model}

				if noModel {
					o.Model = ""
				}
				inFlight[0].p.Done(o)
				inFlight = inFlight[1:]
			}
		}
		if run.failedBeforeTrip < 0 && b.Stats()[0].Trips > 0 {
			run.failedBeforeTrip = failed0
		}
		clock.Advance(10 * time.Millisecond)
	}
	for _, h := range inFlight {
		h.p.Done(inferlb.Outcome{})
	}
	return run
}

// on returns how many of the last 1,000 calls for model went to endpoint e.
func (r *twoModelRun) on(e int, model string) int { return r.last[e][model] }

// held sums the trips and ejections of the run's endpoints.
func (r *twoModelRun) held() (trips, ejections, modelFailures, failures uint64) {
	for _, s := range r.b.Stats() {
		trips += s.Trips
		ejections += s.Ejections
		modelFailures += s.ModelFailures
		failures += s.Failures
	}
	return
}

// modelEvents returns the durations of the model-failing events for
// endpoint e and model.
func (r *twoModelRun) modelEvents(e int, model string) []time.Duration {
	var d []time.Duration
	for _, ev := range r.events {
		if ev.Kind == balancer.EventModelFailing && ev.Endpoint == endpoints(4)[e].Addr && ev.Model == model {
			d = append(d, ev.Until.Sub(ev.At))
		}
	}
	return d
}

// TestFailingModelKeepsOtherModelsOn: model x breaks on endpoint 0 (a
// Triton model whose backend crashed) while y goes on serving there.
// Counted against the endpoint, x's failures steered y's calls away from
// it too and outlier detection ejected it: a quarter of y's capacity lost
// for x's fault. Held against x there, y keeps using endpoint 0 (more than
// its share: x's calls no longer load it) and x's calls go elsewhere.
func TestFailingModelKeepsOtherModelsOn(t *testing.T) {
	broken := func(i, e int, m string) bool { return i >= 1000 && e == 0 && m == "x" }
	for _, hold := range []int{16, 64} {
		t.Run(fmt.Sprintf("hold=%d", hold), func(t *testing.T) {
			old := twoModelFleet(t, balancer.Options{}, hold, true, broken)
			r := twoModelFleet(t, balancer.Options{}, hold, false, broken)
			t.Logf("y calls of the last 500 on endpoint 0: %d with the model's failures its own, %d counted against the endpoint; x calls failed: %d against %d",
				r.on(0, "y"), old.on(0, "y"), r.failed["x"], old.failed["x"])
			assert.Less(t, old.on(0, "y"), 40, "counted against the endpoint, x's failures keep y away")
			assert.Greater(t, r.on(0, "y"), 125, "y keeps at least its share of endpoint 0")
			assert.LessOrEqual(t, r.failed["x"], 1, "x's calls go where it works")
			assert.Zero(t, r.on(0, "x")-r.failed["x"], "none of x's calls on endpoint 0 succeeded")
			trips, ejections, modelFailures, _ := r.held()
			assert.Zero(t, trips)
			assert.Zero(t, ejections)
			assert.Positive(t, modelFailures)
			_, oldEjections, oldModelFailures, _ := old.held()
			assert.Positive(t, oldEjections, "counted against the endpoint, x's failures eject it")
			assert.Zero(t, oldModelFailures, "without Outcome.Model nothing is held against a model")
			// Held out for EjectionTime, then one probe call that fails:
			// twice that, and so on.
			d := r.modelEvents(0, "x")
			require.GreaterOrEqual(t, len(d), 2, "one event per pass-over")
			assert.Equal(t, balancer.DefaultEjectionTime, d[0])
			assert.Equal(t, 2*balancer.DefaultEjectionTime, d[1])
			assert.Empty(t, r.modelEvents(0, "y"))
			assert.Equal(t, "model-failing", balancer.EventModelFailing.String())
		})
	}
}

// TestModelFailingEverywhere: a bad version of model x rolled out to every
// endpoint. Counted against the endpoints, x's failures tripped half of
// them (MaxEjectedFraction) and crowded y onto the rest; held against x,
// they leave y spread over all four. x's calls fail wherever they go.
func TestModelFailingEverywhere(t *testing.T) {
	broken := func(i, e int, m string) bool { return i >= 1000 && m == "x" }
	old := twoModelFleet(t, balancer.Options{}, 16, true, broken)
	r := twoModelFleet(t, balancer.Options{}, 16, false, broken)
	oldTrips, _, _, _ := old.held()
	trips, ejections, _, _ := r.held()
	t.Logf("y calls of the last 500 per endpoint: %d %d %d %d, against %d %d %d %d counted against the endpoints (%d trips)",
		r.on(0, "y"), r.on(1, "y"), r.on(2, "y"), r.on(3, "y"), old.on(0, "y"), old.on(1, "y"), old.on(2, "y"), old.on(3, "y"), oldTrips)
	assert.Positive(t, oldTrips)
	assert.Zero(t, trips)
	assert.Zero(t, ejections)
	for e := range 4 {
		assert.Greater(t, r.on(e, "y"), 100, "endpoint %d keeps its share of y", e)
	}
	assert.Equal(t, 500, r.failed["x"], "x fails everywhere")
}

// TestServerFailingEverythingStillTrips: an endpoint whose server fails
// every call (an engine that died, answering 500) has no other model to
// show it healthy: its failures count against it and its breaker trips,
// a couple of failures later than when no outcome names its model (calls
// that were under way end well after the first failures and show it
// serving for a moment).
func TestServerFailingEverythingStillTrips(t *testing.T) {
	t.Parallel()
	for _, hold := range []int{16, 64} {
		for at := 1000; at < 1040; at += 7 {
			broken := func(i, e int, m string) bool { return i >= at && e == 0 }
			old := twoModelFleet(t, balancer.Options{}, hold, true, broken)
			r := twoModelFleet(t, balancer.Options{}, hold, false, broken)
			require.Positive(t, r.failedBeforeTrip, "hold %d, from %d: endpoint 0 trips", hold, at)
			assert.LessOrEqual(t, r.failedBeforeTrip, old.failedBeforeTrip+5, "hold %d, from %d: failed calls before the trip", hold, at)
			assert.Zero(t, r.on(0, "x")+r.on(0, "y"), "hold %d, from %d: endpoint 0 is out", hold, at)
		}
	}
}

// TestOneModelServerFailingTripsAsBefore: an endpoint of a fleet that
// serves one model, failing every call, has no other model to show it
// healthy: naming the model in the outcomes changes nothing, the breaker
// trips after the same failures.
func TestOneModelServerFailingTripsAsBefore(t *testing.T) {
	t.Parallel()
	for _, hold := range []int{16, 64} {
		for at := 1000; at < 1040; at += 7 {
			broken := func(i, e int, m string) bool { return i >= at && e == 0 }
			old := modelFleet(t, []string{"m"}, balancer.Options{}, hold, true, false, broken)
			r := modelFleet(t, []string{"m"}, balancer.Options{}, hold, false, false, broken)
			require.Positive(t, r.failedBeforeTrip, "hold %d, from %d: endpoint 0 trips", hold, at)
			assert.Equal(t, old.failedBeforeTrip, r.failedBeforeTrip, "hold %d, from %d: failed calls before the trip", hold, at)
			_, _, modelFailures, _ := r.held()
			assert.Zero(t, modelFailures)
		}
	}
}

// TestModelBreakingMidCall: when a model's backend crashes, its calls
// under way on the server fail too, all at once, and the server's latest
// success may well be that model's own. Those failures are the model's as
// well (the server's other model succeeded of late and fails nothing): the
// server does not trip, with the model broken on one endpoint or on all.
// A server failing every call, its calls under way too, still trips.
func TestModelBreakingMidCall(t *testing.T) {
	t.Parallel()
	for _, hold := range []int{16, 64} {
		for _, everywhere := range []bool{false, true} {
			broken := func(i, e int, m string) bool { return i >= 1000 && m == "x" && (everywhere || e == 0) }
			old := modelFleet(t, []string{"y", "x"}, balancer.Options{}, hold, true, true, broken)
			r := modelFleet(t, []string{"y", "x"}, balancer.Options{}, hold, false, true, broken)
			trips, ejections, modelFailures, _ := r.held()
			oldTrips, oldEjections, _, _ := old.held()
			t.Logf("hold %d, everywhere %v: trips %d, ejections %d, %d held against x; counted against the endpoints: %d, %d; y on endpoint 0: %d against %d",
				hold, everywhere, trips, ejections, modelFailures, oldTrips, oldEjections, r.on(0, "y"), old.on(0, "y"))
			assert.Positive(t, oldTrips+oldEjections, "hold %d, everywhere %v: counted against the endpoints, the burst holds some out", hold, everywhere)
			assert.Zero(t, trips, "hold %d, everywhere %v", hold, everywhere)
			assert.Zero(t, ejections, "hold %d, everywhere %v", hold, everywhere)
			assert.Greater(t, r.on(0, "y"), 100, "hold %d, everywhere %v: y keeps endpoint 0", hold, everywhere)
		}
		crash := func(i, e int, m string) bool { return i >= 1000 && e == 0 }
		r := modelFleet(t, []string{"y", "x"}, balancer.Options{}, hold, false, true, crash)
		trips, _, _, _ := r.held()
		assert.Positive(t, trips, "hold %d: a server failing everything trips", hold)
		assert.Zero(t, r.on(0, "x")+r.on(0, "y"), "hold %d: and is out", hold)
	}
}

// TestServerCrashTripsWhicheverModelFailsFirst: a server serving x and y
// stops serving anything. x's calls fail first, while y's latest success
// is recent: those are taken for x's alone. But then y's fail too, after
// x's latest success, so y's failures count against the server and it
// trips (the breaker counts x's first two and y's).
func TestServerCrashTripsWhicheverModelFailsFirst(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, OutlierInterval: -1})
	call := func(model string, fail bool) {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
		require.NoError(t, err)
		o := inferlb.Outcome{Model: model}
		if fail {
			o.Err = errors.New("500")
		}
		p.Done(o)
		clock.Advance(time.Millisecond)
	}
	call("y", false)
	call("x", false)
	for range 5 {
		call("x", true)
	}
	s := b.Stats()[0]
	require.Equal(t, uint64(3), s.ModelFailures, "x's third to fifth failures are taken for x's")
	require.Zero(t, s.Trips)
	for range 3 {
		call("y", true)
	}
	s = b.Stats()[0]
	assert.Equal(t, uint64(1), s.Trips, "y's failures, after x's, are the server's")
	assert.Equal(t, uint64(5), s.Failures)
}

// TestFlakyServerKeepsItsFailures: a server that fails 30% of all calls,
// whatever their model, keeps its failures on its own error rate, so it
// gets no more calls than when outcomes name no model: its runs of
// failures of one model seldom pass the two that always count. The calls
// are summed over several picker seeds: the flaky endpoint's share of one
// run's last 1,000 swings by half with the picks' random stream.
func TestFlakyServerKeepsItsFailures(t *testing.T) {
	t.Parallel()
	var calls, oldCalls int
	var modelFailures, failures uint64
	for seed := uint64(1); seed <= 8; seed++ {
		for _, hold := range []int{16, 64} {
			for _, noModel := range []bool{false, true} {
				rng := rand.New(rand.NewPCG(seed, 2))
				opts := balancer.Options{Rand: testutil.NewRand(3 + seed%4)}
				r := twoModelFleet(t, opts, hold, noModel, func(i, e int, m string) bool { return e == 0 && rng.Float64() < 0.3 })
				n := r.on(0, "x") + r.on(0, "y")
				if noModel {
					oldCalls += n
					continue
				}
				calls += n
				_, _, mf, f := r.held()
				modelFailures, failures = modelFailures+mf, failures+f
			}
		}
	}
	t.Logf("calls to the flaky endpoint in 16 runs' last 1,000: %d, against %d with no model named; %d of %d failures held against a model", calls, oldCalls, modelFailures, modelFailures+failures)
	assert.LessOrEqual(t, calls, oldCalls+oldCalls/5+10)
	assert.Less(t, float64(modelFailures), 0.12*float64(modelFailures+failures))
}

// TestModelFailingEndsWithASuccess: x is mended on endpoint 0 while its
// calls pass it over; the probe call after the pass-over succeeds, which
// ends the run, and x's calls use endpoint 0 again.
func TestModelFailingEndsWithASuccess(t *testing.T) {
	r := twoModelFleet(t, balancer.Options{}, 16, false, func(i, e int, m string) bool { return i >= 1000 && i < 1500 && e == 0 && m == "x" })
	assert.Len(t, r.modelEvents(0, "x"), 1)
	assert.Greater(t, r.on(0, "x"), 100, "x is back on endpoint 0")
	assert.Zero(t, r.failed["x"])
}

// TestModelFailuresNeedTheBreaker: with the breaker off, nothing would
// pass an endpoint over for a model, so every failure counts against the
// endpoint (its error rate steers calls away), as before.
func TestModelFailuresNeedTheBreaker(t *testing.T) {
	r := twoModelFleet(t, balancer.Options{BreakerFailures: -1}, 16, false, func(i, e int, m string) bool { return i >= 1000 && e == 0 && m == "x" })
	_, _, modelFailures, failures := r.held()
	assert.Zero(t, modelFailures)
	assert.Positive(t, failures)
	assert.Empty(t, r.modelEvents(0, "x"))
}

// TestModelFailureRunsAreBounded: model names are request data. Once the
// table of runs exists, failures of ever new names allocate nothing (the
// table is fixed, its entries replaced), and a model that goes on failing
// is still passed over after the flood.
func TestModelFailureRunsAreBounded(t *testing.T) {
	clock := testutil.NewClock()
	failing := map[string]bool{}
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1, OnEvent: func(ev balancer.Event) {
		if ev.Kind == balancer.EventModelFailing && ev.Model == "x" {
			failing[ev.Endpoint] = true
		}
	}})
	errAnswer := errors.New("500")
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	call := func(model string, fail bool) string {
		req.Model = model
		p, err := b.Pick(req)
		require.NoError(t, err)
		o := inferlb.Outcome{Model: model, Latency: time.Millisecond}
		if fail {
			o.Err = errAnswer
		}
		p.Done(o)
		clock.Advance(time.Millisecond)
		return p.ID()
	}
	names := make([]string, 20000)
	for i := range names {
		names[i] = fmt.Sprintf("made-up-%d", i)
	}
	call("y", false)
	call(names[0], true) // allocates the table
	i := 1
	allocs := testing.AllocsPerRun(5000, func() {
		call(names[i], true)
		call("y", false)
		i++
	})
	assert.Zero(t, allocs, "failures of new model names allocate nothing")
	// x fails on whichever endpoint it meets while y succeeds on both: it
	// ends up passed over on both, and picked anyway.
	for range 20 {
		call("x", true)
		call("y", false)
	}
	assert.Len(t, failing, 2, "x is passed over on both endpoints, its runs kept through the flood")
}

// TestModelFailuresUnderConcurrency runs picks and outcomes of several
// models from many goroutines (run with -race).
func TestModelFailuresUnderConcurrency(t *testing.T) {
	b := newBalancer(t, 4, balancer.Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				model := fmt.Sprintf("m%d", (g+i)%5)
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
				if err != nil {
					continue
				}
				o := inferlb.Outcome{Model: model}
				if model == "m0" || i%7 == 0 {
					o.Err = errors.New("500")
				}
				p.Done(o)
			}
		})
	}
	wg.Wait()
	var picks, ended uint64
	for _, s := range b.Stats() {
		picks += s.Picks
		ended += s.Successes + s.Failures + s.ModelFailures
	}
	assert.Equal(t, picks, ended, "every call ended as a success, a failure or a model's failure")
	assert.Equal(t, uint64(16000), picks)
}
