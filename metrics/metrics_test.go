package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	tu "github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

func TestCollectorExportsLiveState(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	held, err := b.Pick(&inferlb.Request{PromptTokens: 100, MaxOutputTokens: 20})
	require.NoError(t, err)
	p, _ := b.Pick(&inferlb.Request{})
	p.Done(inferlb.Outcome{Err: errors.New("boom")})
	p, _ = b.Pick(&inferlb.Request{Model: "adapter"})
	p.Done(inferlb.Outcome{NotServedModel: "adapter"})
	p, _ = b.Pick(&inferlb.Request{Model: "y", PromptTokens: 9000})
	p.Done(inferlb.Outcome{ContextWindow: 8192, Model: "y"})
	clock.Advance(time.Second) // y's success comes after the failure above
	p, _ = b.Pick(&inferlb.Request{Model: "y"})
	p.Done(inferlb.Outcome{Latency: 250 * time.Millisecond, TTFT: 50 * time.Millisecond, OutputTokens: 5, Model: "y"})
	p, _ = b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
	p.Done(inferlb.Outcome{Latency: 20 * time.Millisecond})
	// Model x fails three times in a row after the endpoint served y: the
	// first two count against the endpoint, the third against x.
	for range 3 {
		p, _ = b.Pick(&inferlb.Request{Model: "x"})
		p.Done(inferlb.Outcome{Err: errors.New("500"), Model: "x"})
	}
	b.Publish("a:1", telemetry.Sample{}) // malformed: counted, not kept
	stray := telemetry.Sample{Time: clock.Now()}
	stray.Set(telemetry.KVCacheUsage, 0.5)
	b.Publish("gone:1", stray) // not an endpoint of b: counted, not kept

	c := metrics.NewCollector(b, "llm")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_endpoint_in_flight Calls picked for the endpoint and not yet done.
# TYPE inferlb_endpoint_in_flight gauge
inferlb_endpoint_in_flight{balancer="llm",endpoint="a:1"} 1
# HELP inferlb_endpoint_in_flight_tokens Estimated tokens (prompt + max output) of in-flight calls.
# TYPE inferlb_endpoint_in_flight_tokens gauge
inferlb_endpoint_in_flight_tokens{balancer="llm",endpoint="a:1"} 120
# HELP inferlb_endpoint_failures_total Calls that failed, held against the endpoint (overloads, cancellations, not-served and too-long answers and model failures are not counted here).
# TYPE inferlb_endpoint_failures_total counter
inferlb_endpoint_failures_total{balancer="llm",endpoint="a:1"} 3
# HELP inferlb_endpoint_model_failures_total Calls that failed for their model alone: the server failed one model's calls while it served others (a crashed Triton model backend, a broken LoRA adapter); held against that model there, not the endpoint, and not in endpoint_failures_total.
# TYPE inferlb_endpoint_model_failures_total counter
inferlb_endpoint_model_failures_total{balancer="llm",endpoint="a:1"} 1
# HELP inferlb_endpoint_not_served_total Calls the endpoint answered it does not serve the model of (vLLM's 404 for an absent LoRA adapter, Ollama's model not found, Triton's unknown model); that model's calls pass it over for a while.
# TYPE inferlb_endpoint_not_served_total counter
inferlb_endpoint_not_served_total{balancer="llm",endpoint="a:1"} 1
# HELP inferlb_endpoint_too_long_total Calls the endpoint refused as longer than its context window for their model (vLLM's or SGLang's 400, TGI's 422, TEI's 413 or 422, TensorRT-LLM's, or a gRPC status with that text); longer calls of that model pass it over for a while.
# TYPE inferlb_endpoint_too_long_total counter
inferlb_endpoint_too_long_total{balancer="llm",endpoint="a:1"} 1
# HELP inferlb_endpoint_latency_ewma_seconds Peak-EWMA latency of successful calls, as last observed, by service (llm|embedding|rerank|unknown; each kept apart, as the balancer scores them); a service the endpoint has not answered has no series.
# TYPE inferlb_endpoint_latency_ewma_seconds gauge
inferlb_endpoint_latency_ewma_seconds{balancer="llm",endpoint="a:1",service="embedding"} 0.02
inferlb_endpoint_latency_ewma_seconds{balancer="llm",endpoint="a:1",service="unknown"} 0.25
# HELP inferlb_endpoint_time_per_output_token_seconds EWMA of decode time per output token after the first, from streamed calls; an endpoint no such call (4+ output tokens) has reported one for has no series.
# TYPE inferlb_endpoint_time_per_output_token_seconds gauge
inferlb_endpoint_time_per_output_token_seconds{balancer="llm",endpoint="a:1"} 0.05
`), "inferlb_endpoint_in_flight", "inferlb_endpoint_in_flight_tokens", "inferlb_endpoint_failures_total",
		"inferlb_endpoint_model_failures_total", "inferlb_endpoint_not_served_total", "inferlb_endpoint_too_long_total", "inferlb_endpoint_latency_ewma_seconds", "inferlb_endpoint_time_per_output_token_seconds"))
	held.Done(inferlb.Outcome{})

	sc := metrics.NewStoreCollector(b.Telemetry(), "llm")
	require.NoError(t, testutil.CollectAndCompare(sc, strings.NewReader(`
# HELP inferlb_telemetry_partial_samples_total Samples an adapter published with some fields left out as malformed (an HTTP load header or an ORCA report with a NaN, a negative count, a field that does not parse); their other fields count in inferlb_telemetry_samples_total as usual.
# TYPE inferlb_telemetry_partial_samples_total counter
inferlb_telemetry_partial_samples_total{store="llm"} 0
# HELP inferlb_telemetry_samples_total Telemetry samples offered to the store, by what happened to them.
# TYPE inferlb_telemetry_samples_total counter
inferlb_telemetry_samples_total{result="accepted",store="llm"} 0
inferlb_telemetry_samples_total{result="arrived_stale",store="llm"} 0
inferlb_telemetry_samples_total{result="dropped_empty",store="llm"} 1
inferlb_telemetry_samples_total{result="dropped_full",store="llm"} 0
inferlb_telemetry_samples_total{result="dropped_old",store="llm"} 0
inferlb_telemetry_samples_total{result="dropped_unknown",store="llm"} 1
# HELP inferlb_telemetry_store_endpoints Endpoint IDs the store has a slot for: a Balancer's endpoints, read or not yet, and IDs published to the store directly. Past its MaxEndpoints, samples for an ID without a slot are dropped: dropped_full when published to the store directly (a Poller whose Sink is the store), dropped_unknown through a Balancer.
# TYPE inferlb_telemetry_store_endpoints gauge
inferlb_telemetry_store_endpoints{store="llm"} 1
`)))

	// The collector registers cleanly and passes the linter.
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, reg.Register(sc))
	for _, col := range []prometheus.Collector{c, sc} {
		problems, err := testutil.CollectAndLint(col)
		require.NoError(t, err)
		assert.Empty(t, problems)
	}
	assert.Equal(t, 31+2+1, testutil.CollectAndCount(c), "31 series per endpoint (latency for two services), 2 retry, 1 affinity (no reuse estimate yet)")
}

// An endpoint ID that is not valid UTF-8 must not fail the whole scrape
// (the registry rejects such label values).
func TestCollectorSurvivesANonUTF8EndpointID(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:80"}, {ID: "pod-\xff", Addr: "10.0.0.2:80"}}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	assert.NotEmpty(t, mfs)
}

func TestCollectorExportsKeyReuse(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}, {Addr: "b:1"}}))
	c := metrics.NewCollector(b, "llm")
	// Keys with their top 3 bits zero are the sampled ones; each is new.
	for i := range uint64(2000) {
		p, err := b.Pick(&inferlb.Request{AffinityKey: i*0x9e3779b97f4a7c15>>3 | 1})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_affinity_following_keys 1 while affinity keys steer picks; 0 with affinity off or while keys do not recur (MinKeyReuse).
# TYPE inferlb_affinity_following_keys gauge
inferlb_affinity_following_keys{balancer="llm"} 0
# HELP inferlb_affinity_key_reuse_ratio Estimated share of keyed requests whose affinity key recurs (absent while no estimate is kept).
# TYPE inferlb_affinity_key_reuse_ratio gauge
inferlb_affinity_key_reuse_ratio{balancer="llm"} 0
`), "inferlb_affinity_following_keys", "inferlb_affinity_key_reuse_ratio"))
}

