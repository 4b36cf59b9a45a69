package modelserver

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Engine is an inference server, as recognized from its metric names.
type Engine uint8

// The engines ParseMetrics recognizes, in the order it checks them (a Triton
// server running the TensorRT-LLM or the vLLM backend is Triton).
const (
	Unknown     Engine = iota
	VLLM               // vllm:* metrics
	SGLang             // sglang:* metrics
	TensorRTLLM        // trtllm-serve, trtllm_* metrics
	TGI                // Hugging Face text-generation-inference, tgi_* metrics
	Triton             // NVIDIA Triton Inference Server, nv_* metrics
	TEI                // Hugging Face text-embeddings-inference, te_* metrics
	LlamaCpp           // llama.cpp's llama-server (--metrics), llamacpp:* metrics
)

var engineNames = [...]string{"unknown", "vllm", "sglang", "tensorrt-llm", "tgi", "triton", "tei", "llama.cpp"}

// String returns the engine's lower-case name.
func (e Engine) String() string {
	if int(e) < len(engineNames) {
		return engineNames[e]
	}
	return fmt.Sprintf("Engine(%d)", uint8(e))
}

// ErrUnknownEngine is returned when an exposition holds no metric of a
// known engine (a wrong URL, a sidecar's /metrics).
var ErrUnknownEngine = errors.New("modelserver: no vLLM, SGLang, TensorRT-LLM, TGI, Triton, TEI or llama.cpp metrics found")

// Result is what Parse read from one exposition.
type Result struct {
	Engine Engine
	// Sample's Time is zero, for the caller to stamp, unless every sample
	// of the metrics read carries a timestamp (see Parse).
	Sample telemetry.Sample
}

// ParseMetrics reads a model server's Prometheus text exposition and returns
// its load as a Sample. It is Parse without the engine.
func ParseMetrics(r io.Reader) (telemetry.Sample, error) {
	res, err := Parse(r)
	return res.Sample, err
}

