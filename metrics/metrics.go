// Package metrics exports a Balancer's live state as Prometheus metrics, so
// operators see what the router sees: load, latency, error rate and standing
// (Collector), what became of the telemetry samples offered to a telemetry
// Store (StoreCollector), how the telemetry Pollers that feed it are
// doing (PollerCollector), and what an HTTP Transport did to its calls
// beyond sending each once: resends after an idle close, failovers
// (TransportCollector). It is an adapter: the core never imports
// Prometheus.
//
// Each collector exports the counts of the object it is built over, labelled
// with the name it is given, so summing a counter over its series counts each
// event once. Several Balancers may share one Store: its sample counts are
// the Store's, exported once by its StoreCollector, not by every Balancer's
// Collector.
//
// The series, for dashboards and alerts (each HELP text says more):
//
//	Collector, {balancer="name"}, per endpoint {endpoint="ID"}:
//	  inferlb_endpoint_in_flight, _in_flight_tokens, _ready, _breaker_open,
//	  _outlier_ejected, _exclusion_remaining_seconds, _weight,
//	  _slow_start_factor, _error_rate, _client_error_ratio,
//	  _latency_ewma_seconds{service},
//	  _ttft_ewma_seconds, _time_per_output_token_seconds,
//	  _picks_total, _successes_total, _failures_total, _overloads_total,
//	  _not_served_total, _too_long_total, _model_failures_total, _canceled_total,
//	  _unanswered_total, _abandoned_run, _client_errors_total,
//	  _refused_tenants, _breaker_trips_total, _breaker_recoveries_total,
//	  _outlier_ejections_total, _affinity_spills_total{cache="warm|cold"},
//	  _telemetry{field="kv_cache_usage|waiting|..."} (the fresh readings
//	  it routes on), _telemetry_age_seconds
//	  (each name after the first is inferlb_endpoint_ plus the suffix);
//	  and per Balancer: inferlb_retries_total{result="allowed|denied"},
//	  inferlb_affinity_key_reuse_ratio, inferlb_affinity_following_keys
//	StoreCollector, {store="name"}:
//	  inferlb_telemetry_samples_total{result="accepted|dropped_empty|
//	  dropped_old|dropped_full|dropped_unknown|arrived_stale"},
//	  inferlb_telemetry_partial_samples_total (malformed fields left out),
//	  inferlb_telemetry_store_endpoints
//	PollerCollector, {poller="name"}:
//	  inferlb_telemetry_poll_rounds_total, _failures_total, _timeouts_total,
//	  _partial_total, _published_total, _skipped_total, _unknown_total,
//	  _stale_total, _early_rounds_total, _consecutive_failures
//	TransportCollector, {transport="name"}:
//	  inferlb_http_failovers_total, inferlb_http_idle_close_resends_total
//
// The telemetry values the Balancer routes on (a server's queue, its KV-cache
// use) are exported per endpoint as the Balancer sees them, fresh fields only
// (inferlb_endpoint_telemetry{field}): a field that is stale or was never
// reported has no series, while the servers' own /metrics keep the full
// history.
//
// Durations are in seconds, sizes in bytes. Two gauges are ratios from 0
// to 1 though named before the _ratio convention,
// inferlb_endpoint_error_rate and inferlb_endpoint_slow_start_factor: they
// keep their names, as a rename would break dashboards built on them.
// inferlb_endpoint_telemetry holds each field in that field's own unit
// (bytes, Celsius, watts, counts, ratios; its HELP lists them): select one
// field before aggregating.
//
// The collectors keep no state of their own: each scrape exports the
// endpoints the Balancer has then, so a removed endpoint's series are gone
// from the next scrape, and pods replaced at new addresses on every
// rollout add no series that outlive them. An endpoint removed by Update
// and added back under the same ID is a new endpoint to the Balancer, with
// clean state: its counters start again at 0, which rate() and
// increase() read as a counter reset, as for a restarted process. What the
// old endpoint counted after the last scrape before its removal is not in
// them, nor is the reset seen when the new one counts past the old one's
// last value within one scrape interval.
package metrics

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/telemetry"
)

