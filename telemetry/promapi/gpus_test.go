package promapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/promapi"
)

// dcgm-exporter runs once per node and exports every GPU of it: its
// series' instance is the exporter's own address, never a model server's.
// The default GPUUtil query grouped by instance, so its readings went to
// the exporter's address, which is no endpoint (or, mapped to a node, to
// every server of the node alike), and no server got its own GPUs'. It
// now joins a GPU to the server of the pod it is allocated to (dcgm's pod
// mapping), whether Prometheus kept the exporter's pod and namespace
// labels (honor_labels) or renamed them exported_pod and
// exported_namespace; a GPU it cannot join is left out.
//
// GPU memory had no default query: a fleet read through Prometheus had no
// GPUMemUsed or GPUMemTotal, which package dcgm reads from the same
// exporters. They are joined the same way, both from the GPU of the server
// with the highest memory pressure: b's small GPU (9000 of 10000 MiB) and
// not its big one (40000 of 81471), nor a mix of the two, and d's fuller
// GPU of two (node-a-two-gpus-one-pod.txt, with FB_RESERVED).
//
// MIG instances have no DCGM_FI_DEV_GPU_UTIL, and the default read no
// other: a server on a MIG instance had no GPU utilization, which package
// dcgm reads from DCGM_FI_PROF_GR_ENGINE_ACTIVE. e, on instance 1 of
// node-b-mig.txt, now has it (0.6), and its instance's memory.
func TestRealPrometheusGPUsByPod(t *testing.T) {
	const mib = 1 << 20
	bin := prometheusBinary(t)

	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	// Five model servers: a, b, d and e in pods, c outside Kubernetes.
	idOf := map[string]string{}
	servers := map[string]string{}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		instance := serve(exporters["vllm-v1"])
		idOf[instance], servers[name] = name, instance
	}
	// Node 1: the real exposition, GPU 6 allocated to a's pod, at 0%.
	real, err := os.ReadFile("testdata/dcgm-exporter-h100-eks-k8s.txt")
	require.NoError(t, err)
	node1 := serve(string(real))
	// Node 2: GPUs 0 and 2 allocated to b's pod, GPU 1 to no pod, busier
	// and full; no FB_RESERVED (an older exporter). GPU 2 is small and
	// the fuller: b's GPU memory is its alone.
	node2 := serve(`# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2",container="vllm",namespace="serving",pod="vllm-b"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2"} 100
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2",container="vllm",namespace="serving",pod="vllm-b"} 40000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2"} 81000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2c",device="nvidia2",modelName="NVIDIA A2",Hostname="node-2",container="vllm",namespace="serving",pod="vllm-b"} 9000
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2",container="vllm",namespace="serving",pod="vllm-b"} 41471
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-2"} 471
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-2c",device="nvidia2",modelName="NVIDIA A2",Hostname="node-2",container="vllm",namespace="serving",pod="vllm-b"} 1000
`)
	// Node 3: two GPUs of d's pod, ml/vllm-0, GPU 1 the fuller.
	nodeA, err := os.ReadFile("testdata/node-a-two-gpus-one-pod.txt")
	require.NoError(t, err)
	node3 := serve(string(nodeA))
	// Node 4: an A100 in two MIG instances, the first e's pod's.
	nodeB, err := os.ReadFile("testdata/node-b-mig.txt")
	require.NoError(t, err)
	node4 := serve(string(nodeB))

	// The exporters are scraped as the Prometheus Operator scrapes a
	// ServiceMonitor's targets, with the exporter pod's own namespace and
	// pod as target labels: nodes 1, 3 and 4 without honor_labels (their
	// series' labels become exported_*), node 2 with it.
	prom := startPrometheus(t, bin, fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: [%q]
        labels: {namespace: nim-workload, pod: llama-3-2-1b-7577f87fc7-dhb97}
      - targets: [%q]
        labels: {namespace: serving, pod: vllm-b}
      - targets: [%q]
      - targets: [%q]
        labels: {namespace: ml, pod: vllm-0}
      - targets: [%q]
        labels: {namespace: ml, pod: sglang-0}
  - job_name: dcgm
    static_configs:
      - targets: [%q]
        labels: {namespace: gpu-operator, pod: nvidia-dcgm-exporter-n1}
      - targets: [%q]
        labels: {namespace: gpu-operator, pod: nvidia-dcgm-exporter-n3}
      - targets: [%q]
        labels: {namespace: gpu-operator, pod: nvidia-dcgm-exporter-n4}
  - job_name: dcgm-honor
    honor_labels: true
    static_configs:
      - targets: [%q]
        labels: {namespace: gpu-operator, pod: nvidia-dcgm-exporter-n2}
`, servers["a"], servers["b"], servers["c"], servers["d"], servers["e"], node1, node3, node4, node2))

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	src := &promapi.Source{
		URL:    "http://" + prom.addr,
		Client: &http.Client{Transport: tr},
		EndpointID: func(instance string) (string, bool) {
			id, ok := idOf[instance]
			return id, ok
		},
	}
	want := map[string]map[string]float64{
		"a": {"running": 3, "waiting": 7, "kv_cache_usage": 0.95, "gpu_util": 0},
		"b": {"running": 3, "waiting": 7, "kv_cache_usage": 0.95, "gpu_util": 0.9,
			"gpu_mem_used_bytes": 9000 * mib, "gpu_mem_total_bytes": 10000 * mib},
		"c": {"running": 3, "waiting": 7, "kv_cache_usage": 0.95},
		// 76000 used + 534 reserved of 76000 + 4937 free + 534.
		"d": {"running": 3, "waiting": 7, "kv_cache_usage": 0.95, "gpu_util": 0.92,
			"gpu_mem_used_bytes": 76534 * mib, "gpu_mem_total_bytes": 81471 * mib},
		// MIG instance 1: engine activity 0.6; 30000 used of 40000.
		"e": {"running": 3, "waiting": 7, "kv_cache_usage": 0.95, "gpu_util": 0.6,
			"gpu_mem_used_bytes": 30000 * mib, "gpu_mem_total_bytes": 40000 * mib},
	}
	// Prometheus is an external process: poll its API until every target
	// was scraped and read as wanted, within a deadline.
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var got map[string]map[string]float64
	var lastErr error
	for {
		select {
		case err := <-prom.exited:
			prom.exited <- err
			t.Fatalf("prometheus exited early: %v\n%s", err, prom.logs.String())
		case <-deadline:
			t.Fatalf("no complete fleet within 60s; last: %v, %v\n%s", got, lastErr, prom.logs.String())
		case <-tick.C:
		}
		obs, err := src.Collect(t.Context())
		lastErr = err
		got = map[string]map[string]float64{}
		for _, o := range obs {
			// A server's GPU fields come in an observation of their own,
			// stamped with the exporter's scrape time.
			if got[o.EndpointID] == nil {
				got[o.EndpointID] = map[string]float64{}
			}
			for k, v := range fields(o.Sample) {
				got[o.EndpointID][k] = v
			}
		}
		if err == nil && assert.ObjectsAreEqual(want, got) {
			break
		}
	}
	assert.Equal(t, want, got)
}