// Parse reads a model server's Prometheus text exposition (or OpenMetrics
// one), detects the engine from the metric names and maps its metrics to
// Sample fields:
//
//	vLLM          Running      vllm:num_requests_running
//	              Waiting      vllm:num_requests_waiting
//	              KVCacheUsage vllm:kv_cache_usage_perc (before 0.9: vllm:gpu_cache_usage_perc,
//	                           exported until 0.11, read when the new name is absent or
//	                           has no valid value; so are the older prefix-cache names)
//	              PrefixCacheHitRate  vllm:prefix_cache_hits[_total] / vllm:prefix_cache_queries[_total]
//	                           (V1 before 0.9: vllm:gpu_prefix_cache_{hits,queries}[_total];
//	                           V0: vllm:gpu_prefix_cache_hit_rate, at -1 when caching is off: no reading)
//	              LoRASlots, Adapters  vllm:lora_requests_info (with --enable-lora: the label
//	                           set with the latest value; max_lora, running_lora_adapters and
//	                           waiting_lora_adapters; the base model from model_name; not read
//	                           with several engines, whose one gauge holds the last engine's)
//	              Asleep       vllm:engine_sleep_state (with --enable-sleep-mode): 1 - its
//	                           sleep_state="awake" series, or without one 1 when
//	                           weights_offloaded or discard_all is 1; with several engines,
//	                           1 only when every engine sleeps (see below)
//	SGLang        Running      sglang:num_running_reqs
//	              Waiting      sglang:num_queue_reqs + in PD disaggregation the queues ahead of it:
//	                           sglang:num_prefill_bootstrap_queue_reqs (before its rename
//	                           sglang:num_prefill_prealloc_queue_reqs), num_decode_prealloc_queue_reqs,
//	                           num_decode_transfer_queue_reqs (not the prefill inflight queue, whose
//	                           prefill is done, nor the grammar queue, which a new request overtakes)
//	              KVCacheUsage sglang:token_usage
//	              PrefixCacheHitRate  sglang:cache_hit_rate
//	TensorRT-LLM  Running      trtllm_num_requests_running
//	              Waiting      trtllm_num_requests_waiting
//	              KVCacheUsage trtllm_kv_cache_utilization (used / max KV blocks, a fraction)
//	              PrefixCacheHitRate  trtllm_kv_cache_hit_rate
//	                           (trtllm-serve's iteration statistics: they are exported only
//	                           with enable_iter_perf_stats: true in its LLM options)
//	TGI           Running      tgi_batch_current_size
//	              Waiting      tgi_queue_size
//	              KVCachePreallocated  1 (TGI reserves its KV cache at warmup and reports
//	                           no usage of it)
//	Triton        Waiting      nv_inference_pending_request_count (all models: not yet given to a backend)
//	                           + nv_trt_llm_request_metrics{request_type="waiting"} (queued in the
//	                           TensorRT-LLM executor: active minus scheduled, derived so from the
//	                           request_type="active" and "scheduled" series where it is absent)
//	              Running      nv_trt_llm_request_metrics{request_type="scheduled"} (TensorRT-LLM backend)
//	              KVCacheUsage nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}
//	                           (used / max blocks: derived so from "used" and "max" where it is absent,
//	                           as in backends of the Triton 23.11 era)
//	              GPUUtil, GPUPower   nv_gpu_utilization, nv_gpu_power_usage (highest GPU)
//	              GPUMemUsed, GPUMemTotal  nv_gpu_memory_used_bytes, nv_gpu_memory_total_bytes
//	                           (the GPU with the highest used/total)
//	              KVCachePreallocated  1 when the exposition shows the TensorRT-LLM backend
//	                           (any nv_trt_llm_* metric) or the vLLM backend (any vllm:*
//	                           metric), which reserve their KV cache at start; their GPU
//	                           memory is then no load (Triton's other backends allocate
//	                           as they go)
//	Triton with   Triton's vLLM backend exports vLLM's vllm:* metrics beside Triton's nv_*
//	the vLLM      ones. Both are read, none twice: Running, KVCacheUsage, PrefixCacheHitRate
//	backend       and the LoRA reading come from vllm:* as for vLLM (added to, or the
//	              fuller of, a TensorRT-LLM model's beside it); Waiting is vLLM's waiting
//	              plus Triton's pending count (requests Triton has not yet handed to the
//	              backend: a separate queue ahead of vLLM's); the GPU fields come from
//	              Triton's nv_gpu_* alone (vLLM exports none). Result.Engine is Triton.
//	              The backend's current version exports vLLM's counters and histograms
//	              only, no gauge: then Triton's fields are read, with KVCachePreallocated.
//	TEI           Waiting      te_queue_size (inputs queued for a batch: a batch request's
//	                           inputs count one each). TEI exports no running count, and
//	                           its encoder models keep no KV cache: nothing else is read
//	llama.cpp     Running      llamacpp:requests_processing (slots processing a request)
//	              Waiting      llamacpp:requests_deferred (requests deferred until a slot frees)
//	              KVCacheUsage llamacpp:kv_cache_usage_ratio (KV cells used / context size;
//	                           older builds only, newer ones export no KV usage)
//	              KVCachePreallocated  1 (llama-server allocates its KV cache, all of
//	                           --ctx-size, when it starts)
//
// A vLLM server put to sleep (POST /sleep) serves nothing until it is
// woken (POST /wake_up), yet reports no load while it sleeps: Asleep says
// so. vLLM puts its data-parallel engines to sleep and wakes them
// together, so engines that disagree are a scrape caught mid-way: the
// server reads as asleep only when every engine does, as one awake engine
// can serve. Servers without sleep mode export no such series (nor do
// releases of late 2025 without VLLM_SERVER_DEV_MODE=1), and their
// samples carry no Asleep.
//
// A namespace separator may be ':' or '_' (vllm:x or vllm_x). Series of one
// metric are aggregated across their labels (model, vLLM's data-parallel
// engine, SGLang's ranks): request counts are summed over separate batches;
// usage takes the maximum, because the fullest rank is the one that evicts
// or queues first; hit rates take the mean. SGLang's series per tp_rank,
// pp_rank and moe_ep_rank are one scheduler's state reported by several
// processes (all TP ranks export with --enable-metrics-for-all-schedulers,
// and PP stages schedule the same requests), so its counts take the largest
// of those replicas and sum over data-parallel ranks (dp_rank) only; with
// priority scheduling they read the total (priority="") and skip the
// per-priority breakdown. vLLM's
// prefix-cache hit rate is hits over queries since the server started: one
// scrape cannot see a recent rate.
//
// Only the series of the metrics above are parsed into objects (of
// vllm:lora_requests_info, only the latest label set's), and at most
// 8192 of them: the rest of an exposition (histograms, other engines'
// metrics, a wrong URL's million series) costs a scan of its names, which
// also tells the engine. Malformed lines of those metrics and series past
// the limit are skipped, and values out of range (a negative count, a
// fraction above 1) and repeats of a series (same name, in either spelling,
// and labels: the first counts) are dropped; either makes the error wrap
// telemetry.ErrPartial while the Result keeps what was read. A field read
// as the sum or the largest of several series (data-parallel engines, each
// SGLang dp_rank's batch, Triton's queue ahead of its backend) is withheld,
// not read from the rest, when one of them is dropped: the rest would
// understate the server's load and draw calls to it; an unknown field does
// not (a hit rate, a mean, is read from the rest). An exposition
// with no metric of a known engine returns ErrUnknownEngine; one with none of
// the load metrics above, or whose every value of them was dropped, returns
// an error saying which and an empty Sample. Parse never panics.
//
// Parse sees no Content-Type, so it reads an OpenMetrics exposition cut
// short before its closing "# EOF" line as a text one, as far as it goes;
// Source's scrapes reject a body served as OpenMetrics without that line.
//
// Sample.Time is left zero, for the caller to stamp, unless every sample of
// the metrics above carries a timestamp, as a Prometheus federation
// endpoint's or a caching sidecar's do: then it is the oldest of those,
// when the values were measured rather than when they were served. It may
// lie in the future of the caller's clock, which a telemetry.Poller reads as
// its now.
func Parse(r io.Reader) (Result, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Result{}, fmt.Errorf("modelserver: reading exposition: %w", err)
	}
	return parseBytes(data)
}

