package grpcbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// Select the policy in the service config: generation calls are scored on
// load and KV-cache pressure, embeddings on latency, and a session header
// keeps a conversation on one replica. UnaryRetry fails calls a dying
// replica accepted but never answered over to another one.
func Example() {
	conn, err := grpc.NewClient("dns:///llm.internal:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb": {
			"methods": {"/ai.Generation/": "llm", "/ai.Embeddings/Embed": "embedding"},
			"affinityKeyHeader": "x-session-id",
			"orca": {"outOfBand": true, "interval": "5s"}
		}}]}`),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(3)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// ... make calls; put the session ID in the "x-session-id" metadata, or
	// a whole inferlb.Request in the context with inferlb.NewContext.

	// Output:
}

// UnaryEstimate and StreamEstimate give the policy each call's tokens from
// its request message. By default that is the message's size / 4, right
// for prompts of text; a proto that carries the prompt as token IDs is
// counted exactly by an estimator of its own.
func ExampleUnaryEstimate() {
	// Any generated message with repeated int32 input_ids and max_tokens.
	type tokenized interface {
		GetInputIds() []int32
		GetMaxTokens() int32
	}
	estimate := func(method string, req any) (prompt, maxOutput int) {
		if r, ok := req.(tokenized); ok {
			return len(r.GetInputIds()), int(r.GetMaxTokens())
		}
		return grpcbalancer.SizeEstimate(method, req) // text: bytes / 4
	}
	conn, err := grpc.NewClient("dns:///llm.internal:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb": {
			"methods": {"/ai.Generation/": "llm"}, "modelHeader": "x-model"}}]}`),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome(), grpcbalancer.UnaryEstimate(estimate)),
		grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil), grpcbalancer.StreamEstimate(estimate)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Output:
}

// One Balancer can route a process's gRPC and HTTP traffic together, so
// both see the same live load: register a policy built around it.
func ExampleNewBuilder() {
	b := core.New(core.Options{AffinitySeed: 0x5eed}) // also given to httpbalancer
	balancer.Register(grpcbalancer.NewBuilder("inferlb-shared", b))

	conn, err := grpc.NewClient("dns:///llm.internal:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb-shared": {}}]}`),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome())) // on every channel of the policy, as with "inferlb"
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Output:
}

// A resolver can tell the policy more than an address: an ID shared with
// the HTTP side, a capacity weight and the models served.
func ExampleWithEndpoint() {
	ep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.7:50051"}}}
	ep = grpcbalancer.WithEndpoint(ep, inferlb.Endpoint{
		ID:     "gpu-node-7",
		Weight: 2, // two GPUs
		Labels: map[string]string{"model": "llama-3-70b,llama-3-8b"},
	})
	fmt.Println(len(ep.Addresses), ep.Addresses[0].Addr)
	// Output: 1 10.0.0.7:50051
}

// With the stock DNS (or passthrough) resolver, which gives addresses only,
// the config says what each address serves: a call whose "x-model"
// metadata names an adapter goes only to the replica that lists it. A
// mistake in an entry names it, when the channel receives the config.
func Example_endpoints() {
	conn, err := grpc.NewClient("dns:///llm.internal:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb": {
			"modelHeader": "x-model",
			"endpoints": {
				"10.0.0.5:50051": {"labels": {"model": "llama-3-8b,llama-3-8b-sql-lora"}},
				"10.0.0.6:50051": {"weight": 2, "labels": {"model": "llama-3-8b"}}
			}
		}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	p := balancer.Get(grpcbalancer.Name).(balancer.ConfigParser)
	_, err = p.ParseConfig([]byte(`{"endpoints": {"10.0.0.5": {"labels": {"model": "llama-3-8b"}}}}`))
	fmt.Println(err)
	// Output:
	// inferlb: service config field endpoints["10.0.0.5"]: want an address as the resolver gives it, host:port with a port from 1 to 65535 (10.0.0.5:8000, [fd00::5]:8000, llm-0.llm.svc:8000)
}

// The config is checked once, when the channel receives it; a mistake
// names the field.
func ExampleBuilder_ParseConfig() {
	p := balancer.Get(grpcbalancer.Name).(balancer.ConfigParser)
	_, err := p.ParseConfig([]byte(`{"balancer": {"errorAlpha": 1.5}}`))
	fmt.Println(err)
	_, err = p.ParseConfig([]byte(`{"methods": {"/ai.Generation/": "vision"}}`))
	fmt.Println(err)
	// Output:
	// inferlb: service config field balancer.errorAlpha: balancer.Options.ErrorAlpha = 1.5: must be in [0, 1]
	// inferlb: service config field methods["/ai.Generation/"]: unknown service "vision" (want llm, embedding, rerank or unknown)
}

// tokenChunk stands for a generated stream message that says how many
// tokens it carries (a Triton decoupled response with a batch of tokens,
// say).
type tokenChunk interface{ TokenCount() int }

// Time token streams: the first message with output is the first token, and
// the counter reads how many tokens each message carries (nil counts one
// per message). The balancer then knows each replica's time to first token
// and decode speed.
func ExampleStreamTiming() {
	count := func(msg any) int {
		if c, ok := msg.(tokenChunk); ok {
			return c.TokenCount()
		}
		return 1
	}
	conn, err := grpc.NewClient("dns:///llm.internal:8001",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb": {"methods": {"/inference.GRPCInferenceService/": "llm"}}}]}`),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome()), // for the service's unary calls
		grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(count)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Output:
}

