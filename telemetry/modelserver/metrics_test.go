package modelserver_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file    string
		engine  modelserver.Engine
		want    map[string]float64
		partial bool
		err     string // a non-partial error containing this
	}{
		{file: "vllm-design-doc-sample.txt", engine: modelserver.VLLM, want: map[string]float64{"running": 8}},
		{
			file:   "vllm-v1-two-engines.txt",
			engine: modelserver.VLLM,
			// counts summed over engines, usage the fuller engine, hit rate 2000/4000
			want: map[string]float64{"running": 14, "waiting": 4, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5},
		},
		{
			// What vLLM answers a scraper that asks for OpenMetrics (we do not).
			file:   "vllm-v1-two-engines-openmetrics.txt",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 14, "waiting": 4, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5},
		},
		{
			// --enable-lora --max-loras 2: the LoRA state is the label set
			// set last (the largest value), not the last line.
			file:   "vllm-lora.txt",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 5, "waiting": 2, "kv_cache_usage": 0.31, "lora_slots": 2},
		},
		{
			file:   "vllm-older-names.txt",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 2, "waiting": 0, "kv_cache_usage": 0.125, "prefix_cache_hit_rate": 0.25},
		},
		{
			file:   "sglang-docs-production-metrics-legacy.txt",
			engine: modelserver.SGLang,
			want:   map[string]float64{"running": 162, "waiting": 2826, "kv_cache_usage": 0.28, "prefix_cache_hit_rate": 0.007507552643049313},
		},
		{
			// PP stages schedule the same requests in the same order: their
			// counts are one scheduler's state seen twice, not two batches.
			file:   "sglang-tp-pp-ranks.txt",
			engine: modelserver.SGLang,
			want:   map[string]float64{"running": 12, "waiting": 4, "kv_cache_usage": 0.74, "prefix_cache_hit_rate": 0.4},
		},
		{
			// --enable-metrics-for-all-schedulers: every TP rank of one
			// engine reports the same batch.
			file:   "sglang-tp-all-schedulers.txt",
			engine: modelserver.SGLang,
			want:   map[string]float64{"running": 6, "waiting": 2, "kv_cache_usage": 0.41, "prefix_cache_hit_rate": 0.25},
		},
		{
			// DP attention: dp_rank 0 and 1 are separate batches (summed),
			// each reported by its two TP ranks (counted once).
			file:   "sglang-dp-attention.txt",
			engine: modelserver.SGLang,
			want:   map[string]float64{"running": 12, "waiting": 4, "kv_cache_usage": 0.55},
		},
		{
			// --enable-priority-scheduling: the total is priority="", the
			// breakdown per priority must not be added to it.
			file:   "sglang-priority.txt",
			engine: modelserver.SGLang,
			want:   map[string]float64{"running": 9, "waiting": 4, "kv_cache_usage": 0.62},
		},
		{
			file:   "trtllm-serve.txt",
			engine: modelserver.TensorRTLLM,
			want:   map[string]float64{"running": 5, "waiting": 2, "kv_cache_usage": 0.62, "prefix_cache_hit_rate": 0.4},
		},
		{file: "tgi.txt", engine: modelserver.TGI, want: map[string]float64{"running": 5, "waiting": 3, "kv_cache_preallocated": 1}},
		{
			// TEI's one gauge is its queue, of inputs; it has no running
			// count and no KV cache.
			file:   "tei.txt",
			engine: modelserver.TEI,
			want:   map[string]float64{"waiting": 12},
		},
		{
			// A llama-server build that still exported its KV-cache usage
			// (used cells / context size).
			file:   "llamacpp-kv-cache-ratio.txt",
			engine: modelserver.LlamaCpp,
			want:   map[string]float64{"running": 4, "waiting": 3, "kv_cache_usage": 0.637238, "kv_cache_preallocated": 1},
		},
		{
			// Newer builds export no KV-cache usage; the cache is still
			// allocated whole at start.
			file:   "llamacpp.txt",
			engine: modelserver.LlamaCpp,
			want:   map[string]float64{"running": 2, "waiting": 0, "kv_cache_preallocated": 1},
		},
		{
			file:   "triton-trtllm-backend.txt",
			engine: modelserver.Triton,
			want:   map[string]float64{"running": 7, "waiting": 2, "kv_cache_usage": 0.3, "kv_cache_preallocated": 1},
		},
		{
			// Triton's pending count ends when the backend's execute takes a
			// request; the TensorRT-LLM executor queues it after that.
			file:   "triton-trtllm-ensemble.txt",
			engine: modelserver.Triton,
			want:   map[string]float64{"running": 8, "waiting": 9, "kv_cache_usage": 0.4875, "kv_cache_preallocated": 1},
		},
		{
			// The doc's histogram lines parse (expfmt reads them as buckets)
			// but carry no load gauge: recognized, nothing to route on.
			file:   "triton-docs-metrics-examples.txt",
			engine: modelserver.Triton,
			err:    "modelserver: triton exposition has none of the load metrics",
		},
		{
			// expfmt rejects the second HELP line and the truncated last line;
			// the line-by-line fallback keeps every readable gauge.
			file:   "triton-merged-truncated.txt",
			engine: modelserver.Triton,
			want: map[string]float64{
				"waiting": 5, "gpu_util": 0.5, "gpu_power_w": 250.5,
				"gpu_mem_used_bytes": 77309411328, "gpu_mem_total_bytes": 85899345920, // GPU-bbbb, the fuller one
			},
			partial: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			res, err := modelserver.Parse(bytes.NewReader(readFile(t, tt.file)))
			assert.True(t, res.Sample.Time.IsZero(), "parsers leave Time to the caller")
			partial := ""
			if tt.partial {
				partial = "1 lines skipped"
			}
			checkParse(t, res, err, tt.engine, tt.err, partial, tt.want)
			if tt.err != "" {
				return
			}
			// ParseMetrics is Parse without the engine.
			s, err2 := modelserver.ParseMetrics(bytes.NewReader(readFile(t, tt.file)))
			assert.Equal(t, res.Sample, s)
			assert.Equal(t, err == nil, err2 == nil)
		})
	}
}

