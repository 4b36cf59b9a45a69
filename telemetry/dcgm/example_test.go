package dcgm_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/inferlb/inferlb/telemetry/dcgm"
)

func ExampleParseMetrics() {
	// Two GPUs of one vLLM pod (tensor parallel 2), as dcgm-exporter
	// --kubernetes reports them.
	const l0 = `gpu="0",UUID="GPU-0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",namespace="ml",pod="vllm-0"`
	const l1 = `gpu="1",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",namespace="ml",pod="vllm-0"`
	exposition := strings.Join([]string{
		"DCGM_FI_DEV_FB_USED{" + l0 + "} 40000",
		"DCGM_FI_DEV_FB_FREE{" + l0 + "} 40937",
		"DCGM_FI_DEV_FB_RESERVED{" + l0 + "} 534",
		"DCGM_FI_DEV_FB_USED{" + l1 + "} 76000",
		"DCGM_FI_DEV_FB_FREE{" + l1 + "} 4937",
		"DCGM_FI_DEV_FB_RESERVED{" + l1 + "} 534",
	}, "\n") + "\n"

	gpus, err := dcgm.ParseMetrics(strings.NewReader(exposition))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, g := range gpus {
		total, _ := g.MemTotalMiB()
		p, _ := g.MemPressure()
		fmt.Printf("%s gpu %d: %.0f MiB, %.0f%% in use\n", g.Host, g.Index, total, 100*p)
	}

	// The endpoint takes its fuller GPU.
	obs := dcgm.Aggregate(gpus, dcgm.ByPod(map[string]dcgm.Pod{"10.0.0.7:8000": {Namespace: "ml", Name: "vllm-0"}}))
	u, _ := obs[0].Sample.MemoryUsage()
	fmt.Printf("%s: %.0f%%\n", obs[0].EndpointID, 100*u)
	// Output:
	// node-a gpu 0: 81471 MiB, 50% in use
	// node-a gpu 1: 81471 MiB, 94% in use
	// 10.0.0.7:8000: 94%
}

// Targets follows the nodes: one dcgm-exporter per node (a DaemonSet), each
// target mapping its node's GPUs to the endpoints on that node.
func ExampleSource() {
	// node-a's exporter; in a cluster, http://<node-a's pod IP>:9400/metrics.
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",Hostname="node-a"} 60000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0",Hostname="node-a"} 20000
`)
	}))
	defer exporter.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()

	// What the informer's handlers keep current. Each change stores a new
	// slice: a round may still be reading the old one.
	var mu sync.Mutex
	var targets []dcgm.Target
	setNodes := func(ts ...dcgm.Target) {
		mu.Lock()
		defer mu.Unlock()
		targets = ts
	}
	src := &dcgm.Source{
		Targets: func() []dcgm.Target {
			mu.Lock()
			defer mu.Unlock()
			return targets
		},
		Client: &http.Client{Transport: tr},
	}

	// node-a joins with one vLLM endpoint; a Poller would call Collect each round.
	setNodes(dcgm.Target{URL: exporter.URL + "/metrics", Map: dcgm.ByHost(map[string]string{"10.0.0.7:8000": "node-a"})})
	obs, err := src.Collect(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	u, _ := obs[0].Sample.MemoryUsage()
	fmt.Printf("%s: %.0f%%\n", obs[0].EndpointID, 100*u)

	// node-a leaves: the next round does not scrape it.
	setNodes()
	obs, err = src.Collect(context.Background())
	fmt.Println(len(obs), err)
	// Output:
	// 10.0.0.7:8000: 75%
	// 0 <nil>
}
