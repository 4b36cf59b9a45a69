package modelserver

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// extractors maps each engine to the function that fills a Sample from its
// metrics. Names are in index form (namespace colon replaced by '_').
var extractors = [...]func(*extractor){
	Unknown: func(*extractor) {},
	VLLM:    func(x *extractor) { x.vllm(nil, nil, nil) },
	SGLang: func(x *extractor) {
		// With --enable-priority-scheduling the counts carry priority="" for
		// the total and priority="<n>" for a breakdown of that total.
		x.sumOverGroups(telemetry.Running, x.where("sglang_num_running_reqs", "priority", ""), sglangReplicaLabels...)
		// Waiting is the waiting queue plus, in prefill/decode
		// disaggregation, the queues a request passes before it: a prefill
		// server's bootstrap queue (handshake with the decode side, then the
		// waiting queue), a decode server's prealloc queue (KV memory, then
		// the transfer queue) and transfer queue (KV cache arriving, then the
		// waiting queue). A request is in one of them at a time, never also
		// running, and a new request queues behind them; SGLang's own load
		// report for its router (get_load) counts the same queues.
		// The bootstrap queue was exported as num_prefill_prealloc_queue_reqs
		// before its rename. Left out: the prefill inflight queue, whose
		// prefill is done (its KV cache is being sent; the memory shows in
		// token_usage), and the grammar queue, whose requests enter the
		// waiting queue at its tail once their grammar compiles, behind a
		// request that arrives meanwhile. (sgl-project/sglang:
		// python/sglang/srt/observability/metrics_collector.py,
		// SchedulerStats and log_stats; observability/scheduler_metrics_mixin.py,
		// the stats it sets and get_load;
		// disaggregation/prefill.py and decode.py, request life cycles;
		// constrained/grammar_manager.py; managers/scheduler.py,
		// handle_generate_request and _add_request_to_queue.)
		x.sumOverGroupsOf(telemetry.Waiting, sglangReplicaLabels,
			x.where("sglang_num_queue_reqs", "priority", ""),
			having(x.first(telemetry.Waiting, "sglang_num_prefill_bootstrap_queue_reqs", "sglang_num_prefill_prealloc_queue_reqs"), "priority", ""),
			x.where("sglang_num_decode_prealloc_queue_reqs", "priority", ""),
			x.where("sglang_num_decode_transfer_queue_reqs", "priority", ""))
		x.max(telemetry.KVCacheUsage, x.all("sglang_token_usage"))
		// cache_hit_rate is the last prefill batch's rate, and SGLang sets it
		// to 0 whenever it logs decode stats: a noisy, low reading.
		x.mean(telemetry.PrefixCacheHitRate, x.all("sglang_cache_hit_rate"))
	},
	TensorRTLLM: func(x *extractor) {
		x.sum(telemetry.Running, x.all("trtllm_num_requests_running"))
		x.sum(telemetry.Waiting, x.all("trtllm_num_requests_waiting"))
		x.max(telemetry.KVCacheUsage, x.all("trtllm_kv_cache_utilization"))
		x.mean(telemetry.PrefixCacheHitRate, x.all("trtllm_kv_cache_hit_rate"))
	},
	TGI: func(x *extractor) {
		// The router's gauges, unlabelled: the size of the batch it is
		// running and the entries left in its queue after each batch is
		// formed (huggingface/text-generation-inference backends/v3/src/
		// backend.rs and queue.rs; the same in backends/v2).
		x.sum(telemetry.Running, x.all("tgi_batch_current_size"))
		x.sum(telemetry.Waiting, x.all("tgi_queue_size"))
	},
	Triton: func(x *extractor) {
		// The TensorRT-LLM backend's gauges (the vLLM backend's are vLLM's,
		// read below; other backends have none). Its
		// request_type="scheduled" is the executor's batch this iteration,
		// "waiting" is active minus scheduled: requests the executor holds
		// but did not schedule ("active" is both, "context" a part of the
		// batch, "max" a capacity). (triton-inference-server/tensorrtllm_backend
		// README "Triton Metrics"; NVIDIA/TensorRT-LLM
		// triton_backend/inflight_batcher_llm/src/model_instance_state.cc,
		// WaitForStats.)
		// Backends before the "waiting" and "fraction" series (the Triton
		// 23.11 era's) export what the newer ones derive them from, and
		// they are derived here as the newer ones do: waiting is active
		// minus scheduled, fraction used over max blocks (0 without any).
		waiting := x.where("nv_trt_llm_request_metrics", "request_type", "waiting")
		if len(waiting) == 0 {
			waiting = x.derive("request_type",
				x.where("nv_trt_llm_request_metrics", "request_type", "active"),
				x.where("nv_trt_llm_request_metrics", "request_type", "scheduled"),
				func(active, scheduled float64) float64 { return active - scheduled })
		}
		// Triton's pending count stops when a backend starts executing a
		// request (triton-inference-server/core src/infer_request.cc), and the
		// TensorRT-LLM backend's execute only enqueues into its executor, so
		// the two queues are disjoint and add up. So does the vLLM backend's
		// execute (triton-inference-server/vllm_backend src/model.py): its
		// requests then wait in vLLM's scheduler, which it exports below.
		waiting = slices.Concat(x.all("nv_inference_pending_request_count"), waiting)
		kv := x.where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction")
		if len(kv) == 0 {
			kv = x.derive("kv_cache_block_type",
				x.where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used"),
				x.where("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"),
				func(used, blocks float64) float64 {
					if blocks > 0 {
						return used / blocks
					}
					return 0
				})
		}
		// The vLLM backend exports vLLM's own gauges, labelled model and
		// version (vllm_backend src/utils/metrics.py): its batch, queue and
		// KV cache are read as vLLM's, with the TensorRT-LLM backend's of
		// other models served beside it added up as separate batches.
		x.vllm(x.where("nv_trt_llm_request_metrics", "request_type", "scheduled"), waiting, kv)
		// Only Triton reports the GPUs: vLLM exports no GPU gauge.
		x.max(telemetry.GPUUtil, x.all("nv_gpu_utilization"))
		x.max(telemetry.GPUPower, x.all("nv_gpu_power_usage"))
		x.worstMemory(x.all("nv_gpu_memory_used_bytes"), x.all("nv_gpu_memory_total_bytes"), "gpu_uuid")
	},
	TEI: func(x *extractor) {
		// TEI's only gauge, unlabelled: the inputs waiting in its queue,
		// raised by one as each is queued and set to what is left after
		// each batch is taken. An entry is one input (a batch request's
		// inputs are queued one by one), not an HTTP request nor a batch.
		// TEI exports no gauge of the batch being computed (te_batch_next_*
		// are histograms of the batches formed) nor of requests in flight,
		// so Running is left out. (huggingface/text-embeddings-inference
		// core/src/queue.rs, queue_blocking_task; router/src/http/server.rs,
		// which queues each input of a batch request separately.)
		x.sum(telemetry.Waiting, x.all("te_queue_size"))
	},
	LlamaCpp: func(x *extractor) {
		// llama-server's gauges, unlabelled: the slots processing a task
		// (one request each), the tasks deferred until a slot frees, and,
		// in builds before they were dropped, the KV cells in use over the
		// context size (kv_cache_usage_ratio; newer builds export no KV
		// usage). (ggml-org/llama.cpp examples/server/server.cpp,
		// handle_metrics and the SERVER_TASK_TYPE_METRICS task; later
		// tools/server/server-task.cpp, server_task_result_metrics::to_metrics.)
		x.sum(telemetry.Running, x.all("llamacpp_requests_processing"))
		x.sum(telemetry.Waiting, x.all("llamacpp_requests_deferred"))
		x.max(telemetry.KVCacheUsage, x.all("llamacpp_kv_cache_usage_ratio"))
	},
}