// Two endpoint IDs that differ only in their invalid UTF-8 bytes are two
// endpoints: made valid the same way, they would be one series collected
// twice, and the registry would fail the whole scrape.
func TestCollectorKeepsNonUTF8EndpointIDsApart(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{
		{ID: "pod-\xff", Addr: "10.0.0.1:80"},
		{ID: "pod-\xfe", Addr: "10.0.0.2:80"},
		{ID: `pod-\xff`, Addr: "10.0.0.3:80"}, // valid, and spelled like an escape
	}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "inferlb_endpoint_picks_total" {
			var ids []string
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" {
						ids = append(ids, l.GetValue())
					}
				}
			}
			// The escaped pod-\xff meets the valid ID spelled so and is
			// left out: one series lost, not the scrape.
			assert.ElementsMatch(t, []string{`pod-\xff`, `pod-\xfe`}, ids)
		}
	}
}

// Endpoint IDs change on every deploy and autoscaling event: a departed
// endpoint's series must leave the scrape with it, or label cardinality
// grows with every pod the service has ever routed to.
func TestCollectorExportsOnlyCurrentEndpoints(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: tu.NewClock()})
	c := metrics.NewCollector(b, "llm")
	update := func(r int) {
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: fmt.Sprintf("pod-%d-a:8000", r)}, {Addr: fmt.Sprintf("pod-%d-b:8000", r)}}))
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	update(0)
	want := testutil.CollectAndCount(c)
	for r := 1; r <= 1000; r++ {
		update(r)
		if r%100 == 0 { // a scrape now and then
			require.Equal(t, want, testutil.CollectAndCount(c), "after %d rollouts", r)
		}
	}
}

