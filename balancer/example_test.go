package balancer_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/telemetry"
)

// A process routes its own LLM calls: update the endpoint set, pick per
// call, and report the outcome once the response has ended.
func Example() {
	b := balancer.New(balancer.Options{}) // documented defaults
	if err := b.Update([]inferlb.Endpoint{
		{Addr: "10.0.0.5:8000", Labels: map[string]string{"model": "llama-3-70b"}},
		{Addr: "10.0.0.6:8000", Labels: map[string]string{"model": "llama-3-70b"}, Weight: 2},
	}); err != nil {
		fmt.Println(err)
	}

	p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama-3-70b", PromptTokens: 900, MaxOutputTokens: 256})
	if err != nil {
		fmt.Println(err) // balancer.ErrNoEndpoints
		return
	}
	fmt.Println("send to one of the llama endpoints:", p.Endpoint().Labels["model"])
	// ... send the call to p.Endpoint().Addr, stream the answer ...
	p.Done(inferlb.Outcome{TTFT: 180 * time.Millisecond, OutputTokens: 240})
	// Output: send to one of the llama endpoints: llama-3-70b
}

// Telemetry from any source reaches the scorers through Publish: here a
// GPU at 97% memory makes its endpoint expensive for LLM traffic.
func ExampleBalancer_Publish() {
	b := balancer.New(balancer.Options{})
	_ = b.Update([]inferlb.Endpoint{{Addr: "gpu-a:8000"}, {Addr: "gpu-b:8000"}})

	hot := telemetry.Sample{Time: time.Now()}
	hot.Set(telemetry.GPUMemUsed, 77.6e9)
	hot.Set(telemetry.GPUMemTotal, 80e9)
	b.Publish("gpu-a:8000", hot)

	counts := map[string]int{}
	for range 100 {
		p, _ := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		counts[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	fmt.Println("gpu-b takes every call:", counts["gpu-b:8000"] == 100)
	// Output: gpu-b takes every call: true
}

// Circuit-breaker trips, recoveries and ejections are reported as events,
// for logs and metrics.
func ExampleOptions_onEvent() {
	b := balancer.New(balancer.Options{
		OnEvent: func(ev balancer.Event) { fmt.Println(ev.Kind, ev.Endpoint) },
	})
	_ = b.Update([]inferlb.Endpoint{{Addr: "a:8000"}})
	for range balancer.DefaultBreakerFailures {
		p, _ := b.Pick(&inferlb.Request{})
		p.Done(inferlb.Outcome{Err: fmt.Errorf("connection refused")})
	}
	// Output: tripped a:8000
}

// Two adapters share one Balancer, each with its own membership: here the
// HTTP side reaches three replicas on port 8000 and the gRPC side two of
// them on port 8001, and cannot connect to one. Each routes over its own
// endpoints; the replicas they share (by ID) have one live state.
func ExampleBalancer_NewMembership() {
	b := balancer.New(balancer.Options{})
	httpSide, _ := b.NewMembership()
	grpcSide, _ := b.NewMembership()
	defer httpSide.Close()
	defer grpcSide.Close()
	_ = httpSide.Update([]inferlb.Endpoint{
		{ID: "r0", Addr: "10.0.0.5:8000"}, {ID: "r1", Addr: "10.0.0.6:8000"}, {ID: "r2", Addr: "10.0.0.7:8000"}})
	_ = grpcSide.Update([]inferlb.Endpoint{{ID: "r0", Addr: "10.0.0.5:8001"}, {ID: "r1", Addr: "10.0.0.6:8001"}})
	grpcSide.SetReady("r0", false) // its gRPC port is down; HTTP still reaches it

	p, _ := grpcSide.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
	fmt.Println("gRPC call to", p.ID())
	p.Done(inferlb.Outcome{})
	fmt.Println("endpoints in the Balancer:", len(b.Stats()))
	// Output:
	// gRPC call to r1
	// endpoints in the Balancer: 3
}

// An adapter that reads "this server has no such model" from an answer
// (vLLM's 404 for a LoRA adapter it has not loaded) reports it with
// NotServedModel: neither success nor failure, and that model's next calls
// go to the endpoints that have not said so.
func ExampleOptions_notServedMemory() {
	b := balancer.New(balancer.Options{})
	_ = b.Update([]inferlb.Endpoint{{Addr: "vllm-a:8000"}, {Addr: "vllm-b:8000"}})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "sql-lora"}
	for {
		p, _ := b.Pick(req)
		if p.ID() == "vllm-b:8000" { // vllm-b has not loaded the adapter
			p.Done(inferlb.Outcome{NotServedModel: "sql-lora"})
			break
		}
		p.Done(inferlb.Outcome{})
	}
	to := map[string]int{}
	for range 10 {
		p, _ := b.Pick(req)
		to[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	fmt.Println(to, b.Stats()[1].NotServed)
	// Output: map[vllm-a:8000:10] 1
}

// Two Triton servers serve the models "detector" and "ranker"; a while
// in, the detector's backend crashes on triton-b, which then answers its
// calls with an error at once while it serves the ranker. Done names each answered
// call's model (Outcome.Model), so those failures count against the
// detector on triton-b, not against triton-b: after five in a row its
// calls pass triton-b over, and the ranker's calls, four in flight at a
// time, still use both servers.
func ExampleEventModelFailing() {
	b := balancer.New(balancer.Options{OnEvent: func(e balancer.Event) {
		if e.Kind == balancer.EventModelFailing {
			fmt.Printf("%s fails on %s: passed over for %v\n", e.Model, e.Endpoint, e.Until.Sub(e.At))
		}
	}})
	_ = b.Update([]inferlb.Endpoint{{Addr: "triton-a:8001"}, {Addr: "triton-b:8001"}})
	var inFlight []balancer.Pick
	to := map[string]map[string]int{"ranker": {}, "detector": {}}
	for i := range 400 {
		p, _ := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "ranker"})
		inFlight = append(inFlight, p)
		if len(inFlight) > 4 {
			inFlight[0].Done(inferlb.Outcome{Model: "ranker"})
			inFlight = inFlight[1:]
		}
		d, _ := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "detector"})
		o := inferlb.Outcome{Model: "detector"}
		if d.ID() == "triton-b:8001" && i >= 100 { // the crash
			o.Err = errors.New("INTERNAL: Stub process is not healthy")
		}
		d.Done(o)
		if i >= 300 {
			to["ranker"][p.ID()]++
			to["detector"][d.ID()]++
		}
	}
	s := b.Stats()[1]
	fmt.Println(to["detector"], to["ranker"]["triton-b:8001"] > 30, s.Trips, s.Failures, s.ModelFailures)
	// Output:
	// detector fails on triton-b:8001: passed over for 10s
	// map[triton-a:8001:100] true 0 2 3
}