// sglangReplicaLabels tell apart processes that report one scheduler's state.
// SGLang runs a scheduler per GPU; by default only attention-TP rank 0 of each
// data-parallel rank exports, but --enable-metrics-for-all-schedulers makes
// every TP rank export the batch it shares with rank 0, and every PP stage
// exports the same requests (stages receive and schedule them in the same
// order). Data-parallel ranks (label dp_rank) are separate batches.
// (sgl-project/sglang: python/sglang/srt/observability/metrics_collector.py,
// SchedulerMetricsCollector.init_new; managers/scheduler_pp_mixin.py.)
var sglangReplicaLabels = []string{"tp_rank", "pp_rank", "moe_ep_rank"}

// vllm fills Running, Waiting, KVCacheUsage, PrefixCacheHitRate and the
// LoRA reading from vLLM's metrics, counting with them running, waiting
// and kv: series of the same fields from other sources of the same server
// (Triton's queue ahead of its vLLM backend, the TensorRT-LLM backend of
// another model), which report other requests and other KV caches.
func (x *extractor) vllm(running, waiting, kv []*dto.Metric) {
	x.sum(telemetry.Running, slices.Concat(running, x.all("vllm_num_requests_running")))
	x.sum(telemetry.Waiting, slices.Concat(waiting, x.all("vllm_num_requests_waiting")))
	// One series per engine="N" (data-parallel engine, each its own
	// scheduler and KV cache): counts add up, usage is the fuller engine.
	// kv_cache_usage_perc is the 0.9 name of gpu_cache_usage_perc (V0's
	// and early V1's); 0.9-0.10 export both, 0.11 hides the old name
	// (--show-hidden-metrics-for-version=0.10) and 0.12 drops it. Both
	// are fractions in 0..1 despite the name.
	// (vllm-project/vllm vllm/v1/metrics/loggers.py.)
	x.max(telemetry.KVCacheUsage, slices.Concat(kv, x.first(telemetry.KVCacheUsage, "vllm_kv_cache_usage_perc", "vllm_gpu_cache_usage_perc")))
	// prefix_cache_{hits,queries} were renamed from V1's
	// gpu_prefix_cache_{hits,queries} on the same schedule.
	if !x.ratio(telemetry.PrefixCacheHitRate,
		x.firstCount(telemetry.PrefixCacheHitRate, "vllm_prefix_cache_hits_total", "vllm_prefix_cache_hits", "vllm_gpu_prefix_cache_hits_total", "vllm_gpu_prefix_cache_hits"),
		x.firstCount(telemetry.PrefixCacheHitRate, "vllm_prefix_cache_queries_total", "vllm_prefix_cache_queries", "vllm_gpu_prefix_cache_queries_total", "vllm_gpu_prefix_cache_queries")) {
		// V0's gauge; -1 when prefix caching is off (V0's default),
		// which is no reading rather than a bad one.
		x.max(telemetry.PrefixCacheHitRate, except(x.all("vllm_gpu_prefix_cache_hit_rate"), -1))
	}
	x.loraInfo(x.all("vllm_lora_requests_info"), x.all("vllm_num_requests_running"))
	x.sleepState(x.all("vllm_engine_sleep_state"))
}

