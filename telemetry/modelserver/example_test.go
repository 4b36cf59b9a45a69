package modelserver_test

import (
	"fmt"
	"strings"
	"time"

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