// streamResponse stands for Triton's ModelStreamInferResponse (from the
// KServe v2 protos), whose ErrorMessage is set when the request failed.
type streamResponse struct{ ErrorMessage string }

// Read the failures a decoupled model reports inside the stream: Triton
// sends a message with error_message set (its queue full, a TensorRT-LLM
// executor error) and ends the stream OK. With Error, such a stream counts
// as the endpoint's failure, or as an overload answer when Triton shed the
// request, instead of a quick success.
func ExampleStreamTimingWith() {
	conn, err := grpc.NewClient("dns:///trtllm.internal:8001",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"inferlb": {"methods": {"/inference.GRPCInferenceService/ModelStreamInfer": "llm"}}}]}`),
		grpc.WithChainStreamInterceptor(grpcbalancer.StreamTimingWith(grpcbalancer.StreamOptions{
			Error: func(msg any) error {
				if r, ok := msg.(*streamResponse); ok && r.ErrorMessage != "" {
					return errors.New(r.ErrorMessage)
				}
				return nil
			},
		})),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome())) // the channel's unary calls (ModelInfer, ...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Output:
}

// A model server sends the load the policy reads with grpc-go's orca
// package: per-call reports in each call's trailer (the policy reads them
// unless "orca": {"perCall": false}), and, for channels whose config sets
// "orca": {"outOfBand": true}, a stream of reports from the ORCA service.
// The names are those the package doc lists (ORCA load reports).
func Example_orcaServer() {
	srv := grpc.NewServer(orca.CallMetricsServerOption(nil)) // per-call reports
	defer srv.Stop()

	// Out-of-band: the ORCA service reports what the recorder holds, at
	// once and then at most every 30s (see DefaultOOBInterval).
	load := orca.NewServerMetricsRecorder()
	if err := orca.Register(srv, orca.ServiceOptions{ServerMetricsProvider: load}); err != nil {
		log.Fatal(err)
	}
	load.SetNamedUtilization("kv_cache_usage", 0.42) // update as the engine's KV cache fills
	// The recorder drops a named utilization above 1: counts such as
	// num_requests_waiting go out of band as NamedMetrics, from a
	// ServerMetricsProvider of your own, or per call as below.

	// Per call, in a handler of the service you register on srv. The
	// recorder is nil on a server without CallMetricsServerOption.
	handler := func(ctx context.Context) {
		if rec := orca.CallMetricsRecorderFromContext(ctx); rec != nil {
			rec.SetNamedMetric("kv_cache_usage", 0.42)
			rec.SetNamedMetric("num_requests_waiting", 3)
		}
	}
	_ = handler
	// Output:
}
