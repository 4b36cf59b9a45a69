package grpcbalancer_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// rejectingServer serves a TestService whose tap handle rejects every call
// RESOURCE_EXHAUSTED before reading it, as a rate limiter there does.
func rejectingServer(t *testing.T) *backend {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.InTapHandle(func(context.Context, *tap.Info) (context.Context, error) {
		return nil, status.Error(codes.ResourceExhausted, "rate limited")
	}))
	b := &backend{addr: lis.Addr().String()}
	testgrpc.RegisterTestServiceServer(srv, b)
	run(t, srv, lis)
	return b
}

// A call the server rejects before the client has written its request (a
// 1 MiB prompt, over HTTP/2's 64 KiB initial window, rejected unread)
// reaches the policy's Done without error: grpc-go ends the attempt with
// the request write's io.EOF. Through UnaryOutcome, or UnaryRetry, the
// policy reads the call's own error instead: every rejection is the
// overload it is. (Without either, 3 to 8 of these 20 counted as
// successes: benchmarks/experiments/grpc-early-rejection.patch.)
func TestEarlyRejectionIsAnOverloadThroughTheInterceptor(t *testing.T) {
	for _, tc := range []struct {
		name string
		ic   grpc.UnaryClientInterceptor
	}{
		{"UnaryOutcome", grpcbalancer.UnaryOutcome()},
		{"UnaryRetry", grpcbalancer.UnaryRetry(3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := rejectingServer(t)
			name, cb := shared(t, core.Options{})
			conn, _ := dial(t, []*backend{b}, name, `{}`, grpc.WithChainUnaryInterceptor(tc.ic))
			client := testgrpc.NewTestServiceClient(conn)
			big := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1<<20)}}
			for range 20 {
				_, err := client.UnaryCall(testContext(t), big, grpc.WaitForReady(true))
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("a rejected call: %v", err)
				}
			}
			s := stats(t, cb, b.addr)
			if s.Successes != 0 || s.Overloads != 20 || s.Failures != 0 || s.InFlight != 0 {
				t.Errorf("20 calls rejected unread: %d successes, %d overloads, %d failures, %d in flight; want 0, 20, 0, 0",
					s.Successes, s.Overloads, s.Failures, s.InFlight)
			}
		})
	}
}

// Through UnaryOutcome, a call that succeeds is a success, reported when
// the call returns, and none stays in flight.
func TestUnaryOutcomeCountsSuccesses(t *testing.T) {
	bs := fleet(t, 1, nil)
	name, cb := shared(t, core.Options{})
	conn, _ := dial(t, bs, name, `{}`, grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome()))
	client := testgrpc.NewTestServiceClient(conn)
	for range 20 {
		if _, err := client.EmptyCall(testContext(t), &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	s := stats(t, cb, bs[0].addr)
	if s.Successes != 20 || s.Failures != 0 || s.Overloads != 0 || s.InFlight != 0 {
		t.Errorf("20 calls answered: %d successes, %d failures, %d overloads, %d in flight; want 20, 0, 0, 0",
			s.Successes, s.Failures, s.Overloads, s.InFlight)
	}
}