// TestCollectorExportsTheTelemetryRoutedOn: the readings the scorers see of
// each endpoint (fresh fields only) and their age, so an endpoint the
// balancer avoids can be explained from a dashboard; a stale field is not
// exported, as it is not routed on.
func TestCollectorExportsTheTelemetryRoutedOn(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}, {Addr: "b:1"}}))
	old := telemetry.Sample{Time: clock.Now()}
	old.Set(telemetry.GPUUtil, 0.9)
	b.Publish("a:1", old)
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	s := telemetry.Sample{Time: clock.Now().Add(-2 * time.Second)}
	s.Set(telemetry.KVCacheUsage, 0.97)
	s.Set(telemetry.Waiting, 12)
	b.Publish("a:1", s)

	c := metrics.NewCollector(b, "llm")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_endpoint_telemetry The endpoint's telemetry as the balancer routes on it (fresh fields only), by field, each in its own unit: gpu_mem_used_bytes and gpu_mem_total_bytes in bytes, gpu_temp_c in degrees Celsius, gpu_power_w in watts; running, waiting and lora_slots are counts; kv_cache_preallocated and asleep are 0 or 1; gpu_util, kv_cache_usage and prefix_cache_hit_rate are ratios from 0 to 1, cpu_util and app_util too but above 1 when the server is overcommitted (ORCA). Select one field before aggregating.
