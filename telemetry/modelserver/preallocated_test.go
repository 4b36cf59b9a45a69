package modelserver_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// TGI reserves its KV cache at warmup (--cuda-memory-fraction, 1 by
// default) and exports its queue and batch, no KV-cache usage; Triton's
// vLLM backend (its current version exports vLLM's counters and
// histograms, no gauge) runs a vLLM that reserved 0.9 of the GPU. Their GPU
// memory, at 0.93-0.99 whatever their load, is their configuration: read
// as load (telemetry.Sample.MemoryPressure), it priced a replica started at
// 0.97 at 14x and one at 0.95 at 5.8x, and steered traffic by how they
// started. Parse says they pre-allocate (KVCachePreallocated), so their
// memory never prices them.
func TestParseMarksServersThatPreallocate(t *testing.T) {
	const tgi = `# TYPE tgi_queue_size gauge
tgi_queue_size 1
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9874
# TYPE tgi_request_count counter
tgi_request_count 4210
`
	res, err := modelserver.Parse(strings.NewReader(tgi))
	require.NoError(t, err)
	assert.Equal(t, modelserver.TGI, res.Engine)
	assert.Equal(t, map[string]float64{"running": 12, "waiting": 1, "kv_cache_preallocated": 1}, fields(res.Sample))

	// Triton's vLLM backend as its current version exports vLLM's
	// statistics (vllm:* counters and histograms, labelled model and
	// version) beside Triton's own gauges.
	const vllmV1Backend = `# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model="vllm_model",version="1"} 182230
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model="vllm_model",version="1"} 401129
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{model="vllm_model",version="1",le="0.1"} 780
vllm:time_to_first_token_seconds_bucket{model="vllm_model",version="1",le="1"} 1190
vllm:time_to_first_token_seconds_bucket{model="vllm_model",version="1",le="+Inf"} 1203
vllm:time_to_first_token_seconds_sum{model="vllm_model",version="1"} 151.2
vllm:time_to_first_token_seconds_count{model="vllm_model",version="1"} 1203
`
	text := append([]byte(vllmV1Backend), readFile(t, "triton-gauges.txt")...)
	p := expfmt.NewTextParser(model.UTF8Validation)
	_, err = p.TextToMetricFamilies(bytes.NewReader(text))
	require.NoError(t, err, "the concatenation must be a valid exposition")
	res, err = modelserver.Parse(bytes.NewReader(text))
	require.NoError(t, err)
	assert.Equal(t, modelserver.Triton, res.Engine)
	assert.Equal(t, map[string]float64{
		"waiting": 2, "gpu_mem_used_bytes": 77803110400, "gpu_mem_total_bytes": 85520809984,
		"gpu_util": 0.87, "gpu_power_w": 512.384, "kv_cache_preallocated": 1,
	}, fields(res.Sample))
	_, ok := res.Sample.MemoryPressure()
	assert.False(t, ok, "Triton's vLLM backend priced by the GPU memory vLLM reserved")

	// Triton without a backend that pre-allocates (its Python, ONNX,
	// PyTorch backends allocate as they go): its memory is load.
	res, err = modelserver.Parse(bytes.NewReader(readFile(t, "triton-gauges.txt")))
	require.NoError(t, err)
	assert.False(t, res.Sample.Has.Has(telemetry.KVCachePreallocated))
	u, ok := res.Sample.MemoryPressure()
	assert.True(t, ok)
	assert.InDelta(t, 77803110400.0/85520809984, u, 1e-12)

	// vLLM and SGLang say how full their KV cache is, which says as much.
	for _, file := range []string{"vllm-v1-two-engines.txt", "sglang-tp-pp-ranks.txt"} {
		res, err = modelserver.Parse(bytes.NewReader(readFile(t, file)))
		require.NoError(t, err, file)
		assert.False(t, res.Sample.Has.Has(telemetry.KVCachePreallocated), file)
	}

	// Alone, the mark is no reading: a TGI exposition without its load
	// gauges still says so, with an empty Sample.
	res, err = modelserver.Parse(strings.NewReader("# TYPE tgi_request_count counter\ntgi_request_count 4210\n"))
	require.ErrorContains(t, err, "tgi exposition has none of the load metrics")
	assert.Equal(t, modelserver.TGI, res.Engine)
	assert.True(t, res.Sample.Empty())
}
