package dcgm_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// Prometheus scraping dcgm-exporter through a ServiceMonitor without
// honorLabels keeps its own target labels pod, namespace and container
// (the exporter's pod) and renames the exporter's to exported_pod,
// exported_namespace and exported_container; its /federate endpoint
// serves them so. ByPod read pod and namespace, found the exporter's pod on
// every GPU and mapped none to its server: vllm-0 got no GPU reading.
func TestParseFederatedExportedPodLabels(t *testing.T) {
	const expo = `# TYPE DCGM_FI_DEV_FB_USED untyped
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",Hostname="node-a",container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x7k2p",exported_container="vllm",exported_namespace="ml",exported_pod="vllm-0",instance="10.0.1.7:9400",job="nvidia-dcgm-exporter"} 76000 1767225590250
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",Hostname="node-a",container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x7k2p",instance="10.0.1.7:9400",job="nvidia-dcgm-exporter"} 100 1767225590250
# TYPE DCGM_FI_DEV_FB_FREE untyped
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0",Hostname="node-a",container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x7k2p",exported_container="vllm",exported_namespace="ml",exported_pod="vllm-0",instance="10.0.1.7:9400",job="nvidia-dcgm-exporter"} 4000 1767225590250
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1",Hostname="node-a",container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x7k2p",instance="10.0.1.7:9400",job="nvidia-dcgm-exporter"} 79900 1767225590250
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.NoError(t, err)
	require.Len(t, gpus, 2)
	assert.Equal(t, []string{"ml", "vllm-0", "vllm"}, []string{gpus[0].Namespace, gpus[0].Pod, gpus[0].Container})
	assert.Equal(t, "nvidia-dcgm-exporter-x7k2p", gpus[1].Pod, "a GPU allocated to no pod keeps the target's labels")

	obs := dcgm.Aggregate(gpus, dcgm.ByPod(map[string]dcgm.Pod{
		"10.0.0.1:8000": {Namespace: "ml", Name: "vllm-0"},
	}))
	require.Len(t, obs, 1)
	assert.Equal(t, "10.0.0.1:8000", obs[0].EndpointID)
	assert.Equal(t, map[string]float64{"gpu_mem_used_bytes": 76000 * mib, "gpu_mem_total_bytes": 80000 * mib}, fields(obs[0].Sample))
}