# TYPE inferlb_endpoint_telemetry gauge
inferlb_endpoint_telemetry{balancer="llm",endpoint="a:1",field="kv_cache_usage"} 0.97
inferlb_endpoint_telemetry{balancer="llm",endpoint="a:1",field="waiting"} 12
# HELP inferlb_endpoint_telemetry_age_seconds Age of the oldest fresh telemetry field the balancer routes on. Fields go stale at the balancer's TelemetryMaxAge (unless it is negative), so this stays below it, and an endpoint with no fresh field (none reported, all stale or expired) has no series: alert on the series missing, not on its value.
# TYPE inferlb_endpoint_telemetry_age_seconds gauge
inferlb_endpoint_telemetry_age_seconds{balancer="llm",endpoint="a:1"} 2
`), "inferlb_endpoint_telemetry", "inferlb_endpoint_telemetry_age_seconds"))

	// Once every field is stale the age has no series at all, rather than
	// a value past TelemetryMaxAge: "age > 30" never fires for an endpoint
	// whose telemetry stopped, which the HELP has to say.
	clock.Advance(balancer.DefaultTelemetryMaxAge)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(""), "inferlb_endpoint_telemetry", "inferlb_endpoint_telemetry_age_seconds"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestCollectorExportsWhyAnEndpointIsOut: an endpoint that gets no traffic
// is explained on a dashboard: how long its exclusion lasts from now, and
// whether a breaker, an outlier ejection or (neither) an overload cooldown
// holds it out; and the capacity weight each endpoint was given.
func TestCollectorExportsWhyAnEndpointIsOut(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: tu.NewRand(1), OutlierMinRequests: 4})
	require.NoError(t, b.Update([]inferlb.Endpoint{
		{Addr: "a:1", Weight: 2}, {Addr: "b:1"}, {Addr: "c:1"}, {Addr: "d:1"}, {Addr: "e:1"},
	}))
	call := func(id string, o inferlb.Outcome) {
		t.Helper()
		serial, ok := b.Serial(id)
		require.True(t, ok, id)
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		require.Equal(t, id, p.ID())
		p.Done(o)
	}
	down := inferlb.Outcome{Err: errors.New("500")}
	// One outlier interval: d fails half its calls, its peers none.
	for _, id := range []string{"a:1", "b:1", "d:1", "e:1"} {
		for i := range 4 {
			o := inferlb.Outcome{}
			if id == "d:1" && i%2 == 1 {
				o = down
			}
			call(id, o)
		}
	}
	clock.Advance(balancer.DefaultOutlierInterval)
	call("a:1", inferlb.Outcome{}) // the interval is judged: d is ejected for EjectionTime
	for range balancer.DefaultBreakerFailures {
		call("c:1", down) // c's breaker trips for EjectionTime
	}
	call("b:1", inferlb.Outcome{Overloaded: true, RetryAfter: 7 * time.Second}) // b cools down
	clock.Advance(2 * time.Second)

	c := metrics.NewCollector(b, "llm")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_endpoint_breaker_open 1 while the circuit breaker holds the endpoint out or probes it.
# TYPE inferlb_endpoint_breaker_open gauge
inferlb_endpoint_breaker_open{balancer="llm",endpoint="a:1"} 0
inferlb_endpoint_breaker_open{balancer="llm",endpoint="b:1"} 0
inferlb_endpoint_breaker_open{balancer="llm",endpoint="c:1"} 1
inferlb_endpoint_breaker_open{balancer="llm",endpoint="d:1"} 0
inferlb_endpoint_breaker_open{balancer="llm",endpoint="e:1"} 0
# HELP inferlb_endpoint_exclusion_remaining_seconds Seconds from now until the endpoint's exclusion from rotation ends, 0 with none: a circuit-breaker trip or failed probe, an outlier ejection or an overload cooldown (Retry-After), whichever ends last. An exclusion while endpoint_breaker_open and endpoint_outlier_ejected are 0 is an overload cooldown. Past its exclusion an open breaker takes only its half-open probes (endpoint_breaker_open stays 1).
# TYPE inferlb_endpoint_exclusion_remaining_seconds gauge
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="a:1"} 0
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="b:1"} 5
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="c:1"} 8
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="d:1"} 8
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="e:1"} 0
# HELP inferlb_endpoint_outlier_ejected 1 while an outlier ejection holds the endpoint out (endpoint_exclusion_remaining_seconds lasts at least as long).
# TYPE inferlb_endpoint_outlier_ejected gauge
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="a:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="b:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="c:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="d:1"} 1
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="e:1"} 0
# HELP inferlb_endpoint_weight Capacity weight of the endpoint as last described to the balancer (Endpoint.Weight: 0 or an invalid weight read as 1, one above balancer.MaxWeight as MaxWeight), before slow start scales it (endpoint_slow_start_factor).
# TYPE inferlb_endpoint_weight gauge
inferlb_endpoint_weight{balancer="llm",endpoint="a:1"} 2
inferlb_endpoint_weight{balancer="llm",endpoint="b:1"} 1
inferlb_endpoint_weight{balancer="llm",endpoint="c:1"} 1
inferlb_endpoint_weight{balancer="llm",endpoint="d:1"} 1
inferlb_endpoint_weight{balancer="llm",endpoint="e:1"} 1
`), "inferlb_endpoint_breaker_open", "inferlb_endpoint_exclusion_remaining_seconds", "inferlb_endpoint_outlier_ejected", "inferlb_endpoint_weight"))

	// Once the exclusions end, every endpoint reads 0 again (c's breaker
	// is half-open: open, not excluded).
	clock.Advance(10 * time.Second)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_endpoint_exclusion_remaining_seconds Seconds from now until the endpoint's exclusion from rotation ends, 0 with none: a circuit-breaker trip or failed probe, an outlier ejection or an overload cooldown (Retry-After), whichever ends last. An exclusion while endpoint_breaker_open and endpoint_outlier_ejected are 0 is an overload cooldown. Past its exclusion an open breaker takes only its half-open probes (endpoint_breaker_open stays 1).
