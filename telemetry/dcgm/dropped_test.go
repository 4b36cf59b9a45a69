package dcgm_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// A tensor-parallel server on two GPUs runs out of memory when its fuller
// GPU does. When that GPU's memory figure was dropped (NaN, negative),
// the worst-GPU fold read the other GPU alone: 2x1 below, half full, so the
// server read as having room it did not have. It now reads no GPU memory
// (the Store keeps its last reading until that ages out), as it does when
// one GPU exports FB_USED without FB_FREE; its other fields stay. An
// endpoint with nothing else to report gets no observation.
func TestAggregateWithholdsMemoryWhenAGPUOfTheEndpointIsUnreadable(t *testing.T) {
	const expo = `# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",Hostname="n",pod="tp2",namespace="ml"} 40000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1",Hostname="n",pod="tp2",namespace="ml"} 79000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2",Hostname="n",pod="tp2b",namespace="ml"} 40000
DCGM_FI_DEV_FB_USED{gpu="3",UUID="GPU-3",Hostname="n",pod="tp2b",namespace="ml"} 79000
DCGM_FI_DEV_FB_USED{gpu="4",UUID="GPU-4",Hostname="n",pod="one",namespace="ml"} NaN
DCGM_FI_DEV_FB_USED{gpu="5",UUID="GPU-5",Hostname="n",pod="ok",namespace="ml"} 79000
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0",Hostname="n",pod="tp2",namespace="ml"} 40000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1",Hostname="n",pod="tp2",namespace="ml"} NaN
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-2",Hostname="n",pod="tp2b",namespace="ml"} 40000
DCGM_FI_DEV_FB_FREE{gpu="4",UUID="GPU-4",Hostname="n",pod="one",namespace="ml"} -1
DCGM_FI_DEV_FB_FREE{gpu="5",UUID="GPU-5",Hostname="n",pod="ok",namespace="ml"} 1000
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="n",pod="tp2",namespace="ml"} 30
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",Hostname="n",pod="tp2",namespace="ml"} 90
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.True(t, errors.Is(err, telemetry.ErrPartial), "%v", err)
	require.Len(t, gpus, 6, "GPU 4, every value dropped, is still a record")
	assert.True(t, gpus[1].Dropped.Has(dcgm.FBFree))
	assert.Zero(t, gpus[4].Has)
	assert.True(t, gpus[4].Dropped.Has(dcgm.FBUsed) && gpus[4].Dropped.Has(dcgm.FBFree))

	obs := dcgm.Aggregate(gpus, dcgm.ByPod(map[string]dcgm.Pod{
		"tp2": {Namespace: "ml", Name: "tp2"}, "tp2b": {Namespace: "ml", Name: "tp2b"},
		"one": {Namespace: "ml", Name: "one"}, "ok": {Namespace: "ml", Name: "ok"},
	}))
	got := map[string]map[string]float64{}
	for _, o := range obs {
		got[o.EndpointID] = fields(o.Sample)
	}
	assert.Equal(t, map[string]map[string]float64{
		"tp2": {"gpu_util": 0.9},
		// tp2b (FB_USED without FB_FREE on GPU 3) and one (both
		// dropped) have nothing left to report.
		"ok": {"gpu_mem_used_bytes": 79000 * mib, "gpu_mem_total_bytes": 80000 * mib},
	}, got)
}

// A GPU whose every value was dropped has no time of its own: read from a
// /federate endpoint, its endpoint keeps the time its other GPUs' values
// carry rather than taking the poll's.
func TestAggregateTimeIgnoresAGPUWithEveryValueDropped(t *testing.T) {
	// (GPU 1's one value is its temperature, which the endpoint then does
	// not report: GPU 0's utilization stands.)
	const expo = `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="n"} 40 1767225590250
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",Hostname="n"} NaN 1767225590250
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.Error(t, err)
	require.Len(t, gpus, 2)
	obs := dcgm.Aggregate(gpus, dcgm.ByHost(map[string]string{"e": "n"}))
	require.Len(t, obs, 1)
	assert.True(t, obs[0].Sample.Time.Equal(time.UnixMilli(1767225590250)), "%v", obs[0].Sample.Time)
	assert.Equal(t, map[string]float64{"gpu_util": 0.4}, fields(obs[0].Sample))
}

// An endpoint one of whose GPUs had its utilization, temperature or power
// dropped (NaN, out of range) reports none of that field: the largest of
// its other GPUs' understated it (here 0.4 and 61 C, where the GPU it could
// not read may be the busier and hotter), as its memory was already
// withheld when one GPU's could not be read. The fields every GPU gave
// stand.
func TestAggregateWithholdsAFieldOneGPUCouldNotGive(t *testing.T) {
	const expo = `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="n"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",Hostname="n"} NaN
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",Hostname="n"} 61
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",Hostname="n"} 900
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-0",Hostname="n"} 300
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-1",Hostname="n"} 350
`
	gpus, err := dcgm.ParseMetrics(strings.NewReader(expo))
	require.ErrorIs(t, err, telemetry.ErrPartial)
	obs := dcgm.Aggregate(gpus, dcgm.ByHost(map[string]string{"e": "n"}))
	require.Len(t, obs, 1)
	assert.Equal(t, map[string]float64{"gpu_power_w": 350}, fields(obs[0].Sample))
}
