package metrics_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/metrics"
)

// Register a Collector per Balancer (for an httpbalancer.Transport, its
// Balancer()) and a StoreCollector per telemetry Store, then serve the
// registry as usual (promhttp.HandlerFor). Here the registry is read
// directly.
func ExampleNewCollector() {
	b := balancer.New(balancer.Options{})
	defer b.Close()
	if err := b.Update([]inferlb.Endpoint{{Addr: "10.0.0.5:8000"}}); err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		metrics.NewCollector(b, "llm"),
		metrics.NewStoreCollector(b.Telemetry(), "llm"),
	)

	for range 3 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		if err != nil {
			fmt.Println(err)
			return
		}
		p.Done(inferlb.Outcome{}) // a success
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mf := range families {
		switch mf.GetName() {
		case "inferlb_endpoint_picks_total", "inferlb_endpoint_successes_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" {
						fmt.Println(mf.GetName(), l.GetValue(), m.GetCounter().GetValue())
					}
				}
			}
		}
	}
	// Output:
	// inferlb_endpoint_picks_total 10.0.0.5:8000 3
	// inferlb_endpoint_successes_total 10.0.0.5:8000 3
}