# TYPE inferlb_endpoint_exclusion_remaining_seconds gauge
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="a:1"} 0
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="b:1"} 0
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="c:1"} 0
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="d:1"} 0
inferlb_endpoint_exclusion_remaining_seconds{balancer="llm",endpoint="e:1"} 0
# HELP inferlb_endpoint_outlier_ejected 1 while an outlier ejection holds the endpoint out (endpoint_exclusion_remaining_seconds lasts at least as long).
# TYPE inferlb_endpoint_outlier_ejected gauge
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="a:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="b:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="c:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="d:1"} 0
inferlb_endpoint_outlier_ejected{balancer="llm",endpoint="e:1"} 0
`), "inferlb_endpoint_exclusion_remaining_seconds", "inferlb_endpoint_outlier_ejected"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestCollectorOutcomesAddUpToPicks: every call picked is in flight or
// ended one way, and each way has its counter, so a dashboard can tell
// what became of an endpoint's calls. Canceled calls had none: picks_total
// ran ahead of the outcomes by the cancellations, which read as calls
// lost.
func TestCollectorOutcomesAddUpToPicks(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: tu.NewClock()})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	for _, o := range []inferlb.Outcome{
		{},
		{Err: context.Canceled},
		{Err: fmt.Errorf("stream: %w", context.Canceled), Unanswered: true},
		{Err: errors.New("500")},
		{Overloaded: true},
		{ClientError: true},
	} {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(o)
	}
	held, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	defer held.Done(inferlb.Outcome{})

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	v := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	assert.Equal(t, 2.0, v["inferlb_endpoint_canceled_total"])
	assert.Equal(t, 1.0, v["inferlb_endpoint_unanswered_total"], "of the canceled")
	outcomes := v["inferlb_endpoint_in_flight"]
	assert.Equal(t, 1.0, v["inferlb_endpoint_client_errors_total"])
	assert.InDelta(t, 0.1, v["inferlb_endpoint_client_error_ratio"], 1e-9)
	for _, n := range []string{"successes", "failures", "overloads", "not_served", "too_long", "model_failures", "canceled", "client_errors"} {
		outcomes += v["inferlb_endpoint_"+n+"_total"]
	}
	assert.Equal(t, v["inferlb_endpoint_picks_total"], outcomes, "picks = in flight + every outcome")
}

// TestCollectorLeavesOutUnmeasuredStreamTimes: an endpoint no streamed call
// has reported a first token for has no TTFT, and no decode speed: 0 there
// means none measured, and exported as 0 s it read as the fastest endpoint
// of the fleet (an embedding server's TTFT of 0 pulled avg() by (balancer)
// down to half the chat servers').
func TestCollectorLeavesOutUnmeasuredStreamTimes(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: tu.NewClock()})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "chat:1"}, {Addr: "embed:1"}}))
	call := func(id string, o inferlb.Outcome) {
		t.Helper()
		serial, ok := b.Serial(id)
		require.True(t, ok, id)
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		p.Done(o)
	}
	call("chat:1", inferlb.Outcome{Latency: 2 * time.Second, TTFT: 400 * time.Millisecond, OutputTokens: 17})
	call("embed:1", inferlb.Outcome{Latency: 20 * time.Millisecond})

	c := metrics.NewCollector(b, "llm")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_endpoint_time_per_output_token_seconds EWMA of decode time per output token after the first, from streamed calls; an endpoint no such call (4+ output tokens) has reported one for has no series.
# TYPE inferlb_endpoint_time_per_output_token_seconds gauge
inferlb_endpoint_time_per_output_token_seconds{balancer="llm",endpoint="chat:1"} 0.1
# HELP inferlb_endpoint_ttft_ewma_seconds EWMA of time to first token of streamed calls; an endpoint no streamed call has reported one for has no series.
# TYPE inferlb_endpoint_ttft_ewma_seconds gauge
inferlb_endpoint_ttft_ewma_seconds{balancer="llm",endpoint="chat:1"} 0.4
`), "inferlb_endpoint_ttft_ewma_seconds", "inferlb_endpoint_time_per_output_token_seconds"))
}

