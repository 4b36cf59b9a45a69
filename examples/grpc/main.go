// Command grpc shows the inferlb gRPC policy at work: it starts four local
// gRPC servers, one of them slow and one reporting (through per-call ORCA
// load reports) a nearly full KV cache, sends the same calls through the
// "inferlb" policy and through grpc-go's round_robin, least_request,
// ring_hash and pick_first, and prints how many
// calls each server got and how long the batch took. Then it streams
// token-by-token answers (server streams, one message per token), with the
// slow server decoding 4x slower, through inferlb with and without the
// StreamTiming interceptor, which lets the policy measure each server's
// time per output token.
//
//	go run ./examples/grpc
//	go run ./examples/grpc -calls 4000 -workers 32 -slow 20ms
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/leastrequest" // registers least_request_experimental
	_ "google.golang.org/grpc/balancer/ringhash"     // registers ring_hash_experimental
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/inferlb/inferlb/balancer/grpcbalancer" // registers "inferlb"
)

// server is one backend: grpc-go's interop TestService, of which only
// EmptyCall and StreamingOutputCall are used, so no protoc is needed.
type server struct {
	testgrpc.UnimplementedTestServiceServer
	name     string
	latency  time.Duration
	perToken time.Duration // StreamingOutputCall: time to generate each token after the first
	kvCache  float64       // reported per call through ORCA when > 0
	calls    atomic.Int64
}