func parseBytes(data []byte) (Result, error) {
	data = latestLoRA(data)
	// Only the metrics an extractor reads become objects; the engine is
	// told from every name on the way.
	var seen engines
	trtBackend := false // Triton's TensorRT-LLM backend: nv_trt_llm_* metrics
	fams, skipped, perr := promtext.ParseSelected(data, func(name []byte) bool {
		var buf [128]byte
		key := indexName(buf[:0], name)
		seen.add(key)
		trtBackend = trtBackend || bytes.HasPrefix(key, []byte("nv_trt_llm_"))
		return read[string(key)]
	})
	m, dups := index(fams)
	res := Result{Engine: seen.first()}
	if res.Engine == Unknown {
		if perr != nil {
			return res, fmt.Errorf("%w (%d exposition lines skipped: %v)", ErrUnknownEngine, skipped, perr)
		}
		return res, ErrUnknownEngine
	}
	x := extractor{m: m, dups: dups}
	extractors[res.Engine](&x)
	res.Sample = x.s
	if !res.Sample.Empty() && preallocates(res.Engine, seen, trtBackend) {
		// Only next to a load reading: alone it would hide that the
		// exposition had none (the errors below).
		res.Sample.Set(telemetry.KVCachePreallocated, 1)
	}
	if at, ok := promtext.MeasuredAt(fams); ok && !res.Sample.Empty() {
		res.Sample.Time = at
	}
	switch {
	case res.Sample.Empty() && perr != nil && x.bad > 0:
		return res, fmt.Errorf("modelserver: %s exposition: no load metric readable (%d lines skipped: %v; %d values dropped (out of range or duplicate) (%s))", res.Engine, skipped, perr, x.bad, x.firstBad)
	case res.Sample.Empty() && perr != nil:
		return res, fmt.Errorf("modelserver: %s exposition: no load metric readable (%d lines skipped: %v)", res.Engine, skipped, perr)
	case res.Sample.Empty() && x.bad > 0:
		// The metrics are there: say what became of their values.
		return res, fmt.Errorf("modelserver: %s exposition: no load value usable: %d values dropped (out of range or duplicate) (%s)", res.Engine, x.bad, x.firstBad)
	case res.Sample.Empty():
		return res, fmt.Errorf("modelserver: %s exposition has none of the load metrics this package reads", res.Engine)
	case perr != nil && x.bad > 0:
		return res, fmt.Errorf("%w: modelserver: %s exposition partly read (%d lines skipped: %v); %d values dropped (out of range or duplicate) (%s)", telemetry.ErrPartial, res.Engine, skipped, perr, x.bad, x.firstBad)
	case perr != nil:
		return res, fmt.Errorf("%w: modelserver: %s exposition partly read (%d lines skipped): %v", telemetry.ErrPartial, res.Engine, skipped, perr)
	case x.bad > 0:
		return res, fmt.Errorf("%w: modelserver: %s exposition: %d values dropped (out of range or duplicate) (%s)", telemetry.ErrPartial, res.Engine, x.bad, x.firstBad)
	}
	return res, nil
}