// TestCollectorExportsTheAbandonedRun: generation calls given up on with
// nothing back, each after waiting as long as the endpoint's answers take,
// run up endpoint_abandoned_run (what prices a hung replica up), and the
// endpoint's next answer ends the run.
func TestCollectorExportsTheAbandonedRun(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(b, "llm"))
	run := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "inferlb_endpoint_abandoned_run" {
				require.Len(t, mf.GetMetric(), 1)
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no inferlb_endpoint_abandoned_run")
		return 0
	}
	call := func(wait time.Duration, o inferlb.Outcome) {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		clock.Advance(wait)
		p.Done(o)
	}
	abandoned := inferlb.Outcome{Err: context.Canceled, Unanswered: true}
	call(2*time.Second, inferlb.Outcome{}) // its answers take 2 s
	call(time.Second, abandoned)           // a user's early stop: no run
	assert.Zero(t, run())
	call(3*time.Second, abandoned)
	call(3*time.Second, abandoned)
	assert.Equal(t, 2.0, run())
	require.Len(t, b.Stats(), 1)
	assert.EqualValues(t, 2, b.Stats()[0].Abandoned)
	call(2*time.Second, inferlb.Outcome{})
	assert.Zero(t, run(), "an answer ends the run")
}

// TestCollectorExportsTheRefusedTenants: an endpoint that refused a run of
// one tenant's calls while serving the others' (a replica its key has not
// reached) counts the tenant in endpoint_refused_tenants, with no label
// but the endpoint's (tenants are request data), until ErrorDecay after
// its last refusal there.
func TestCollectorExportsTheRefusedTenants(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}, {Addr: "b:1"}}))
	call := func(id string, o inferlb.Outcome) {
		t.Helper()
		serial, ok := b.Serial(id)
		require.True(t, ok, id)
		p, err := b.PickAt(&inferlb.Request{Tenant: o.Tenant}, serial)
		require.NoError(t, err)
		require.Equal(t, id, p.ID())
		clock.Advance(time.Millisecond)
		p.Done(o)
	}
	c := metrics.NewCollector(b, "embed")
	want := func(a, b int) string {
		return fmt.Sprintf(`
# HELP inferlb_endpoint_refused_tenants Tenants whose calls the balancer passes the endpoint over for now, because it refused a run of their calls (client errors of calls that name their tenant) too long to be their own bad calls: a replica some tenants' API keys have not reached. A tenant counts for ErrorDecay after its last refusal there, or until the endpoint serves one of its calls; a pick still takes the endpoint when passing it over would hold out more than MaxEjectedFraction of the pool or leave no candidate. A count: tenants are request data, never label values.
# TYPE inferlb_endpoint_refused_tenants gauge
inferlb_endpoint_refused_tenants{balancer="embed",endpoint="a:1"} %d
inferlb_endpoint_refused_tenants{balancer="embed",endpoint="b:1"} %d
`, a, b)
	}
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(0, 0)), "inferlb_endpoint_refused_tenants"))
	// a:1 refuses tenant A, b:1 serves it: a run of refusals, with A's
	// other calls served, is no bad calls of A's own.
	for range 20 {
		call("a:1", inferlb.Outcome{ClientError: true, Tenant: "A"})
		for range 3 {
			call("b:1", inferlb.Outcome{Latency: time.Millisecond, Tenant: "A"})
		}
	}
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(1, 0)), "inferlb_endpoint_refused_tenants"))
	clock.Advance(balancer.DefaultErrorDecay + time.Second)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(0, 0)), "inferlb_endpoint_refused_tenants"))
}
