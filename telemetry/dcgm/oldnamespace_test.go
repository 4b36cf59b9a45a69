package dcgm_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// dcgm-exporter run with --use-old-namespace (its 1.x label names) writes
// uuid for UUID and names a GPU's pod pod_name, pod_namespace and
// container_name (NVIDIA/dcgm-exporter, oldPodAttribute and its
// neighbours). ByPod must find the pod under those names too, and a GPU
// time-sliced between two pods must stay two records, as with the
// current names.
func TestParseOldNamespacePodLabels(t *testing.T) {
	const expo = `# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-0",device="nvidia0",Hostname="node-c",container_name="vllm",pod_namespace="ml",pod_name="vllm-0"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-0",device="nvidia0",Hostname="node-c",container_name="vllm",pod_namespace="ml",pod_name="vllm-1"} 35
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.NoError(t, err)
	require.Len(t, gpus, 2, "one record per pod sharing the GPU")
	for i, g := range gpus {
		assert.Equal(t, "GPU-0", g.UUID)
		assert.Equal(t, "ml", g.Namespace)
		assert.Equal(t, "vllm", g.Container)
		assert.Equal(t, []string{"vllm-0", "vllm-1"}[i], g.Pod)
	}
	obs := dcgm.Aggregate(gpus, dcgm.ByPod(map[string]dcgm.Pod{"10.0.0.1:8000": {Namespace: "ml", Name: "vllm-1"}}))
	require.Len(t, obs, 1)
	assert.Equal(t, "10.0.0.1:8000", obs[0].EndpointID)
	assert.Equal(t, map[string]float64{"gpu_util": 0.35}, fields(obs[0].Sample))
}
