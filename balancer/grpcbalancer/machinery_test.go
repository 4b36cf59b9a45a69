package grpcbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// failingCreds are per-RPC credentials whose token source fails for the
// calls whose context carries a credsDown error, as when a metadata server
// or an OAuth endpoint is down: gRPC ends those calls with that error (a
// status error keeps its code, any other becomes UNAUTHENTICATED) before
// it creates a stream, on whatever endpoint was picked.
type failingCreds struct{}

type credsDown struct{}

func (failingCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if err, ok := ctx.Value(credsDown{}).(error); ok {
		return nil, err
	}
	return nil, nil
}

func (failingCreds) RequireTransportSecurity() bool { return false }

// A call that never reached its endpoint says nothing about it: a local
// failure before the stream exists (here the per-RPC credentials) must
// count neither as the endpoint's failure (a token outage would trip every
// breaker and shut the fleet out once the tokens are back) nor as its
// success (an instant "answer" that makes it look fast).
func TestE2ECallNeverSentCountsAsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"status error", status.Error(codes.Unavailable, "token source unreachable"), codes.Unavailable},
		{"plain error", errors.New("token source unreachable"), codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := fleet(t, 1, nil)
			name, b := shared(t, core.Options{PanicThreshold: -1, OutlierInterval: -1})
			conn, _ := dial(t, bs, name, `{}`, grpc.WithPerRPCCredentials(failingCreds{}))
			client := testgrpc.NewTestServiceClient(conn)
			ctx := testContext(t)
			if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
			before := endpointStats(t, b, bs[0].addr)
			down := context.WithValue(ctx, credsDown{}, tc.err)
			for range 2 * core.DefaultBreakerFailures {
				if _, err := client.EmptyCall(down, &testgrpc.Empty{}); status.Code(err) != tc.code {
					t.Fatalf("call without a token: %v, want %v from the credentials", err, tc.code)
				}
			}
			if got := bs[0].calls.Load(); got != 1 {
				t.Fatalf("the backend saw %d calls, want only the first", got)
			}
			s := endpointStats(t, b, bs[0].addr)
			if s.Failures != before.Failures || s.Successes != before.Successes || !s.ExcludedUntil.IsZero() {
				t.Errorf("calls that never left the client counted for the endpoint: failures %d -> %d, successes %d -> %d, excluded until %v",
					before.Failures, s.Failures, before.Successes, s.Successes, s.ExcludedUntil)
			}
			if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
				t.Errorf("a call once the tokens are back: %v", err)
			}
		})
	}
}

// failing is a backend whose EmptyCall fails with code while code is not OK.
type failing struct {
	*backend
	code atomic.Uint32 // codes.Code; OK = serve normally
}

func (f *failing) EmptyCall(ctx context.Context, in *testgrpc.Empty) (*testgrpc.Empty, error) {
	if c := codes.Code(f.code.Load()); c != codes.OK {
		f.calls.Add(1)
		return nil, status.Error(c, "backend failure")
	}
	return f.backend.EmptyCall(ctx, in)
}

// failingFleet starts n failing backends, serving normally until told.
func failingFleet(t testing.TB, n int) ([]*failing, []*backend) {
	t.Helper()
	fs := make([]*failing, n)
	bs := make([]*backend, n)
	for i := range fs {
		bs[i] = &backend{}
		fs[i] = &failing{backend: bs[i]}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		bs[i].addr = lis.Addr().String()
		srv := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(srv, fs[i])
		bs[i].srv = srv
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(lis)
		}()
		t.Cleanup(func() {
			srv.Stop()
			<-done
		})
	}
	return fs, bs
}

