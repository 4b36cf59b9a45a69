package dcgm_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func parseFile(t *testing.T, name string) []dcgm.GPU {
	t.Helper()
	gpus, err := dcgm.ParseMetrics(bytes.NewReader(readFile(t, name)))
	require.NoError(t, err)
	return gpus
}

func fields(s telemetry.Sample) map[string]float64 {
	out := map[string]float64{}
	for f := range telemetry.NumFields {
		if v, ok := s.Get(telemetry.Field(f)); ok {
			out[telemetry.Field(f).String()] = v
		}
	}
	return out
}

func TestParseRealH100Node(t *testing.T) {
	gpus := parseFile(t, "dcgm-exporter-h100-eks-k8s.txt")
	require.Len(t, gpus, 8)
	for i, g := range gpus {
		assert.Equal(t, i, g.Index, "sorted by index")
		assert.Equal(t, "ip-10-0-180-136.ec2.internal", g.Host)
		assert.Equal(t, "NVIDIA H100 80GB HBM3", g.ModelName)
		assert.True(t, g.Has.Has(dcgm.Temp) && g.Has.Has(dcgm.Power) && g.Has.Has(dcgm.Util))
		_, ok := g.MemTotalMiB()
		assert.False(t, ok, "this capture has no FB_* series")
	}
	g6 := gpus[6]
	assert.Equal(t, dcgm.GPU{
		UUID: "GPU-d0f25a6f-9a3f-61b9-c128-3d14759651d7", Index: 6, Device: "nvidia6", PCIBusID: "00000000:B9:00.0",
		ModelName: "NVIDIA H100 80GB HBM3", Host: "ip-10-0-180-136.ec2.internal",
		Pod: "llama-3-2-1b-7577f87fc7-dhb97", Namespace: "nim-workload", Container: "llama-3-2-1b-ctr",
		TempC: 37, PowerW: 112.67, UtilPercent: 0,
		Has: 1<<dcgm.Temp | 1<<dcgm.Power | 1<<dcgm.Util,
	}, g6)
	assert.Equal(t, map[string]float64{"gpu_util": 0, "gpu_temp_c": 37, "gpu_power_w": 112.67}, fields(g6.Sample()))
}

func TestParseMemoryAndXID(t *testing.T) {
	gpus := parseFile(t, "node-a-two-gpus-one-pod.txt")
	require.Len(t, gpus, 2)
	g := gpus[1]
	assert.Equal(t, "node-a", g.Host)
	assert.Equal(t, 76000.0, g.FBUsedMiB)
	assert.Equal(t, 4937.0, g.FBFreeMiB)
	assert.Equal(t, 534.0, g.FBReservedMiB)
	assert.Equal(t, 31.0, g.XIDError)
	total, ok := g.MemTotalMiB()
	require.True(t, ok)
	assert.Equal(t, 81471.0, total, "FB_FREE + FB_USED + FB_RESERVED")
	p, ok := g.MemPressure()
	require.True(t, ok)
	assert.InDelta(t, (81471.0-4937)/81471, p, 1e-12)
	assert.Equal(t, map[string]float64{
		"gpu_mem_used_bytes": (81471 - 4937) * mib, "gpu_mem_total_bytes": 81471 * mib,
		"gpu_util": 0.92, "gpu_temp_c": 55, "gpu_power_w": 650.25,
	}, fields(g.Sample()))
}

func TestParseMIG(t *testing.T) {
	gpus := parseFile(t, "node-b-mig.txt")
	require.Len(t, gpus, 3, "the parent GPU's device-level series and two instances")
	parent, i1, i2 := gpus[0], gpus[1], gpus[2]
	assert.Equal(t, "node-b", parent.Host, "lower-case hostname label")
	assert.Empty(t, parent.MIGInstance)
	assert.Equal(t, 63.0, parent.TempC)
	assert.Equal(t, "1", i1.MIGInstance)
	assert.Equal(t, "3g.40gb", i1.MIGProfile)
	assert.Equal(t, "sglang-0", i1.Pod)
	assert.Equal(t, 60.0, i1.UtilPercent, "graphics-engine activity ratio, as percent")
	assert.Equal(t, "2", i2.MIGInstance)
	total, _ := i2.MemTotalMiB()
	assert.Equal(t, 40000.0, total)
}