// StreamingOutputCall streams one message per response parameter, as a
// model server streams tokens: the first at once, then one per perToken.
func (s *server) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	s.calls.Add(1)
	for i := range req.GetResponseParameters() {
		if i > 0 {
			t := time.NewTimer(s.perToken)
			select {
			case <-t.C:
			case <-ss.Context().Done():
				t.Stop()
				return ss.Context().Err()
			}
		}
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

func (s *server) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	s.calls.Add(1)
	if s.kvCache > 0 {
		// A model server would report its real KV-cache usage here; the
		// policy reads it from the trailer and steers new calls away.
		orca.CallMetricsRecorderFromContext(ctx).SetNamedMetric("kv_cache_usage", s.kvCache)
	}
	t := time.NewTimer(s.latency)
	defer t.Stop()
	select {
	case <-t.C:
		return &testgrpc.Empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func main() {
	calls := flag.Int("calls", 2000, "calls per policy")
	workers := flag.Int("workers", 16, "concurrent callers")
	fast := flag.Duration("fast", time.Millisecond, "latency of a healthy server")
	slow := flag.Duration("slow", 40*time.Millisecond, "latency of the slow server")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		log.Fatalf("unexpected arguments %q: every setting is a flag (-h lists them)", flag.Args())
	case *calls < 1:
		log.Fatalf("-calls %d: must be at least 1", *calls)
	case *workers < 1:
		log.Fatalf("-workers %d: must be at least 1", *workers)
	case *fast <= 0 || *slow <= 0:
		log.Fatalf("-fast %v, -slow %v: both must be positive", *fast, *slow)
	}
	cfg := config{calls: *calls, workers: *workers, fast: *fast, slow: *slow,
		streams: max(*calls/10, 20), tokenFast: 2 * time.Millisecond, tokenSlow: 8 * time.Millisecond}
	if _, _, err := run(os.Stdout, cfg); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// config is what the flags set: unary calls per policy, concurrent
// callers, the healthy and the slow server's latency; and the token streams
// per policy with the healthy and the slow server's time per token.
type config struct {
	calls, workers       int
	fast, slow           time.Duration
	streams              int
	tokenFast, tokenSlow time.Duration
}

// row is one line of a table: the calls (or streams) each server got
// through one policy.
type row struct {
	policy string
	calls  [4]int64
}

// run starts the servers, drives the calls and then the streams through
// each policy, writes the tables to out and returns their rows.
func run(out io.Writer, cfg config) (unary, streamed []row, err error) {
	calls, workers, fast, slow := cfg.calls, cfg.workers, cfg.fast, cfg.slow
	servers := []*server{
		{name: "slow", latency: slow, perToken: cfg.tokenSlow},
		{name: "healthy", latency: fast, perToken: cfg.tokenFast},
		{name: "healthy", latency: fast, perToken: cfg.tokenFast},
		{name: "kv-cache 99%", latency: fast, perToken: cfg.tokenFast, kvCache: 0.99},
	}
	counts := func() (c [4]int64) {
		for i, s := range servers {
			c[i] = s.calls.Load()
		}
		return c
	}
	var eps []resolver.Endpoint
	for _, s := range servers {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		srv := grpc.NewServer(orca.CallMetricsServerOption(nil))
		testgrpc.RegisterTestServiceServer(srv, s)
		go func() { _ = srv.Serve(lis) }()
		defer srv.Stop()
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: lis.Addr().String()}}})
	}

	// The same calls, the same servers; only the policy changes. The
	// methods entry tells inferlb what kind of calls these are: LLM calls
	// are scored on load and KV-cache pressure (latency mostly measures
	// prompt and output length), embedding calls on peak-EWMA latency.
	// UnaryOutcome (or UnaryRetry, which also fails calls over) belongs on
	// every channel that uses the policy: it gives the policy each call's
	// own error, which grpc-go alone misreports for calls the server
	// rejected before reading them.
	outcome := []grpc.DialOption{grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome())}
	policies := []struct {
		name, config string
		opts         []grpc.DialOption
	}{
		{"inferlb/llm", `{"inferlb": {"methods": {"/grpc.testing.TestService/": "llm"}}}`, outcome},
		{"inferlb/emb", `{"inferlb": {"methods": {"/grpc.testing.TestService/": "embedding"}}}`, outcome},
		// grpc-go's own policies, as they come: round_robin; least_request
		// (P2C on the calls in flight); ring_hash keyed by a header the
		// calls do not carry, so each call hashes at random (gRFC A76),
		// as calls without a session do; pick_first.
		// weighted_round_robin is left out: it weighs servers by the CPU
		// utilization and queries per second they report over ORCA, which
		// model servers do not report, and without them it is round_robin.
		{"round_robin", `{"round_robin": {}}`, nil},
		{"least_request", `{"least_request_experimental": {}}`, nil},
		{"ring_hash", `{"ring_hash_experimental": {"requestHashHeader": "x-session-id"}}`, nil},
		{"pick_first", `{"pick_first": {}}`, nil},
	}
	fmt.Fprintf(out, "%d calls, %d workers; server latencies: slow %v, healthy %v\n\n", calls, workers, slow, fast)
	fmt.Fprintf(out, "%-13s %8s %8s %8s %13s %9s\n", "policy", servers[0].name, servers[1].name, servers[2].name, servers[3].name, "elapsed")
	for _, p := range policies {
		reset := func() {
			for _, s := range servers {
				s.calls.Store(0)
			}
		}
		elapsed, err := drive(eps, p.config, p.opts, calls, workers, reset)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.name, err)
		}
		c := counts()
		unary = append(unary, row{p.name, c})
		fmt.Fprintf(out, "%-13s %8d %8d %8d %13d %9v\n", p.name, c[0], c[1], c[2], c[3], elapsed.Round(time.Millisecond))
	}
	fmt.Fprintln(out, `
inferlb/llm prices LLM calls on load and KV-cache pressure, not latency: it
keeps most calls off the server whose KV cache is 99% full, where a real model
server would queue or preempt them (this one does not slow down, so the
elapsed column does not show what that saves). inferlb/emb prices latency,
as for embedding calls, and all but drops the slow server.`)

	// Token streams: 32 tokens each, the slow server decoding at 8 ms per
	// token against 2 ms (as main sets them). In-flight counts alone already send it fewer
	// streams (its streams last longer); with StreamTiming the policy also
	// knows it decodes 4x slower and prices it so.
	streams := cfg.streams
	fmt.Fprintf(out, "\n%d token streams of 32 tokens, %d workers; time per token: slow %v, others %v\n\n", streams, workers, cfg.tokenSlow, cfg.tokenFast)
	fmt.Fprintf(out, "%-22s %8s %8s %8s %13s %9s\n", "policy", servers[0].name, servers[1].name, servers[2].name, servers[3].name, "elapsed")
	llm := `{"inferlb": {"methods": {"/grpc.testing.TestService/": "llm"}}}`
	for _, p := range []struct {
		name, config string
		opts         []grpc.DialOption
	}{
		{"inferlb + StreamTiming", llm, []grpc.DialOption{grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil))}},
		{"inferlb", llm, nil},
		{"round_robin", `{"round_robin": {}}`, nil},
		{"least_request", `{"least_request_experimental": {}}`, nil},
	} {
		reset := func() {
			for _, s := range servers {
				s.calls.Store(0)
			}
		}
		elapsed, err := driveStreams(eps, p.config, p.opts, streams, workers, reset)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.name, err)
		}
		c := counts()
		streamed = append(streamed, row{p.name, c})
		fmt.Fprintf(out, "%-22s %8d %8d %8d %13d %9v\n", p.name, c[0], c[1], c[2], c[3], elapsed.Round(time.Millisecond))
	}
	// Each channel has a Balancer of its own, and only EmptyCall reports
	// the KV cache: these streams' channels never learn it.
	fmt.Fprintln(out, `
The kv-cache server reports its load on the unary calls only, so to these
streams it is one more healthy server.`)
	return unary, streamed, nil
}

