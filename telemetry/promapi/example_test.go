package promapi_test

import (
	"fmt"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

func ExampleSource_Query() {
	src := &promapi.Source{
		URL: "http://prometheus:9090",
		Queries: map[telemetry.Field]string{
			telemetry.Waiting:      `sum by (instance) (vllm:num_requests_waiting)`,
			telemetry.KVCacheUsage: `max by (instance) (vllm:kv_cache_usage_perc)`,
		},
		// When the waiting counts were scraped (the oldest of an
		// instance's series); kv_cache_usage, with no time given, is
		// stamped with the query's evaluation time.
		Timestamps: map[telemetry.Field]string{
			telemetry.Waiting: `min by (instance) (timestamp(vllm:num_requests_waiting))`,
		},
	}
	// Collect sends this one expression per round; run it through a
	// telemetry.Poller to keep a Store or Balancer current.
	fmt.Println(src.Query())
	// Output:
	// label_replace((sum by (instance) (vllm:num_requests_waiting)), "inferlb_field", "waiting", "", "") or label_replace((max by (instance) (vllm:kv_cache_usage_perc)), "inferlb_field", "kv_cache_usage", "", "") or label_replace((min by (instance) (timestamp(vllm:num_requests_waiting))), "inferlb_time", "waiting", "", "")
}