func TestAggregate(t *testing.T) {
	a := parseFile(t, "node-a-two-gpus-one-pod.txt")
	b := parseFile(t, "node-b-mig.txt")
	all := append(append([]dcgm.GPU(nil), a...), b...)

	t.Run("by pod: a two-GPU pod takes its fuller GPU", func(t *testing.T) {
		obs := dcgm.Aggregate(all, dcgm.ByPod(map[string]dcgm.Pod{
			"10.0.0.1:8000": {Namespace: "ml", Name: "vllm-0"},
			"10.0.0.2:8000": {Namespace: "ml", Name: "sglang-0"},
			"10.0.0.3:8000": {Namespace: "other", Name: "sglang-1"}, // wrong namespace: no GPU
		}))
		got := map[string]map[string]float64{}
		for _, o := range obs {
			got[o.EndpointID] = fields(o.Sample)
		}
		assert.Equal(t, map[string]map[string]float64{
			"10.0.0.1:8000": {
				"gpu_mem_used_bytes": (81471 - 4937) * mib, "gpu_mem_total_bytes": 81471 * mib,
				"gpu_util": 0.92, "gpu_temp_c": 55, "gpu_power_w": 650.25,
			},
			"10.0.0.2:8000": {"gpu_mem_used_bytes": 30000 * mib, "gpu_mem_total_bytes": 40000 * mib, "gpu_util": 0.6},
		}, got)
	})

	t.Run("by host: every endpoint of the host takes the host's worst GPU", func(t *testing.T) {
		obs := dcgm.Aggregate(all, dcgm.ByHost(map[string]string{"b1": "node-b", "b2": "node-b", "x": "node-x"}))
		require.Len(t, obs, 2)
		want := map[string]float64{
			"gpu_mem_used_bytes": 30000 * mib, "gpu_mem_total_bytes": 40000 * mib, // instance 1: 75%
			"gpu_util": 0.6, "gpu_temp_c": 63, "gpu_power_w": 210,
		}
		assert.Equal(t, "b1", obs[0].EndpointID)
		assert.Equal(t, want, fields(obs[0].Sample))
		assert.Equal(t, "b2", obs[1].EndpointID)
		assert.Equal(t, want, fields(obs[1].Sample))
	})

	t.Run("a custom mapping by GPU UUID", func(t *testing.T) {
		obs := dcgm.Aggregate(all, func(g *dcgm.GPU) []string {
			if g.UUID == "GPU-aaaa0000-0000-0000-0000-000000000000" {
				return []string{"e0"}
			}
			return nil
		})
		require.Len(t, obs, 1)
		u, ok := obs[0].Sample.MemoryUsage()
		require.True(t, ok)
		assert.InDelta(t, (81471.0-40937)/81471, u, 1e-12)
	})

	assert.Nil(t, dcgm.Aggregate(all, nil))
}

// The error names a dropped value as the exporter wrote it: it said
// DCGM_FI_DEV_GPU_TEMP=0 for a NaN (0 degrees is in range, so the message
// contradicted itself) and DCGM_FI_PROF_GR_ENGINE_ACTIVE=150 for a ratio
// exported as 1.5.
func TestParseErrorNamesTheDroppedValueAsExported(t *testing.T) {
	const labels = `{gpu="0",UUID="GPU-x",Hostname="h"}`
	for in, want := range map[string]string{
		"DCGM_FI_DEV_GPU_TEMP" + labels + " NaN\nDCGM_FI_DEV_POWER_USAGE" + labels + " 70\n":          "DCGM_FI_DEV_GPU_TEMP=NaN",
		"DCGM_FI_PROF_GR_ENGINE_ACTIVE" + labels + " 1.5\nDCGM_FI_DEV_POWER_USAGE" + labels + " 70\n": "DCGM_FI_PROF_GR_ENGINE_ACTIVE=1.5",
	} {
		_, err := dcgm.ParseMetrics(strings.NewReader(in))
		require.ErrorIs(t, err, telemetry.ErrPartial)
		assert.Contains(t, err.Error(), want+` for GPU "GPU-x"`)
	}
}

// A GPU whose series have no UUID (relabelled away, as a federation can
// leave them) was named "" in the error: it now says which GPU, by
// device (or host), as the duplicate-series message does.
func TestParseErrorNamesAGPUWithoutUUID(t *testing.T) {
	in := `DCGM_FI_DEV_GPU_UTIL{device="nvidia3",Hostname="h"} 140` + "\n" +
		`DCGM_FI_DEV_GPU_TEMP{device="nvidia3",Hostname="h"} 50` + "\n"
	_, err := dcgm.ParseMetrics(strings.NewReader(in))
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.ErrorContains(t, err, `DCGM_FI_DEV_GPU_UTIL=140 for GPU "nvidia3"`)
}

