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
