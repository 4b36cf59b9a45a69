package dcgm_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// dcgm-exporter 1.x names its metrics dcgm_fb_used, dcgm_gpu_utilization
// and so on, with the pod_name, pod_namespace and container_name labels
// the package read already; ParseMetrics knew only the DCGM_FI_* names and
// returned ErrNoGPUs, as for a wrong URL, so such a fleet had no GPU
// telemetry. The same fields, in the same units, are read now.
func TestParseExporter1xNames(t *testing.T) {
	gpus := parseFile(t, "dcgm-exporter-1x-pods.txt")
	require.Len(t, gpus, 2)
	g := gpus[1]
	assert.Equal(t, "GPU-9567a9e7-341e-bb7e-fcf5-788d8caa50f9", g.UUID)
	assert.Equal(t, []string{"ml", "vllm-0", "vllm"}, []string{g.Namespace, g.Pod, g.Container})
	assert.Equal(t, map[string]float64{
		"gpu_mem_used_bytes": 31010 * mib, "gpu_mem_total_bytes": 32510 * mib,
		"gpu_util": 0.85, "gpu_temp_c": 34, "gpu_power_w": 240.5,
	}, fields(g.Sample()))

	obs := dcgm.Aggregate(gpus, dcgm.ByPod(map[string]dcgm.Pod{"10.0.0.1:8000": {Namespace: "ml", Name: "vllm-0"}}))
	require.Len(t, obs, 1)
	assert.Equal(t, fields(g.Sample()), fields(obs[0].Sample), "the fuller GPU of the two")
}

// Where an exposition has a field under both names (a relabelled or
// merged one), the current name counts, whichever comes first, and the
// other is not a rival reading; a value dropped under one name does not
// make the GPU's memory unreadable when the other name gives it.
func TestParseCurrentNameWinsOver1x(t *testing.T) {
	const expo = `dcgm_fb_used{gpu="0",uuid="GPU-0"} 100
dcgm_fb_free{gpu="0",uuid="GPU-0"} 900
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0"} 700
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0"} NaN
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.Error(t, err, "the NaN is reported")
	require.Len(t, gpus, 1)
	assert.Equal(t, 700.0, gpus[0].FBUsedMiB)
	assert.Equal(t, 900.0, gpus[0].FBFreeMiB)
	assert.Zero(t, gpus[0].Dropped)
}