// sleepState reads vLLM's vllm:engine_sleep_state (servers started with
// --enable-sleep-mode; exported only with VLLM_SERVER_DEV_MODE=1 in
// releases of late 2025, unconditionally later) into Asleep. The gauge
// has one series per engine (data-parallel engine label) and sleep_state
// label: awake (1 awake, 0 asleep), weights_offloaded (1 at sleep level
// 1) and discard_all (1 at level 2), set together on each /sleep and
// /wake_up. (vllm-project/vllm vllm/v1/metrics/loggers.py,
// PrometheusStatLogger, gauge_engine_sleep_state and record_sleep_state.)
// An engine is asleep when its awake series is 0, or, without one, when
// weights_offloaded or discard_all is 1. The server is asleep when every
// engine that reports a state is: vLLM puts all its engines to sleep and
// wakes them together, so a mix is a scrape caught mid-way, and one awake
// engine can serve; a server wrongly read as asleep would lose its calls
// until the next scrape. A value other than 0 or 1 is dropped and counted.
func (x *extractor) sleepState(ms []*dto.Metric) {
	type state struct{ awake, asleep, level bool } // awake series seen, its reading; a level at 1
	engines := map[string]*state{}
	skip := []string{"sleep_state"}
	for _, m := range ms {
		v, ok := promtext.Value(m)
		if !ok || v != 0 && v != 1 {
			x.drop(telemetry.Asleep, promtext.RawValue(m))
			continue
		}
		k := groupKey(m, skip)
		e := engines[k]
		if e == nil {
			e = &state{}
			engines[k] = e
		}
		switch promtext.Label(m, "sleep_state") {
		case "awake":
			e.awake, e.asleep = true, v == 0
		case "weights_offloaded", "discard_all":
			e.level = e.level || v == 1
		}
	}
	if len(engines) == 0 {
		return
	}
	asleep := 1.0
	for _, e := range engines {
		if e.awake && !e.asleep || !e.awake && !e.level {
			asleep = 0
		}
	}
	x.s.Set(telemetry.Asleep, asleep)
}