// With panic routing off, once every READY endpoint's breaker is open a
// call that does not wait for ready fails at once, UNAVAILABLE, with a
// message that says why; one that waits fails at its deadline with the
// same reason as gRPC's "latest balancer error".
func TestE2EEveryBreakerOpenFailsFastAndSaysWhy(t *testing.T) {
	fs, bs := failingFleet(t, 2)
	conn, _ := dial(t, bs, "", `{"balancer": {"panicThreshold": -1, "breakerFailures": 2, "ejectionTime": "1m", "maxEjectedFraction": 1}}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	for _, f := range fs {
		f.code.Store(uint32(codes.Internal))
	}
	// Each endpoint's breaker opens after 2 failures; the calls after that
	// are refused by the picker.
	var err error
	for range 8 {
		if _, err = client.EmptyCall(ctx, &testgrpc.Empty{}); status.Code(err) == codes.Unavailable {
			break
		}
		if status.Code(err) != codes.Internal {
			t.Fatalf("call to a failing backend: %v", err)
		}
	}
	start := time.Now()
	_, err = client.EmptyCall(ctx, &testgrpc.Empty{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("with every breaker open: %v, want UNAVAILABLE", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the call took %v to fail; want at once", d)
	}
	msg := status.Convert(err).Message()
	t.Logf("message: %s", msg)
	for _, want := range []string{"inferlb: ", "2 READY", "breaker"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = client.EmptyCall(wctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "breaker") {
		t.Errorf("wait-for-ready call: %v, want DEADLINE_EXCEEDED with the reason", err)
	}
}

// genServer streams a generation under the test's control: it sends its
// first message at once, then waits for gate (or the call's end), then
// sends the rest or, with failAfter, fails after that many messages.
type genServer struct {
	testgrpc.UnimplementedTestServiceServer
	gate      chan struct{}
	failAfter atomic.Int64 // 0: never fail
}

func (g *genServer) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for i := range req.GetResponseParameters() {
		if n := g.failAfter.Load(); n > 0 && int64(i) == n {
			return status.Error(codes.Internal, "decoder crashed")
		}
		if i == 1 {
			select {
			case <-g.gate:
			case <-ss.Context().Done():
				return ss.Context().Err()
			}
		}
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

// serveGen starts g on loopback and returns its address.
func serveGen(t testing.TB, g *genServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// A server stream is one call to the core from its pick to its end: it is
// in flight while tokens arrive (not done at the headers or the first
// message), its outcome is its final status, and a stream the client
// abandons (cancels) is neither a success nor a failure.
func TestE2EServerStreamIsDoneWhenItEnds(t *testing.T) {
	g := &genServer{gate: make(chan struct{}, 1)}
	bk := &backend{addr: serveGen(t, g)}
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, []*backend{bk}, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
		grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	req := &testgrpc.StreamingOutputCallRequest{ResponseParameters: make([]*testgrpc.ResponseParameters, 4)}
	open := func(ctx context.Context) grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse] {
		t.Helper()
		st, err := client.StreamingOutputCall(ctx, req, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Header(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("first message: %v", err)
		}
		return st
	}
	check := func(what string, inFlight int64, successes, failures uint64) core.EndpointStats {
		t.Helper()
		s := endpointStats(t, b, bk.addr)
		if s.InFlight != inFlight || s.Successes != successes || s.Failures != failures {
			t.Fatalf("%s: in flight %d, successes %d, failures %d; want %d, %d, %d",
				what, s.InFlight, s.Successes, s.Failures, inFlight, successes, failures)
		}
		return s
	}

	st := open(ctx)
	check("after the headers and the first token", 1, 0, 0)
	g.gate <- struct{}{}
	n := 1
	for {
		if _, err := st.Recv(); err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
		n++
	}
	if n != 4 {
		t.Fatalf("received %d of 4 messages", n)
	}
	if s := check("after the stream ended", 0, 1, 0); s.TTFT <= 0 || s.TTFT > s.Latency {
		t.Errorf("TTFT %v with latency %v", s.TTFT, s.Latency)
	}

	// Abandoned after the first token: gRPC ends the attempt when the
	// context is canceled; the Recv that reports it comes after.
	cctx, cancel := context.WithCancel(ctx)
	st = open(cctx)
	check("abandoned stream, before the cancel", 1, 1, 0)
	cancel()
	if _, err := st.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("Recv after cancel: %v", err)
	}
	check("after the cancel", 0, 1, 0)

	// A stream that fails midway is the endpoint's failure.
	g.failAfter.Store(2)
	st = open(ctx)
	g.gate <- struct{}{}
	for {
		_, err := st.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Internal {
			t.Fatalf("stream that fails midway: %v", err)
		}
		break
	}
	check("after a stream failed midway", 0, 1, 1)
}

// retryServiceConfig is a service config with the policy's config cfg and
// a gRPC retry policy for every TestService method: up to 3 attempts on
// UNAVAILABLE, 10 ms apart.
func retryServiceConfig(cfg string) string {
	return fmt.Sprintf(`{"loadBalancingConfig": [{"inferlb": %s}],
		"methodConfig": [{"name": [{"service": "grpc.testing.TestService"}],
			"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
				"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`, cfg)
}

// gRPC's own retries (a retryPolicy in the service config) go through the
// picker like first attempts. With UnaryRetry installed the policy knows
// the call: a retry must not go back to the endpoint the call just failed
// on, which with session affinity would be every attempt, as the key's
// owner answers UNAVAILABLE (a model reloading, a draining server) until
// its breaker trips.
func TestE2EGRPCRetryAvoidsTheEndpointThatFailed(t *testing.T) {
	fs, bs := failingFleet(t, 2)
	conn, _ := dial(t, bs, "", `{}`,
		grpc.WithDefaultServiceConfig(retryServiceConfig(`{"affinityKeyHeader": "x-session-id"}`)),
		grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(2)))
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	// Connect both, then find a session backend 0 owns.
	if err := load(ctx, conn, 2, 20, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	var sctx context.Context
	for k := 0; sctx == nil; k++ {
		if k == 64 {
			t.Fatal("no session of 64 lands on backend 0")
		}
		kctx := metadata.AppendToOutgoingContext(ctx, "x-session-id", fmt.Sprint("session-", k))
		if peerOf(kctx, t, client) == bs[0].addr {
			sctx = kctx
		}
	}
	fs[0].code.Store(uint32(codes.Unavailable))
	before := counts(bs)
	if _, err := client.EmptyCall(sctx, &testgrpc.Empty{}); err != nil {
		t.Errorf("a call whose session's backend answers UNAVAILABLE: %v", err)
	}
	c := counts(bs)
	if got := c[0] - before[0]; got != 1 {
		t.Errorf("the failing backend took %d attempts of the call, want 1 (%v -> %v)", got, before, c)
	}
}