// preallocates reports whether a server of engine e, whose exposition
// showed the engines of seen (and, when trtBackend, Triton's TensorRT-LLM
// backend), reserves its KV cache at start yet may report no KV-cache
// usage: TGI, which reserves it at warmup (--cuda-memory-fraction, 1 by
// default) and exports only its queue and batch, and Triton running the
// vLLM backend (whose current version exports vLLM's counters and
// histograms, no KV gauge, while vLLM reserves gpu_memory_utilization of
// the GPU) or the TensorRT-LLM backend (kv_cache_free_gpu_mem_fraction).
// Their GPU memory, read beside them from DCGM, is their configuration, not
// their load (telemetry.KVCachePreallocated). So is llama.cpp's
// llama-server, which allocates its whole KV cache (--ctx-size cells) when
// it creates its context, and whose newer builds report no usage of it.
// Triton's other backends allocate as they go. vLLM, SGLang and
// trtllm-serve report their KV-cache usage, which says as much. TEI serves
// encoder models, which keep no KV cache: it is not marked.
func preallocates(e Engine, seen engines, trtBackend bool) bool {
	switch e {
	case TGI, LlamaCpp:
		return true
	case Triton:
		return seen&(1<<VLLM) != 0 || trtBackend
	}
	return false
}

// latestLoRA returns data with the sample lines of vllm:lora_requests_info
// (either spelling) cut to the one with the largest value: the latest label
// set, the only one loraInfo reads. vLLM never drops a label set (each
// stays with the time it was last set), so a long-running multi-LoRA
// server exports thousands, and read whole they ran past the parser's
// bound, which dropped the newest and left an old state read. A line whose
// value is not a finite number is kept, for loraInfo to count, and so is a
// last line without a line feed, for the parser to count. So is a line
// the parser cannot read (its labels malformed), whatever its value: it is
// not the latest, which is the largest that the parser reads; cut to it,
// the others were lost with it. data itself is returned when there is
// nothing to cut.
func latestLoRA(data []byte) []byte {
	const name = "vllm_lora_requests_info" // index form
	tail := []byte("lora_requests_info")
	if !bytes.Contains(data, tail) {
		return data
	}
	isLoRA := func(line []byte) (latest bool, v float64, is bool) {
		if !bytes.Contains(line, tail) {
			return false, 0, false
		}
		n, v, ok := promtext.SampleValue(line)
		if len(n) != len(name) || string(indexName(nil, n)) != name {
			return false, 0, false
		}
		terminated := line[len(line)-1] == '\n'
		return ok && terminated && !math.IsNaN(v) && !math.IsInf(v, 0), v, true
	}
	type candidate struct {
		off, n int
		v      float64
	}
	var cands []candidate
	lines, off := 0, 0
	for line := range bytes.Lines(data) {
		if latest, v, is := isLoRA(line); is {
			lines++
			if latest {
				cands = append(cands, candidate{off, len(line), v})
			}
		}
		off += len(line)
	}
	if lines <= 1 || len(cands) == 0 {
		return data
	}
	// Latest first; of equal times the first written, as the parser's
	// reading keeps it. The lines tried before the one the parser reads
	// stay, for it to count.
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.v, a.v) })
	keep := len(cands)
	for i, c := range cands {
		if parsesAs(data[c.off:c.off+c.n], c.v) {
			keep = i + 1
			break
		}
	}
	if keep == len(cands) {
		return data // none to cut
	}
	kept := make([]int, keep)
	for i, c := range cands[:keep] {
		kept[i] = c.off
	}
	slices.Sort(kept)
	out := make([]byte, 0, len(data))
	off = 0
	for line := range bytes.Lines(data) {
		if latest, _, is := isLoRA(line); !is || !latest || len(kept) > 0 && kept[0] == off {
			if is && latest {
				kept = kept[1:]
			}
			out = append(out, line...)
		}
		off += len(line)
	}
	return out
}