// read holds, in index form, every metric name an extractor reads: Parse
// builds metric objects for these only. It is found by running each
// extractor over no metrics, noting the names it asks for.
var read = func() map[string]bool {
	x := extractor{names: map[string]bool{}}
	for _, f := range extractors {
		f(&x)
	}
	return x.names
}()

// loraInfo reads vLLM's vllm:lora_requests_info (exported with
// --enable-lora) into LoRASlots and Sample.Adapters. The gauge's labels are
// its state: max_lora (--max-loras), running_lora_adapters and
// waiting_lora_adapters (comma-separated names), and its value the time
// they were set (set_to_current_time). Every label set the server ever
// had stays exported with the time it was last set, so the current state
// is the series with the latest time. (vllm-project/vllm
// vllm/v1/metrics/loggers.py, PrometheusStatLogger.record.)
//
// The base model, which uses no adapter, is the model_name label of the
// running count (vLLM's served model name): without it nothing tells a
// request for the base model from one for an adapter, and the reading is
// left out. A running (waiting) list next to a running (waiting) count of
// 0 is the last state logged before the server went idle, and is read as
// empty. Lists are read by telemetry.AdapterNames (bounded); a bad
// max_lora label drops the reading and counts it, and a series whose value
// (its time) is not a number is dropped and counted.
//
// A server of several data-parallel engines (its running count has more
// than one engine label) is read without it: each engine has slots of its
// own, and the gauge, which has no engine label, holds the state of
// whichever engine logged last (vLLM refused LoRA with data parallel, then
// warned that the metric may mislead there): read as the server's, it
// said the slots were full while another engine had room, or free while
// the one that takes the call had none. Such a server's adapters steer no
// call; it serves them as a server without LoRA telemetry does.
func (x *extractor) loraInfo(ms, running []*dto.Metric) {
	var cur *dto.Metric
	at := math.Inf(-1)
	for _, m := range ms {
		v, ok := promtext.Value(m)
		if !ok {
			// A time that is not a number: malformed, so dropped and
			// counted (promapi skips and counts such a series too).
			x.drop(telemetry.LoRASlots, promtext.RawValue(m))
			continue
		}
		if v > at {
			cur, at = m, v
		}
	}
	base := ""
	for _, m := range running {
		if base = promtext.Label(m, "model_name"); base != "" {
			break
		}
	}
	if cur == nil || base == "" || engineCount(running) > 1 {
		return
	}
	slots, err := strconv.ParseFloat(promtext.Label(cur, "max_lora"), 64)
	if err != nil || !(slots >= 1) || math.IsInf(slots, 0) {
		x.drop(telemetry.LoRASlots, slots)
		return
	}
	a := &telemetry.Adapters{Base: base}
	if r, ok := x.s.Get(telemetry.Running); !ok || r > 0 {
		a.Running = telemetry.AdapterNames(promtext.Label(cur, "running_lora_adapters"))
	}
	if w, ok := x.s.Get(telemetry.Waiting); !ok || w > 0 {
		a.Waiting = telemetry.AdapterNames(promtext.Label(cur, "waiting_lora_adapters"))
	}
	x.s.SetAdapters(slots, a)
}

