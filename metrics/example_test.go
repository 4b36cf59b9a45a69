package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
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

// A Poller's failed scrapes go to its OnError, once per round, and to its
// PollerCollector's counters, which a dashboard or an alert reads: a
// Balancer whose telemetry stopped routes as if it had none.
func ExampleNewPollerCollector() {
	b := balancer.New(balancer.Options{})
	defer b.Close()
	if err := b.Update([]inferlb.Endpoint{{ID: "vllm-0", Addr: "10.0.0.5:8000"}}); err != nil {
		fmt.Println(err)
		return
	}
	// In use a modelserver, dcgm or promapi Source; here one whose every
	// target is down.
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		return nil, errors.New(`modelserver: all 1 targets failed; first: endpoint "vllm-0": connection refused`)
	})
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{
		Interval: 5 * time.Second,
		OnError:  func(err error) { fmt.Println("OnError:", err) },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewPollerCollector(p, "vllm"))

	for range 2 {
		p.Poll(context.Background()) // Run(ctx) does this every Interval, backing off
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mf := range families {
		switch mf.GetName() {
		case "inferlb_telemetry_poll_rounds_total", "inferlb_telemetry_poll_failures_total":
			fmt.Println(mf.GetName(), mf.GetMetric()[0].GetCounter().GetValue())
		case "inferlb_telemetry_poll_consecutive_failures":
			fmt.Println(mf.GetName(), mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// OnError: modelserver: all 1 targets failed; first: endpoint "vllm-0": connection refused
	// OnError: modelserver: all 1 targets failed; first: endpoint "vllm-0": connection refused
	// inferlb_telemetry_poll_consecutive_failures 2
	// inferlb_telemetry_poll_failures_total 2
	// inferlb_telemetry_poll_rounds_total 2
}