// Collector is a prometheus.Collector over one Balancer. Each scrape reads
// Balancer.Stats once; label cardinality is the number of endpoints, which
// comes from configuration, never from request data. The Balancer's telemetry
// Store is not part of it: export it with a StoreCollector, once per Store.
type Collector struct {
	b        *balancer.Balancer
	constLbl prometheus.Labels

	inFlight, inFlightTokens, latency, ttft, tpot, errRate, ready, breakerOpen, ramp *prometheus.Desc
	picks, successes, failures, overloads, notServed, tooLong, modelFailures, trips  *prometheus.Desc
	canceled, unanswered, abandoned, clientErrors, clientErrorShare, refusedTenants  *prometheus.Desc
	recoveries, ejections, exclusion, ejected, weight                                *prometheus.Desc
	spills, retries, keyReuse, following                                             *prometheus.Desc
	telemetry, telemetryAge                                                          *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector for b. balancerName becomes the constant
// label balancer="..." so several Balancers in one process can be told apart.
func NewCollector(b *balancer.Balancer, balancerName string) *Collector {
	cl := prometheus.Labels{"balancer": balancerName}
	ep := []string{"endpoint"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("inferlb_"+name, help, labels, cl)
	}
	return &Collector{
		b: b, constLbl: cl,
		inFlight:       d("endpoint_in_flight", "Calls picked for the endpoint and not yet done.", ep),
		inFlightTokens: d("endpoint_in_flight_tokens", "Estimated tokens (prompt + max output) of in-flight calls.", ep),
		latency:        d("endpoint_latency_ewma_seconds", "Peak-EWMA latency of successful calls, as last observed, by service (llm|embedding|rerank|unknown; each kept apart, as the balancer scores them); a service the endpoint has not answered has no series.", []string{"endpoint", "service"}),
		ttft:           d("endpoint_ttft_ewma_seconds", "EWMA of time to first token of streamed calls; an endpoint no streamed call has reported one for has no series.", ep),
		tpot:           d("endpoint_time_per_output_token_seconds", "EWMA of decode time per output token after the first, from streamed calls; an endpoint no such call (4+ output tokens) has reported one for has no series.", ep),
		errRate:        d("endpoint_error_rate", "Share of the endpoint's recent calls that failed, a ratio from 0 to 1 (named before the _ratio convention): an EWMA over the calls counted in endpoint_successes_total and endpoint_failures_total, decayed towards 0 with time; other outcomes leave it as it is.", ep),
		ready:          d("endpoint_ready", "1 when the transport reports the endpoint ready.", ep),
		breakerOpen:    d("endpoint_breaker_open", "1 while the circuit breaker holds the endpoint out or probes it.", ep),
		ramp:           d("endpoint_slow_start_factor", "Fraction of its endpoint_weight the endpoint takes now as slow start ramps it up, a ratio from 0 to 1 (named before the _ratio convention; 1: full weight, not ramping).", ep),
		picks:          d("endpoint_picks_total", "Calls routed to the endpoint.", ep),
		successes:      d("endpoint_successes_total", "Calls that succeeded.", ep),
		failures:       d("endpoint_failures_total", "Calls that failed, held against the endpoint (overloads, cancellations, not-served and too-long answers and model failures are not counted here).", ep),
		overloads:      d("endpoint_overloads_total", "Calls answered with overload (429, 503 with Retry-After, a server's load shedding, RESOURCE_EXHAUSTED, a gRPC stream refused or drained unprocessed).", ep),
		exclusion: d("endpoint_exclusion_remaining_seconds",
			"Seconds from now until the endpoint's exclusion from rotation ends, 0 with none: a circuit-breaker trip or failed probe, an outlier ejection or an overload cooldown (Retry-After), whichever ends last. An exclusion while endpoint_breaker_open and endpoint_outlier_ejected are 0 is an overload cooldown. Past its exclusion an open breaker takes only its half-open probes (endpoint_breaker_open stays 1).", ep),
		ejected: d("endpoint_outlier_ejected",
			"1 while an outlier ejection holds the endpoint out (endpoint_exclusion_remaining_seconds lasts at least as long).", ep),
		weight: d("endpoint_weight",
			"Capacity weight of the endpoint as last described to the balancer (Endpoint.Weight: 0 or an invalid weight read as 1, one above balancer.MaxWeight as MaxWeight), before slow start scales it (endpoint_slow_start_factor).", ep),
		notServed: d("endpoint_not_served_total",
			"Calls the endpoint answered it does not serve the model of (vLLM's 404 for an absent LoRA adapter, Ollama's model not found, Triton's unknown model); that model's calls pass it over for a while.", ep),
		tooLong: d("endpoint_too_long_total",
			"Calls the endpoint refused as longer than its context window for their model (vLLM's or SGLang's 400, TGI's 422, TEI's 413 or 422, TensorRT-LLM's, or a gRPC status with that text); longer calls of that model pass it over for a while.", ep),
		modelFailures: d("endpoint_model_failures_total",
			"Calls that failed for their model alone: the server failed one model's calls while it served others (a crashed Triton model backend, a broken LoRA adapter); held against that model there, not the endpoint, and not in endpoint_failures_total.", ep),
		canceled: d("endpoint_canceled_total",
			"Calls that ended canceled (an error wrapping context.Canceled: the caller's own cancellation, and what an adapter reports so, such as a deadline after a stream's first token): neither success nor failure, held against nothing. With the other outcome counts and endpoint_in_flight they make up endpoint_picks_total.", ep),
		unanswered: d("endpoint_unanswered_total",
			"Of endpoint_canceled_total, the calls their caller gave up on while the endpoint had sent nothing back (over HTTP before the response headers or in a read that waited for a stream's first token, over gRPC with nothing received or, through StreamTiming, in a receive that waited for a stream's first message): many on one endpoint, against few on its peers, say its calls hang. An embedding's or rerank's wait raises the endpoint's latency for that service; a generation's, as long as its answers take, adds to endpoint_abandoned_run.", ep),
		abandoned: d("endpoint_abandoned_run",
			"The current run of generation calls given up on with nothing back, each after waiting as long as the endpoint's answers take (its peers', before it has answered one) and none answered from then on, with no answer or failure since: at 2 or more, with calls out, the endpoint looks hung (an engine stuck behind a live API server, its /metrics frozen) and is priced up and passed over for its affinity keys.", ep),
		clientErrors: d("endpoint_client_errors_total",
			"Calls the endpoint refused as bad or not allowed (HTTP 4xx but 408, 424 and 429: 401 and 403 from a wrong API key, 404 from a missing route, 400 and 422; the gRPC codes that map to them), other than not-served and too-long answers: neither success nor failure.", ep),
		clientErrorShare: d("endpoint_client_error_ratio",
			"Share of the endpoint's recent answers that were client errors, a ratio from 0 to 1: an EWMA over its successes, failures and client errors, decayed towards 0 with time. The balancer passes over an endpoint whose share is more than 0.5 above the other candidate's (a replica with a wrong API key).", ep),
		refusedTenants: d("endpoint_refused_tenants",
			"Tenants whose calls the balancer passes the endpoint over for now, because it refused a run of their calls (client errors of calls that name their tenant) too long to be their own bad calls: a replica some tenants' API keys have not reached. A tenant counts for ErrorDecay after its last refusal there, or until the endpoint serves one of its calls; a pick still takes the endpoint when passing it over would hold out more than MaxEjectedFraction of the pool or leave no candidate. A count: tenants are request data, never label values.", ep),
		trips:      d("endpoint_breaker_trips_total", "Times the circuit breaker tripped.", ep),
		recoveries: d("endpoint_breaker_recoveries_total", "Times the endpoint recovered through half-open probes.", ep),
		ejections:  d("endpoint_outlier_ejections_total", "Times outlier detection ejected the endpoint.", ep),
		spills: d("endpoint_affinity_spills_total",
			"Calls with an affinity key taken although not the key's owner, by whether the endpoint was known to hold the key's prefix (cache=warm|cold).",
			[]string{"endpoint", "cache"}),
		retries: d("retries_total", "Failover retries asked of the retry budget, by answer.", []string{"result"}),
		keyReuse: d("affinity_key_reuse_ratio",
			"Estimated share of keyed requests whose affinity key recurs (absent while no estimate is kept).", nil),
		following: d("affinity_following_keys",
			"1 while affinity keys steer picks; 0 with affinity off or while keys do not recur (MinKeyReuse).", nil),
		telemetry: d("endpoint_telemetry",
			"The endpoint's telemetry as the balancer routes on it (fresh fields only), by field, each in its own unit: gpu_mem_used_bytes and gpu_mem_total_bytes in bytes, gpu_temp_c in degrees Celsius, gpu_power_w in watts; running, waiting and lora_slots are counts; kv_cache_preallocated and asleep are 0 or 1; gpu_util, kv_cache_usage and prefix_cache_hit_rate are ratios from 0 to 1, cpu_util and app_util too but above 1 when the server is overcommitted (ORCA). Select one field before aggregating.",
			[]string{"endpoint", "field"}),
		telemetryAge: d("endpoint_telemetry_age_seconds",
			"Age of the oldest fresh telemetry field the balancer routes on. Fields go stale at the balancer's TelemetryMaxAge (unless it is negative), so this stays below it, and an endpoint with no fresh field (none reported, all stale or expired) has no series: alert on the series missing, not on its value.", ep),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.inFlight, c.inFlightTokens, c.latency, c.ttft, c.tpot, c.errRate, c.ready, c.breakerOpen, c.ramp,
		c.exclusion, c.ejected, c.weight,
		c.picks, c.successes, c.failures, c.overloads, c.notServed, c.tooLong, c.modelFailures, c.canceled, c.unanswered, c.abandoned, c.clientErrors, c.clientErrorShare, c.refusedTenants, c.trips, c.recoveries, c.ejections, c.spills, c.retries,
		c.keyReuse, c.following, c.telemetry, c.telemetryAge,
	} {
		ch <- d
	}
}

// labelValue returns id with each byte that is not valid UTF-8 written as
// \xNN.
func labelValue(id string) string {
	if utf8.ValidString(id) {
		return id
	}
	var b strings.Builder
	for i := 0; i < len(id); {
		r, n := utf8.DecodeRuneInString(id[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, `\x%02x`, id[i])
		} else {
			b.WriteString(id[i : i+n])
		}
		i += n
	}
	return b.String()
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	stats := c.b.Stats()
	now := c.b.Now()
	seen := make(map[string]bool, len(stats))
	for _, s := range stats {
		// A label value must be UTF-8, and a series may be collected only
		// once, or the registry fails the whole scrape; endpoint IDs are
		// whatever the caller gave Update. Invalid bytes are escaped, so
		// IDs that differ only in them stay apart; an ID that still meets
		// one exported already (a valid ID spelled like an escape) is left
		// out rather than failing the scrape.
		s.ID = labelValue(s.ID)
		if seen[s.ID] {
			continue
		}
		seen[s.ID] = true
		gauge(c.inFlight, float64(s.InFlight), s.ID)
		gauge(c.inFlightTokens, float64(s.InFlightTokens), s.ID)
		for svc, lat := range s.ServiceLatency {
			if lat > 0 {
				gauge(c.latency, lat.Seconds(), s.ID, inferlb.Service(svc).String())
			}
		}
		// 0 is "none measured" (an endpoint that only served
		// embeddings, or no streamed call yet), not an instant first
		// token: exported, it pulled every average and minimum over the
		// fleet towards 0 s.
		if s.TTFT > 0 {
			gauge(c.ttft, s.TTFT.Seconds(), s.ID)
		}
		if s.TimePerOutputToken > 0 {
			gauge(c.tpot, s.TimePerOutputToken.Seconds(), s.ID)
		}
		gauge(c.errRate, s.ErrorRate, s.ID)
		gauge(c.ready, b2f(s.Ready), s.ID)
		gauge(c.breakerOpen, b2f(s.BreakerOpen), s.ID)
		gauge(c.ramp, s.RampFactor, s.ID)
		var excl float64
		if !s.ExcludedUntil.IsZero() {
			excl = max(s.ExcludedUntil.Sub(now), 0).Seconds()
		}
		gauge(c.exclusion, excl, s.ID)
		gauge(c.ejected, b2f(!s.EjectedUntil.IsZero()), s.ID)
		gauge(c.weight, s.Weight, s.ID)
		if tel := &s.Telemetry; tel.Has != 0 {
			for f := range telemetry.NumFields {
				if v, ok := tel.Get(telemetry.Field(f)); ok {
					gauge(c.telemetry, v, s.ID, telemetry.Field(f).String())
				}
			}
			gauge(c.telemetryAge, max(now.Sub(tel.Time), 0).Seconds(), s.ID)
		}
		counter(c.picks, s.Picks, s.ID)
		counter(c.successes, s.Successes, s.ID)
		counter(c.failures, s.Failures, s.ID)
		counter(c.overloads, s.Overloads, s.ID)
		counter(c.notServed, s.NotServed, s.ID)
		counter(c.tooLong, s.TooLong, s.ID)
		counter(c.modelFailures, s.ModelFailures, s.ID)
		counter(c.canceled, s.Canceled, s.ID)
		counter(c.unanswered, s.Unanswered, s.ID)
		gauge(c.abandoned, float64(s.Abandoned), s.ID)
		counter(c.clientErrors, s.ClientErrors, s.ID)
		gauge(c.clientErrorShare, s.ClientErrorShare, s.ID)
		gauge(c.refusedTenants, float64(s.RefusedTenants), s.ID)
		counter(c.trips, s.Trips, s.ID)
		counter(c.recoveries, s.Recoveries, s.ID)
		counter(c.ejections, s.Ejections, s.ID)
		counter(c.spills, s.WarmSpills, s.ID, "warm")
		counter(c.spills, s.ColdSpills, s.ID, "cold")
	}
	r := c.b.RetryStats()
	counter(c.retries, r.Allowed, "allowed")
	counter(c.retries, r.Denied, "denied")
	k := c.b.KeyReuse()
	if k.Observed > 0 {
		gauge(c.keyReuse, k.Ratio)
	}
	gauge(c.following, b2f(k.FollowingKeys))
}