// parsesAs reports whether the parser reads line, a sample line, as one
// sample of value v: SampleValue checks no label set.
func parsesAs(line []byte, v float64) bool {
	fams, skipped, _ := promtext.Parse(line)
	n, same := 0, false
	for _, f := range fams {
		for _, m := range f.Metric {
			n++
			same = promtext.RawValue(m) == v
		}
	}
	return skipped == 0 && n == 1 && same
}

// metrics indexes gauge, counter and untyped families by name, with a
// namespace's ':' turned into '_' ("vllm:x" and "vllm_x" are one metric:
// collectors and OpenTelemetry pipelines rewrite the colon). Histograms and
// summaries carry no load gauge and are left out.
type metrics map[string][]*dto.Metric

// index builds the metrics of fams. A series whose name (either spelling)
// and labels repeat one already indexed is one reading exported twice, not
// another batch: summed, it would double the count. It is left out and
// counted in dups under its index name, keeping the first as Prometheus does
// (names are taken in sorted order, so the colon spelling wins and the
// choice is stable).
func index(fams promtext.Families) (m metrics, dups map[string]int) {
	names := make([]string, 0, len(fams))
	for name := range fams {
		names = append(names, name)
	}
	slices.Sort(names)
	m = make(metrics, len(fams))
	seen := map[string]bool{}
	for _, name := range names {
		f := fams[name]
		switch f.GetType() {
		case dto.MetricType_GAUGE, dto.MetricType_COUNTER, dto.MetricType_UNTYPED:
			key := strings.Replace(name, ":", "_", 1)
			for _, s := range f.Metric {
				id := key + "\xfd" + groupKey(s, nil)
				if seen[id] {
					if dups == nil {
						dups = map[string]int{}
					}
					dups[key]++
					continue
				}
				seen[id] = true
				m[key] = append(m[key], s)
			}
		}
	}
	return m, dups
}

// indexName appends name's index form (see metrics) to dst.
func indexName(dst, name []byte) []byte {
	dst = append(dst, name...)
	if i := bytes.IndexByte(dst, ':'); i >= 0 {
		dst[i] = '_'
	}
	return dst
}

// engines is a set of Engines, one bit each (room for 16).
type engines uint16

// prefixes name each engine's namespace, in index form, in the order
// engines are checked (a Triton server running the TensorRT-LLM backend is
// Triton).
var prefixes = [...]struct {
	e Engine
	p string
}{{VLLM, "vllm_"}, {SGLang, "sglang_"}, {TensorRTLLM, "trtllm_"}, {TGI, "tgi_"}, {Triton, "nv_"}, {TEI, "te_"}, {LlamaCpp, "llamacpp_"}}

// add adds the engine whose namespace name (in index form) is in.
func (s *engines) add(name []byte) {
	for _, pr := range prefixes {
		if bytes.HasPrefix(name, []byte(pr.p)) {
			*s |= 1 << pr.e
			return
		}
	}
}

// first returns the first engine of the set in prefixes' order, but for
// Triton next to vLLM: that is Triton running the vLLM backend, which
// exports vLLM's metrics beside Triton's own (Triton's extractor reads both).
func (s engines) first() Engine {
	if s&(1<<VLLM) != 0 && s&(1<<Triton) != 0 {
		return Triton
	}
	for _, pr := range prefixes {
		if s&(1<<pr.e) != 0 {
			return pr.e
		}
	}
	return Unknown
}