func TestParseInlineCases(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		engine  modelserver.Engine
		want    map[string]float64
		partial bool
		err     error
	}{
		{
			name:   "underscore namespace from a rewriting collector",
			in:     "vllm_num_requests_waiting 4\nvllm_kv_cache_usage_perc 0.5\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"waiting": 4, "kv_cache_usage": 0.5},
		},
		{
			name: "vLLM 0.8-0.10 prefix cache counters (gpu_ prefix)",
			in: "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n" +
				"# TYPE vllm:gpu_prefix_cache_queries_total counter\nvllm:gpu_prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000.0\n" +
				"# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 250.0\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 2, "prefix_cache_hit_rate": 0.25},
		},
		{
			name:   "vLLM V0 prefix-cache hit-rate gauge",
			in:     "vllm:num_requests_running 1\nvllm:gpu_prefix_cache_hit_rate 0.3\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 1, "prefix_cache_hit_rate": 0.3},
		},
		{
			// V0 without prefix caching (its default) exports the gauge at
			// -1, its "disabled" (vllm/core/block/interfaces.py,
			// get_prefix_cache_hit_rate): no reading, and no fault of the
			// exposition, so not a partial round on every scrape.
			name:   "vLLM V0 prefix-cache hit-rate gauge at -1: caching off",
			in:     "vllm:num_requests_running 1\nvllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} -1.0\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 1},
		},
		{
			name:    "out-of-range values are dropped, the rest kept",
			in:      "vllm:num_requests_waiting -3\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 87\n",
			engine:  modelserver.VLLM,
			want:    map[string]float64{"running": 2},
			partial: true,
		},
		{
			name:   "NaN is absent, not an error",
			in:     "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 1},
			// NaN fails the range check: counted as dropped.
			partial: true,
		},
		{
			name:   "no queries yet: hit rate unknown, not zero",
			in:     "vllm:num_requests_running 1\nvllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 1},
		},
		{
			// One engine's counter unreadable: summing it as 0 read 5/20
			// for a server at 5/10, with nothing said.
			name: "a hit-rate counter that is not a number drops the rate and counts",
			in: "vllm:num_requests_running 1\n" +
				"vllm:prefix_cache_hits_total{engine=\"0\"} 5\nvllm:prefix_cache_hits_total{engine=\"1\"} NaN\n" +
				"vllm:prefix_cache_queries_total{engine=\"0\"} 10\nvllm:prefix_cache_queries_total{engine=\"1\"} 10\n",
			engine:  modelserver.VLLM,
			want:    map[string]float64{"running": 1},
			partial: true,
		},
		{
			name: "a negative hit-rate counter drops the rate and counts",
			in: "vllm:num_requests_running 1\n" +
				"vllm:prefix_cache_hits_total{engine=\"0\"} 5\nvllm:prefix_cache_hits_total{engine=\"1\"} 0\n" +
				"vllm:prefix_cache_queries_total{engine=\"0\"} 10\nvllm:prefix_cache_queries_total{engine=\"1\"} -4\n",
			engine:  modelserver.VLLM,
			want:    map[string]float64{"running": 1},
			partial: true,
		},
		{
			// nv_* next to vllm:* is Triton running the vLLM backend: both
			// are read (see TestParseTritonWithVLLMBackend).
			name:   "engine order: nv_ next to vllm is Triton's vLLM backend",
			in:     "nv_gpu_utilization{gpu_uuid=\"x\"} 0.1\nvllm:num_requests_running 3\n",
			engine: modelserver.Triton,
			want:   map[string]float64{"running": 3, "gpu_util": 0.1, "kv_cache_preallocated": 1},
		},
		{
			// A series repeated is one reading exported twice (Prometheus
			// keeps the first and counts the duplicate), not two batches.
			name: "duplicate series count once",
			in: "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 5\n" +
				"vllm:num_requests_running{model_name=\"m\"} 5\nvllm:num_requests_waiting 1\n",
			engine:  modelserver.VLLM,
			want:    map[string]float64{"running": 5, "waiting": 1},
			partial: true,
		},
		{
			// The colon and underscore spellings are one metric: both in one
			// exposition are one reading twice, and the colon one is kept.
			name:    "both namespace spellings of one series count once",
			in:      "vllm_num_requests_running 6\nvllm:num_requests_running 5\n",
			engine:  modelserver.VLLM,
			want:    map[string]float64{"running": 5},
			partial: true,
		},
		{
			name:   "a repeated series of a metric not read is no fault",
			in:     "vllm:num_requests_running 2\nvllm:num_preemptions_total 1\nvllm:num_preemptions_total 1\n",
			engine: modelserver.VLLM,
			want:   map[string]float64{"running": 2},
		},
		{name: "unknown engine", in: "process_cpu_seconds_total 12\n", err: modelserver.ErrUnknownEngine},
		{name: "empty body", in: "", err: modelserver.ErrUnknownEngine},
		{name: "garbage", in: "{{{ not metrics\n\x00\xff", err: modelserver.ErrUnknownEngine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := modelserver.Parse(strings.NewReader(tt.in))
			assert.Equal(t, tt.engine, res.Engine)
			switch {
			case tt.err != nil:
				require.ErrorIs(t, err, tt.err)
				return
			case tt.partial:
				require.ErrorIs(t, err, telemetry.ErrPartial)
			default:
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, fields(res.Sample))
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestParseReadError(t *testing.T) {
	_, err := modelserver.ParseMetrics(failingReader{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "modelserver: reading exposition: connection reset")
}

func TestEngineString(t *testing.T) {
	assert.Equal(t, "vllm", modelserver.VLLM.String())
	assert.Equal(t, "tensorrt-llm", modelserver.TensorRTLLM.String())
	assert.Equal(t, "Engine(99)", modelserver.Engine(99).String())
}

func FuzzParseMetrics(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	require.NoError(f, err)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".txt") {
			f.Add(readFile(f, e.Name()))
		}
	}
	f.Add([]byte("vllm:num_requests_running{a=\"b\"} 1 2 3\n# TYPE x histogram\nx{le=\"+Inf\"} 1\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		res, err := modelserver.Parse(bytes.NewReader(in))
		if err == nil && res.Sample.Empty() {
			t.Fatal("success must carry a field")
		}
		if err != nil && !errors.Is(err, telemetry.ErrPartial) && !res.Sample.Empty() {
			t.Fatalf("a failure must not return fields: %v", err)
		}
		for _, f := range []telemetry.Field{telemetry.KVCacheUsage, telemetry.PrefixCacheHitRate, telemetry.GPUUtil} {
			if v, ok := res.Sample.Get(f); ok && (v < 0 || v > 1) {
				t.Fatalf("%s = %v out of 0..1", f, v)
			}
		}
		for _, f := range []telemetry.Field{telemetry.Running, telemetry.Waiting} {
			if v, ok := res.Sample.Get(f); ok && v < 0 {
				t.Fatalf("%s = %v negative", f, v)
			}
		}
		slots, ok := res.Sample.Get(telemetry.LoRASlots)
		a := res.Sample.Adapters
		if ok != (a != nil) {
			t.Fatalf("lora_slots %v (%v) with adapters %+v: one without the other", slots, ok, a)
		}
		if a != nil {
			if slots < 1 || a.Base == "" || len(a.Running) > telemetry.MaxAdapterNames || len(a.Waiting) > telemetry.MaxAdapterNames {
				t.Fatalf("lora_slots %v, adapters %+v", slots, a)
			}
			for _, n := range append(slices.Clone(a.Running), a.Waiting...) {
				if n == "" || strings.Contains(n, ",") || len(n) > telemetry.MaxAdapterNameLen {
					t.Fatalf("adapter name %q", n)
				}
			}
		}
	})
}

// vLLM 0.9-0.10 export a renamed metric under both names. A malformed value
// under the new name is dropped and counted, and must not hide the good one
// the old name carries: before, the first name present was taken whatever
// its values, and the NaN left the sample without KV-cache usage (and
// without a prefix-cache hit rate).
func TestParseFallsBackPastAMalformedNewName(t *testing.T) {
	res, err := modelserver.Parse(bytes.NewReader(readFile(t, "vllm-both-names-new-nan.txt")))
	require.ErrorIs(t, err, telemetry.ErrPartial, "the NaNs are dropped and counted")
	assert.Equal(t, modelserver.VLLM, res.Engine)
	assert.Equal(t, map[string]float64{
		"running": 3, "waiting": 1, "kv_cache_usage": 0.62, "prefix_cache_hit_rate": 0.4,
	}, fields(res.Sample))

	t.Run("a good new name still wins", func(t *testing.T) {
		res, err := modelserver.Parse(strings.NewReader(
			"vllm:kv_cache_usage_perc 0.3\nvllm:gpu_cache_usage_perc 0.9\n"))
		require.NoError(t, err)
		assert.Equal(t, map[string]float64{"kv_cache_usage": 0.3}, fields(res.Sample))
	})
	t.Run("both malformed", func(t *testing.T) {
		res, err := modelserver.Parse(strings.NewReader(
			"vllm:num_requests_running 1\nvllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 7\n"))
		require.ErrorIs(t, err, telemetry.ErrPartial)
		assert.Contains(t, err.Error(), "2 values dropped")
		assert.Equal(t, map[string]float64{"running": 1}, fields(res.Sample))
	})
}

// An exposition whose load metrics are all there but whose every value is
// dropped (out of range, malformed) has the metrics: the error says what
// became of their values, naming the first as it was exported, instead of
// sending the operator to look for metrics that are present.
func TestParseErrorWhenEveryLoadValueIsDropped(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"out of range", "vllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 87\n", []string{"2 values dropped", "waiting=-3"}},
		{"not numbers", "vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n", []string{"2 values dropped", "running=NaN"}},
		{"duplicates of a bad value", "sglang:token_usage 1.5\nsglang:token_usage 1.5\n", []string{"2 values dropped", "duplicate"}},
		// A count no server reaches: a counter read as a gauge would price
		// its endpoint out of rotation.
		{"implausible counts", "vllm:num_requests_running 1e+15\nvllm:num_requests_waiting 2097152\n", []string{"2 values dropped", "running=1e+15"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := modelserver.Parse(strings.NewReader(tt.in))
			require.Error(t, err)
			assert.NotErrorIs(t, err, telemetry.ErrPartial, "nothing was read")
			assert.NotContains(t, err.Error(), "none of the load metrics")
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.True(t, res.Sample.Empty())
		})
	}
}

// Counts that each pass but add up past telemetry.MaxRequests (a broken
// exporter's engines, each a counter read as a gauge) are no count: the
// field is dropped and counted, as one such value is, not left out with
// nothing said (Sample.Set refuses the sum).
func TestParseCountsASumAboveMaxRequestsAsDropped(t *testing.T) {
	for _, in := range []string{
		"vllm:num_requests_running{engine=\"0\"} 600000\nvllm:num_requests_running{engine=\"1\"} 600000\nvllm:num_requests_waiting 3\n",
		"sglang:num_running_reqs 3\nsglang:num_queue_reqs 600000\nsglang:num_decode_transfer_queue_reqs 600000\n",
		"trtllm_num_requests_running{a=\"1\"} 600000\ntrtllm_num_requests_running{a=\"2\"} 600000\ntrtllm_num_requests_waiting 3\n",
	} {
		res, err := modelserver.Parse(strings.NewReader(in))
		require.ErrorIs(t, err, telemetry.ErrPartial, in)
		assert.Contains(t, err.Error(), "1 values dropped", in)
		assert.Contains(t, err.Error(), "=1.2e+06", in)
		assert.Len(t, fields(res.Sample), 1, "%s: the plausible count is kept", in)
	}
}