// extractor accumulates a Sample and counts values it had to drop.
type extractor struct {
	m        metrics
	dups     map[string]int // repeated series left out of m, by name; counted as bad once read
	s        telemetry.Sample
	bad      int
	firstBad string
	names    map[string]bool // if set, every name asked for (see read)
}

func (x *extractor) all(name string) []*dto.Metric { return x.series(name) }

// series returns name's series. The first read of a name counts its
// repeated series (see index) as dropped values: a repeat of a metric this
// package does not read is no fault of the reading.
func (x *extractor) series(name string) []*dto.Metric {
	if x.names != nil {
		x.names[name] = true
	}
	if n := x.dups[name]; n > 0 {
		delete(x.dups, name)
		x.bad += n
		if x.firstBad == "" {
			x.firstBad = fmt.Sprintf("%d duplicate series of %s", n, name)
		}
	}
	return x.m[name]
}

// first returns the series of the first of names (one metric's names
// across releases, newest first) that has a value valid for f, the field
// it fills. A name before it whose every value is malformed has them
// dropped and counted: vLLM 0.9-0.10 export a renamed metric under both
// names, and a NaN under the new one must not hide a good reading under
// the old one. nil when no name has a valid value (every one counted).
func (x *extractor) first(f telemetry.Field, names ...string) []*dto.Metric {
	return x.firstWhere(f, func(v float64) bool { return valid(f, v) }, names...)
}

// firstCount is first for counters read into f (a ratio's numerator or
// denominator): a value is valid when it is not negative.
func (x *extractor) firstCount(f telemetry.Field, names ...string) []*dto.Metric {
	return x.firstWhere(f, func(v float64) bool { return v >= 0 }, names...)
}

func (x *extractor) firstWhere(f telemetry.Field, ok func(float64) bool, names ...string) []*dto.Metric {
	for _, n := range names {
		if x.names != nil {
			x.names[n] = true
		}
	}
	for _, n := range names {
		if len(x.m[n]) == 0 {
			continue
		}
		ms := x.series(n)
		for _, m := range ms {
			if v, good := promtext.Value(m); good && ok(v) {
				return ms
			}
		}
		for _, m := range ms {
			x.drop(f, promtext.RawValue(m))
		}
	}
	return nil
}

// where returns name's series whose label has value.
func (x *extractor) where(name, label, value string) []*dto.Metric {
	return having(x.series(name), label, value)
}

// having returns the series of ms whose label has value.
func having(ms []*dto.Metric, label, value string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range ms {
		if promtext.Label(m, label) == value {
			out = append(out, m)
		}
	}
	return out
}

// derive returns, for each series of a, f of its value and that of the
// series of b whose labels are the same but for label (a family's kind
// label, as request_type), as a gauge: the series a server that exports f
// itself would have. A value that is not a finite number makes f's NaN,
// which the readers drop and count.
func (x *extractor) derive(label string, a, b []*dto.Metric, f func(a, b float64) float64) []*dto.Metric {
	if len(a) == 0 || len(b) == 0 {
		return nil
	}
	skip := []string{label}
	bs := make(map[string]*dto.Metric, len(b))
	for _, m := range b {
		bs[groupKey(m, skip)] = m
	}
	var out []*dto.Metric
	for _, m := range a {
		other, ok := bs[groupKey(m, skip)]
		if !ok {
			continue
		}
		v := math.NaN()
		va, okA := promtext.Value(m)
		vb, okB := promtext.Value(other)
		if okA && okB {
			v = f(va, vb)
		}
		out = append(out, &dto.Metric{Label: m.Label, Gauge: &dto.Gauge{Value: &v}})
	}
	return out
}

// except returns the series of ms whose value is not sentinel (an engine's
// word for "no reading"), which are then neither read nor counted as bad.
func except(ms []*dto.Metric, sentinel float64) []*dto.Metric {
	out := ms[:0:0]
	for _, m := range ms {
		if v, ok := promtext.Value(m); !ok || v != sentinel {
			out = append(out, m)
		}
	}
	return out
}

