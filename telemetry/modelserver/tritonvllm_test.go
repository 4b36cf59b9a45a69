package modelserver_test

import (
	"bytes"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// Triton running the vLLM backend serves Triton's own metrics (nv_*, its
// GPU gauges among them) and the backend's vllm:* gauges on one /metrics
// port (triton-inference-server/vllm_backend src/utils/metrics.py reports
// vLLM's scheduler state through Triton's custom-metrics API). Parse read
// such an exposition as plain vLLM: the GPU memory, utilization and power
// Triton reported were left out, and so were the requests Triton queued
// ahead of the backend. Both are read now, and none twice: the load comes
// from vLLM, the GPUs from Triton, and Triton's pending count (requests not
// yet handed to the backend) adds to vLLM's waiting queue.
func TestParseTritonWithVLLMBackend(t *testing.T) {
	gpus := map[string]float64{
		// the second GPU: 77803110400/85520809984 is the fuller one
		"gpu_mem_used_bytes": 77803110400, "gpu_mem_total_bytes": 85520809984,
		"gpu_util": 0.87, "gpu_power_w": 512.384,
		// the vLLM backend reserved its KV cache at start
		"kv_cache_preallocated": 1,
	}
	with := func(m map[string]float64) map[string]float64 {
		for k, v := range gpus {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		vllm string
		want map[string]float64
	}{
		{
			// vLLM's only gauge here is its batch: waiting is Triton's queue.
			vllm: "vllm-design-doc-sample.txt",
			want: with(map[string]float64{"running": 8, "waiting": 2}),
		},
		{
			// The names the vLLM backend exports (gpu_cache_usage_perc).
			vllm: "vllm-older-names.txt",
			want: with(map[string]float64{"running": 2, "waiting": 0 + 2, "kv_cache_usage": 0.125, "prefix_cache_hit_rate": 0.25}),
		},
		{
			vllm: "vllm-v1-two-engines.txt",
			want: with(map[string]float64{"running": 14, "waiting": 4 + 2, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.vllm, func(t *testing.T) {
			// Triton's doc exposition (verbatim), vLLM's, and Triton's
			// gauges: no metric family repeats, so this is one valid
			// exposition, as expfmt confirms.
			text := bytes.Join([][]byte{
				readFile(t, "triton-docs-metrics-examples.txt"),
				readFile(t, tt.vllm),
				readFile(t, "triton-gauges.txt"),
			}, nil)
			p := expfmt.NewTextParser(model.UTF8Validation)
			_, err := p.TextToMetricFamilies(bytes.NewReader(text))
			require.NoError(t, err, "the concatenation must be a valid exposition")

			res, err := modelserver.Parse(bytes.NewReader(text))
			require.NoError(t, err)
			assert.Equal(t, modelserver.Triton, res.Engine)
			assert.Equal(t, tt.want, fields(res.Sample))
		})
	}

	// Either alone reads as before.
	res, err := modelserver.Parse(bytes.NewReader(readFile(t, "vllm-v1-two-engines.txt")))
	require.NoError(t, err)
	assert.Equal(t, modelserver.VLLM, res.Engine)
	res, err = modelserver.Parse(bytes.NewReader(readFile(t, "triton-gauges.txt")))
	require.NoError(t, err)
	assert.Equal(t, modelserver.Triton, res.Engine)
	assert.Equal(t, map[string]float64{
		"waiting": 2, "gpu_mem_used_bytes": 77803110400, "gpu_mem_total_bytes": 85520809984,
		"gpu_util": 0.87, "gpu_power_w": 512.384,
	}, fields(res.Sample), "Triton alone: no backend that pre-allocates shows")
}