// drive sends calls EmptyCalls from workers goroutines through a channel
// using the given loadBalancingConfig entry and dial options, and returns
// how long they took. It calls reset after warming the connections up,
// before the batch.
func drive(eps []resolver.Endpoint, lbConfig string, opts []grpc.DialOption, calls, workers int, reset func()) (time.Duration, error) {
	conn, err := dial(eps, lbConfig, opts...)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	call := func() error {
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
		return err
	}
	// Warm up so every connection is up before the clock starts.
	for range 2 * len(eps) {
		if err := call(); err != nil {
			return 0, err
		}
	}
	reset()
	start := time.Now()
	err = parallel(calls, workers, call)
	return time.Since(start), err
}

// driveStreams runs streams token streams from workers goroutines through a
// channel using the given loadBalancingConfig entry and dial options, and
// returns how long they took. It calls reset after a warm-up round that
// gives every server a stream (and the policy its speed), before the batch.
func driveStreams(eps []resolver.Endpoint, lbConfig string, opts []grpc.DialOption, streams, workers int, reset func()) (time.Duration, error) {
	conn, err := dial(eps, lbConfig, opts...)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &testgrpc.StreamingOutputCallRequest{ResponseParameters: make([]*testgrpc.ResponseParameters, 32)}
	stream := func() error {
		st, err := client.StreamingOutputCall(ctx, req, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	// Warm up in parallel, so that every server takes a stream.
	if err := parallel(len(eps), len(eps), stream); err != nil {
		return 0, err
	}
	reset()
	start := time.Now()
	err = parallel(streams, workers, stream)
	return time.Since(start), err
}

// dial connects to eps through a manual resolver with the given
// loadBalancingConfig entry.
func dial(eps []resolver.Endpoint, lbConfig string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("example")
	r.InitialState(resolver.State{Endpoints: eps})
	return grpc.NewClient(r.Scheme()+":///fleet", append([]grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [` + lbConfig + `]}`),
	}, opts...)...)
}

// parallel runs call n times from workers goroutines and returns the first
// error (a worker stops at its first).
func parallel(n, workers int, call func() error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := call(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