func TestParseBadInput(t *testing.T) {
	const labels = `{gpu="0",UUID="GPU-x",Hostname="h"}`
	tests := []struct {
		name    string
		in      string
		gpus    int
		partial bool
		err     error
	}{
		{name: "negative memory dropped", in: "DCGM_FI_DEV_FB_USED" + labels + " -5\nDCGM_FI_DEV_GPU_TEMP" + labels + " 40\n", gpus: 1, partial: true},
		{name: "utilization above 100 dropped", in: "DCGM_FI_DEV_GPU_UTIL" + labels + " 140\nDCGM_FI_DEV_GPU_TEMP" + labels + " 40\n", gpus: 1, partial: true},
		{name: "NaN dropped", in: "DCGM_FI_DEV_POWER_USAGE" + labels + " NaN\nDCGM_FI_DEV_GPU_TEMP" + labels + " 40\n", gpus: 1, partial: true},
		{name: "truncated body keeps complete lines", in: "DCGM_FI_DEV_GPU_TEMP" + labels + " 40\nDCGM_FI_DEV_FB_USED{gpu=\"0\",UU", gpus: 1, partial: true},
		{name: "only bad values", in: "DCGM_FI_DEV_FB_USED" + labels + " -5\n", err: dcgm.ErrNoGPUs},
		{name: "no dcgm metrics", in: "go_goroutines 12\n", err: dcgm.ErrNoGPUs},
		{name: "empty", in: "", err: dcgm.ErrNoGPUs},
		{name: "garbage", in: "\x00\x01{{{\n", err: dcgm.ErrNoGPUs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gpus, err := dcgm.ParseMetrics(strings.NewReader(tt.in))
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				assert.Empty(t, gpus)
				return
			}
			require.ErrorIs(t, err, telemetry.ErrPartial)
			assert.Contains(t, err.Error(), "dcgm: ")
			assert.Len(t, gpus, tt.gpus)
		})
	}
}

func TestSourceCollect(t *testing.T) {
	serve := func(status int, body []byte) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = w.Write(body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/metrics"
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	nodeA := serve(200, readFile(t, "node-a-two-gpus-one-pod.txt"))
	nodeB := serve(200, readFile(t, "node-b-mig.txt"))
	down := serve(500, nil)
	mapping := dcgm.ByPod(map[string]dcgm.Pod{"vllm": {"ml", "vllm-0"}, "sglang": {"ml", "sglang-1"}})

	src := &dcgm.Source{URLs: []string{nodeA, nodeB, down}, Map: mapping, Client: &http.Client{Transport: tr}}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), fmt.Sprintf("dcgm: 1 of 3 exporters failed (%q), 0 partial; first: scrape: GET %s", down, down))
	got := map[string]float64{}
	for _, o := range obs {
		u, ok := o.Sample.MemoryUsage()
		require.True(t, ok)
		got[o.EndpointID] = u
	}
	assert.InDelta(t, (81471.0-4937)/81471, got["vllm"], 1e-12)
	assert.InDelta(t, 5000.0/40000, got["sglang"], 1e-12)

	src = &dcgm.Source{URLs: []string{down}, Map: mapping, Client: &http.Client{Transport: tr}}
	_, err = src.Collect(t.Context())
	require.Error(t, err)
	assert.NotErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "dcgm: all 1 exporters failed")

	_, err = (&dcgm.Source{URLs: []string{nodeA}}).Collect(t.Context())
	assert.ErrorContains(t, err, "dcgm: Source.Map is nil")
}