// valid reports whether v is in f's range; fractions above 1 are a unit
// mistake (a percentage), not a full cache, so they are dropped.
func valid(f telemetry.Field, v float64) bool {
	switch f {
	case telemetry.KVCacheUsage, telemetry.PrefixCacheHitRate, telemetry.GPUUtil:
		return v >= 0 && v <= 1
	case telemetry.Running, telemetry.Waiting:
		return v >= 0 && v <= telemetry.MaxRequests
	}
	return v >= 0
}

// values returns the valid values of ms for f, counting the rest, and
// whether there was no rest.
func (x *extractor) values(f telemetry.Field, ms []*dto.Metric) (vs []float64, complete bool) {
	out := make([]float64, 0, len(ms))
	for _, m := range ms {
		v, ok := promtext.Value(m)
		if !ok || !valid(f, v) {
			x.drop(f, promtext.RawValue(m))
			continue
		}
		out = append(out, v)
	}
	return out, len(out) == len(ms)
}

func (x *extractor) drop(f telemetry.Field, v float64) {
	x.bad++
	if x.firstBad == "" {
		x.firstBad = fmt.Sprintf("%s=%g", f, v)
	}
}

// sum sets f to the sum of ms's values. A series whose value is dropped
// withholds f (the drop is counted): the sum of the others, one
// data-parallel engine's count without its peer's, would understate the
// server's load and draw calls to it, where an unknown field does not.
func (x *extractor) sum(f telemetry.Field, ms []*dto.Metric) {
	if vs, complete := x.values(f, ms); complete && len(vs) > 0 {
		total := 0.0
		for _, v := range vs {
			total += v
		}
		x.setSum(f, total)
	}
}

// setSum sets f to total, a sum of valid counts, or drops it and counts it
// when the sum is out of f's range (counts that add up past
// telemetry.MaxRequests), which Sample.Set would refuse with nothing said.
func (x *extractor) setSum(f telemetry.Field, total float64) {
	if !valid(f, total) || !x.s.Set(f, total) {
		x.drop(f, total)
	}
}

// sumOverGroups sets f to a sum over groups of series, a group being the
// series whose labels agree except for replicas: each group's replicas report
// one state, so the group counts once, with its largest value (replicas
// sample at slightly different times).
//
// A group none of whose series has a valid value withholds f, as in sum:
// the other groups' total would understate the server's load. A replica's
// dropped series, with another of its group read, loses nothing.
func (x *extractor) sumOverGroups(f telemetry.Field, ms []*dto.Metric, replicas ...string) {
	if total, ok, complete := x.groupTotal(f, ms, replicas); ok && complete {
		x.setSum(f, total)
	}
}

// sumOverGroupsOf sets f to the sum of sumOverGroups' totals of first and
// more, each the series of one metric (series of different metrics are
// different counts however alike their labels). It sets f only when first
// has a reading: the others add to it and without it f is unknown.
func (x *extractor) sumOverGroupsOf(f telemetry.Field, replicas []string, first []*dto.Metric, more ...[]*dto.Metric) {
	total, ok, complete := x.groupTotal(f, first, replicas)
	for _, ms := range more {
		t, _, c := x.groupTotal(f, ms, replicas)
		total += t
		complete = complete && c
	}
	if ok && complete {
		x.setSum(f, total)
	}
}

// groupTotal returns sumOverGroups' sum over ms, whether ms had a valid
// value, and whether every group had one (a group whose every series was
// dropped is missing from the sum).
func (x *extractor) groupTotal(f telemetry.Field, ms []*dto.Metric, replicas []string) (total float64, ok, complete bool) {
	var keys []string // first-seen order keeps the sum deterministic
	largest := make(map[string]float64, len(ms))
	var dropped []string // groups of dropped series
	for _, m := range ms {
		v, ok := promtext.Value(m)
		if !ok || !valid(f, v) {
			x.drop(f, promtext.RawValue(m))
			dropped = append(dropped, groupKey(m, replicas))
			continue
		}
		k := groupKey(m, replicas)
		if old, seen := largest[k]; !seen {
			keys = append(keys, k)
			largest[k] = v
		} else if v > old {
			largest[k] = v
		}
	}
	for _, k := range keys {
		total += largest[k]
	}
	complete = true
	for _, k := range dropped {
		if _, read := largest[k]; !read {
			complete = false
		}
	}
	return total, len(keys) > 0, complete
}

