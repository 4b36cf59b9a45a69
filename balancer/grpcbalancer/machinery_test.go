package grpcbalancer_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
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