// FuzzParseMetrics: run it with -fuzzminimizetime 200x. Its seeds are real
// expositions of 4-8 KB, and with the default (60 s of minimizing for each
// new input) a 150 s run made 9 executions; with the flag, 276,816.
func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"dcgm-exporter-h100-eks-k8s.txt", "node-a-two-gpus-one-pod.txt", "node-b-mig.txt"} {
		f.Add(readFile(f, name))
	}
	f.Add([]byte("DCGM_FI_DEV_FB_USED{UUID=\"x\"} 1e308\nDCGM_FI_DEV_FB_FREE{UUID=\"x\"} 1e308\n"))
	f.Add([]byte("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-aaaa0000-0000-0000-0000-000000000000\",device=\"nvidia0\",Hostname=\"node-a\",container=\"vllm\",namespace=\"ml\",pod=\"vllm-0\"} 1\n" +
		"# TYPE DCGM_FI_DEV_FB_USED counter\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"1\",UUID=\"GPU-aaaa1111-1111-1111-1111-111111111111\"} 0.5 1700000000\n# EOF\n"))
	// The exposition a malformed tail follows (see below).
	good := readFile(f, "node-a-two-gpus-one-pod.txt")
	base, err := dcgm.ParseMetrics(bytes.NewReader(good))
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, in []byte) {
		gpus, err := dcgm.ParseMetrics(bytes.NewReader(in))
		if err != nil && !errors.Is(err, telemetry.ErrPartial) && len(gpus) > 0 {
			t.Fatalf("a failure must not return GPUs: %v", err)
		}
		if err == nil && len(gpus) == 0 {
			t.Fatal("success must return a GPU")
		}
		obs := dcgm.Aggregate(gpus, func(*dcgm.GPU) []string { return []string{"e"} })
		for _, o := range obs {
			if u, ok := o.Sample.MemoryUsage(); ok && (u < 0 || u > 1) {
				t.Fatalf("memory usage %v", u)
			}
			if v, ok := o.Sample.Get(telemetry.GPUUtil); ok && (v < 0 || v > 1) {
				t.Fatalf("util %v", v)
			}
		}

		// Whatever follows a good exposition (a proxy's junk, a second
		// exporter's series, the same GPUs' series again) is ignored or
		// counted: every GPU of the good part keeps each value it had,
		// since the first series of a gauge counts.
		all, err := dcgm.ParseMetrics(bytes.NewReader(slices.Concat(good, []byte("\n"), in)))
		if err != nil && !errors.Is(err, telemetry.ErrPartial) {
			t.Fatalf("the good part failed with what follows it: %v", err)
		}
		for _, g := range base {
			i := slices.IndexFunc(all, func(h dcgm.GPU) bool {
				return h.Host == g.Host && h.UUID == g.UUID && h.Index == g.Index && h.Device == g.Device &&
					h.MIGInstance == g.MIGInstance && h.Namespace == g.Namespace && h.Pod == g.Pod && h.Container == g.Container
			})
			if i < 0 {
				t.Fatalf("GPU %s lost to what follows it", g.UUID)
			}
			h := all[i]
			for m := range dcgm.XIDErrors + 1 {
				if g.Has.Has(m) && (!h.Has.Has(m) || gpuValue(&h, m) != gpuValue(&g, m)) {
					t.Fatalf("GPU %s, metric %d: %v, then %v (%v)", g.UUID, m, gpuValue(&g, m), gpuValue(&h, m), h.Has.Has(m))
				}
			}
			if !h.Time.Equal(g.Time) {
				t.Fatalf("GPU %s measured at %v, then %v", g.UUID, g.Time, h.Time)
			}
		}
	})
}

// gpuValue returns g's field for m.
func gpuValue(g *dcgm.GPU, m dcgm.Metric) float64 {
	return [...]float64{g.FBUsedMiB, g.FBFreeMiB, g.FBReservedMiB, g.UtilPercent, g.TempC, g.PowerW, g.XIDError}[m]
}

