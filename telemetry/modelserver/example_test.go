package modelserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

func ExampleParseMetrics() {
	exposition := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
`
	s, err := modelserver.ParseMetrics(strings.NewReader(exposition))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Parsers leave the time to the caller, who knows when it scraped.
	s.Time = time.Now()

	var store telemetry.Store
	store.Publish("vllm-0", s)

	running, _ := s.Get(telemetry.Running)
	waiting, _ := s.Get(telemetry.Waiting)
	kv, _ := s.Get(telemetry.KVCacheUsage)
	fmt.Println(running, waiting, kv, store.Stats().Accepted)
	// Output: 8 3 0.42 1
}

func ExampleParseLoadHeader() {
	// The value of a response's endpoint-load-metrics header, sent by vLLM
	// when the request carried endpoint-load-metrics-format: text.
	s, err := modelserver.ParseLoadHeader("TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3")
	if err != nil {
		fmt.Println(err)
		return
	}
	kv, _ := s.Get(telemetry.KVCacheUsage)
	waiting, _ := s.Get(telemetry.Waiting)
	fmt.Println(kv, waiting)
	// Output: 0.4 3
}

func ExampleParse_loRA() {
	// vLLM started with --enable-lora --max-loras 2 keeps every label set
	// of vllm:lora_requests_info it ever had, valued at the time it was
	// set: the latest is the state now.
	exposition := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.764931204e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="law-lora"} 1.764931211e+09
`
	res, err := modelserver.Parse(strings.NewReader(exposition))
	if err != nil {
		fmt.Println(err)
		return
	}
	s := res.Sample
	slots, _ := s.Get(telemetry.LoRASlots)
	fmt.Println(slots, s.Adapters.Running, s.Adapters.Waiting)
	for _, model := range []string{"meta-llama/Llama-3.1-8B-Instruct", "sql-lora", "law-lora", "math-lora"} {
		adapter, full := s.SlotWait(model)
		fmt.Printf("%s: adapter %v, would wait for a slot %v\n", model, adapter, full)
	}
	// Output:
	// 2 [sql-lora chat-lora] [law-lora]
	// meta-llama/Llama-3.1-8B-Instruct: adapter false, would wait for a slot false
	// sql-lora: adapter false, would wait for a slot false
	// law-lora: adapter true, would wait for a slot true
	// math-lora: adapter true, would wait for a slot true
}

// Scrape each vLLM server's /metrics into the Balancer that routes to
// them. A target names its endpoint by the ID the Balancer knows it by
// (Endpoint.Key: the ID, else the Addr exactly as given); a
// telemetry.Poller publishes each round, and the scorers read the
// readings from there (Balancer.Stats shows them as they see them).
func ExampleSource() {
	serve := func(running, waiting int, kv float64) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\"} %d\nvllm:num_requests_waiting{engine=\"0\"} %d\nvllm:kv_cache_usage_perc{engine=\"0\"} %g\n", running, waiting, kv)
		}))
	}
	busy, idle := serve(40, 12, 0.97), serve(1, 0, 0.10)
	defer busy.Close()
	defer idle.Close()

	b := balancer.New(balancer.Options{})
	defer b.Close()
	if err := b.Update([]inferlb.Endpoint{{ID: "vllm-0", Addr: "10.0.0.5:8000"}, {ID: "vllm-1", Addr: "10.0.0.6:8000"}}); err != nil {
		fmt.Println(err)
		return
	}
	src := &modelserver.Source{Targets: modelserver.Static(
		modelserver.Target{EndpointID: "vllm-0", URL: busy.URL + "/metrics"},
		modelserver.Target{EndpointID: "vllm-1", URL: idle.URL + "/metrics"},
	)}
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{
		Interval: 5 * time.Second,
		OnError:  func(err error) { fmt.Println("telemetry:", err) }, // a failed scrape, a misnamed target
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// go p.Run(ctx) polls every Interval until ctx ends; one round by hand:
	p.Poll(context.Background())

	for _, st := range b.Stats() {
		running, _ := st.Telemetry.Get(telemetry.Running)
		waiting, _ := st.Telemetry.Get(telemetry.Waiting)
		kv, _ := st.Telemetry.Get(telemetry.KVCacheUsage)
		fmt.Printf("%s: running %g, waiting %g, KV cache %g\n", st.ID, running, waiting, kv)
	}
	// Output:
	// vllm-0: running 40, waiting 12, KV cache 0.97
	// vllm-1: running 1, waiting 0, KV cache 0.1
}
