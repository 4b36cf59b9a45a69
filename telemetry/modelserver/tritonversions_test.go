package modelserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// Triton's TensorRT-LLM backend exported its KV-cache blocks as max, free,
// used and tokens_per, and its requests as active, max, scheduled and
// context, before it added the derived kv_cache_block_type="fraction"
// (used / max) and request_type="waiting" (active - scheduled) series
// (tensorrtllm_backend README "Triton Metrics" of the Triton 23.11 era;
// NVIDIA/TensorRT-LLM triton_backend model_instance_state.cc, WaitForStats,
// which derives both from those). A server of those versions still says
// how full its KV cache is and how many requests its executor holds
// unscheduled: Parse derives them as the newer backend does, rather than
// leave KV-cache usage out (the scorer then prices the GPU memory the
// backend preallocated, which says nothing about load) and count only
// Triton's own pending queue as waiting.
func TestParseTritonTRTLLMBackendBeforeDerivedSeries(t *testing.T) {
	const older = `# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 5
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1200
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 4800
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6000
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 2
`
	res, err := modelserver.Parse(strings.NewReader(older))
	require.NoError(t, err)
	assert.Equal(t, modelserver.Triton, res.Engine)
	assert.Equal(t, map[string]float64{"running": 3, "waiting": 2 + (5 - 3), "kv_cache_usage": 0.2, "kv_cache_preallocated": 1}, fields(res.Sample))

	// Where the backend exports the derived series, they are read, not
	// derived again: the fixture's fraction (0.3) is not its used/max.
	res, err = modelserver.Parse(strings.NewReader(string(readFile(t, "triton-trtllm-backend.txt"))))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"running": 7, "waiting": 2, "kv_cache_usage": 0.3, "kv_cache_preallocated": 1}, fields(res.Sample))
}