// Series that land on one GPU record (no UUID, gpu or device label to tell GPUs
// apart, or one series exported twice) are one reading and a rival of it,
// not two readings to overwrite each other: the first is kept, as
// modelserver and Prometheus keep it, and the rest are dropped and counted.
// Read last-value-wins, the idle GPU's figures hid the full one, and a
// FB_USED could be paired with another GPU's FB_FREE.
func TestParseKeepsTheFirstOfSeriesOnOneRecord(t *testing.T) {
	t.Run("GPUs without UUID, gpu or device labels", func(t *testing.T) {
		const l = `{modelName="NVIDIA H100 80GB HBM3",Hostname="node-c"}`
		in := "DCGM_FI_DEV_FB_USED" + l + " 79000\nDCGM_FI_DEV_FB_USED" + l + " 1000\n" +
			"DCGM_FI_DEV_FB_FREE" + l + " 1000\nDCGM_FI_DEV_FB_FREE" + l + " 79000\n" +
			"DCGM_FI_DEV_GPU_TEMP" + l + " 71\nDCGM_FI_DEV_GPU_TEMP" + l + " 40\n"
		gpus, err := dcgm.ParseMetrics(strings.NewReader(in))
		require.ErrorIs(t, err, telemetry.ErrPartial)
		assert.ErrorContains(t, err, "duplicate")
		require.Len(t, gpus, 1, "nothing tells the two apart")
		g := gpus[0]
		assert.Equal(t, 79000.0, g.FBUsedMiB, "the first series")
		assert.Equal(t, 1000.0, g.FBFreeMiB, "the first series, of the same GPU as FB_USED's")
		assert.Equal(t, 71.0, g.TempC)
		p, ok := g.MemPressure()
		require.True(t, ok)
		assert.InDelta(t, 79000.0/80000, p, 1e-12, "the full GPU is not hidden")
	})
	t.Run("a series exported twice", func(t *testing.T) {
		const l = `{gpu="0",UUID="GPU-x",Hostname="h"}`
		in := "DCGM_FI_DEV_FB_USED" + l + " 70000\nDCGM_FI_DEV_FB_FREE" + l + " 10000\n" +
			"DCGM_FI_DEV_FB_USED" + l + " 100\nDCGM_FI_DEV_FB_FREE" + l + " NaN\n"
		gpus, err := dcgm.ParseMetrics(strings.NewReader(in))
		require.ErrorIs(t, err, telemetry.ErrPartial)
		require.Len(t, gpus, 1)
		assert.Equal(t, 70000.0, gpus[0].FBUsedMiB)
		assert.Equal(t, 10000.0, gpus[0].FBFreeMiB)
	})
	t.Run("a bad first series is not replaced by a rival", func(t *testing.T) {
		const l = `{Hostname="h"}`
		in := "DCGM_FI_DEV_FB_USED" + l + " 79000\nDCGM_FI_DEV_FB_USED" + l + " 1000\n" +
			"DCGM_FI_DEV_FB_FREE" + l + " -1\nDCGM_FI_DEV_FB_FREE" + l + " 79000\n" +
			"DCGM_FI_DEV_GPU_TEMP" + l + " 50\n"
		gpus, err := dcgm.ParseMetrics(strings.NewReader(in))
		require.ErrorIs(t, err, telemetry.ErrPartial)
		require.Len(t, gpus, 1)
		_, ok := gpus[0].MemTotalMiB()
		assert.False(t, ok, "another GPU's FB_FREE must not stand in for this one's")
	})
	t.Run("engine activity does not count against GPU_UTIL", func(t *testing.T) {
		const l = `{gpu="0",UUID="GPU-x",Hostname="h"}`
		in := "DCGM_FI_DEV_GPU_UTIL" + l + " 40\nDCGM_FI_PROF_GR_ENGINE_ACTIVE" + l + " 0.9\n"
		gpus, err := dcgm.ParseMetrics(strings.NewReader(in))
		require.NoError(t, err)
		require.Len(t, gpus, 1)
		assert.Equal(t, 40.0, gpus[0].UtilPercent)
	})
}

// GPUs whose series lost their UUID and gpu labels (a relabelling rule, a
// federation) are still told apart by their device label: each is its own
// record, and an endpoint on the host takes the fuller one whichever comes
// first in the exposition. Merged into one record, the first series won:
// with the idle GPU listed first, a node with a full GPU read as idle.
func TestParseTellsGPUsApartByDevice(t *testing.T) {
	full := readFile(t, "no-gpu-labels-two-gpus.txt")
	// The same exposition with the idle GPU (nvidia1) first in each family.
	var lines, nv0 []string
	for _, l := range strings.Split(strings.TrimSpace(string(full)), "\n") {
		switch {
		case strings.Contains(l, `device="nvidia0"`):
			nv0 = append(nv0, l)
		case strings.HasPrefix(l, "# HELP") && len(nv0) > 0:
			lines = append(append(lines, nv0...), l)
			nv0 = nil
		default:
			lines = append(lines, l)
		}
	}
	idleFirst := strings.Join(append(lines, nv0...), "\n") + "\n"
	require.Less(t, strings.Index(idleFirst, `device="nvidia1"`), strings.Index(idleFirst, `device="nvidia0"`))

	for name, in := range map[string]string{"full first": string(full), "idle first": idleFirst} {
		t.Run(name, func(t *testing.T) {
			gpus, err := dcgm.ParseMetrics(strings.NewReader(in))
			require.NoError(t, err)
			require.Len(t, gpus, 2)
			assert.Equal(t, "nvidia0", gpus[0].Device, "sorted by device when nothing else orders them")
			assert.Equal(t, 79000.0, gpus[0].FBUsedMiB)
			assert.Equal(t, "nvidia1", gpus[1].Device)
			assert.Equal(t, 1000.0, gpus[1].FBUsedMiB)
			obs := dcgm.Aggregate(gpus, dcgm.ByHost(map[string]string{"c1": "node-c"}))
			require.Len(t, obs, 1)
			u, ok := obs[0].Sample.MemoryUsage()
			require.True(t, ok)
			assert.InDelta(t, 79000.0/80000, u, 1e-12, "the full GPU")
			temp, _ := obs[0].Sample.Get(telemetry.GPUTemp)
			assert.Equal(t, 71.0, temp)
		})
	}
}