// groupKey identifies m by its labels other than skip, in name order.
func groupKey(m *dto.Metric, skip []string) string {
	pairs := make([]string, 0, len(m.Label))
	for _, l := range m.Label {
		if !slices.Contains(skip, l.GetName()) {
			pairs = append(pairs, l.GetName()+"\xff"+l.GetValue())
		}
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\xfe")
}

// max sets f to the largest of ms's values; a dropped one withholds f, as
// in sum: the fuller engine's KV cache may be the one that was dropped.
func (x *extractor) max(f telemetry.Field, ms []*dto.Metric) {
	if vs, complete := x.values(f, ms); complete && len(vs) > 0 {
		m := math.Inf(-1)
		for _, v := range vs {
			m = math.Max(m, v)
		}
		x.s.Set(f, m)
	}
}

// mean sets f to the mean of ms's valid values: the others' mean stands
// for a dropped one (a hit rate, which no pick reads as load).
func (x *extractor) mean(f telemetry.Field, ms []*dto.Metric) {
	if vs, _ := x.values(f, ms); len(vs) > 0 {
		total := 0.0
		for _, v := range vs {
			total += v
		}
		x.s.Set(f, total/float64(len(vs)))
	}
}

// ratio sets f to sum(num)/sum(den) when den is positive and the result is a
// fraction, and reports whether it did. A series of either that is not a
// count (NaN, negative) drops the ratio and is counted: summed as 0, or
// with the other side's series of its engine kept, it would skew the
// reading with nothing said.
func (x *extractor) ratio(f telemetry.Field, num, den []*dto.Metric) bool {
	if len(num) == 0 || len(den) == 0 {
		return false
	}
	bad := false
	total := func(ms []*dto.Metric) float64 {
		t := 0.0
		for _, m := range ms {
			v, ok := promtext.Value(m)
			if !ok || v < 0 {
				x.drop(f, promtext.RawValue(m))
				bad = true
				continue
			}
			t += v
		}
		return t
	}
	n, d := total(num), total(den)
	if bad {
		return false
	}
	if d <= 0 {
		return false // no query yet: unknown, not zero
	}
	if r := n / d; valid(f, r) {
		return x.s.Set(f, r)
	}
	x.drop(f, n/d)
	return false
}

// worstMemory sets GPUMemUsed and GPUMemTotal from the GPU (matched by key
// label) with the highest used/total: the one that runs out first.
func (x *extractor) worstMemory(used, total []*dto.Metric, key string) {
	totals := make(map[string]float64, len(total))
	for _, m := range total {
		if v, ok := promtext.Value(m); ok && v > 0 {
			totals[promtext.Label(m, key)] = v
		}
	}
	worst, found := -1.0, false
	var wu, wt float64
	for _, m := range used {
		u, ok := promtext.Value(m)
		t, okT := totals[promtext.Label(m, key)]
		if !ok || !okT || u < 0 || u > t {
			x.drop(telemetry.GPUMemUsed, promtext.RawValue(m))
			continue
		}
		if r := u / t; r > worst {
			worst, wu, wt, found = r, u, t, true
		}
	}
	if found {
		x.s.Set(telemetry.GPUMemUsed, wu)
		x.s.Set(telemetry.GPUMemTotal, wt)
	}
}

// engineCount returns how many engines ms's series name (their engine label);
// at most 2 is counted, and a series without one counts as one engine.
func engineCount(ms []*dto.Metric) int {
	first, n := "", 0
	for _, m := range ms {
		e := promtext.Label(m, "engine")
		switch {
		case n == 0:
			first, n = e, 1
		case e != first:
			return 2
		}
	}
	return n
}
