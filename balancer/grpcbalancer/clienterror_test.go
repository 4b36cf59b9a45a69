package grpcbalancer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// keyServer answers EmptyCall after 20 ms of work on the core's fake
// clock, or, with refuse set, UNAUTHENTICATED at once: a replica started
// with the wrong API key.
type keyServer struct {
	testgrpc.UnimplementedTestServiceServer
	clock  *testutil.Clock
	refuse atomic.Bool
	calls  atomic.Int64
}

func (s *keyServer) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	s.calls.Add(1)
	if s.refuse.Load() {
		return nil, status.Error(codes.Unauthenticated, "invalid API key")
	}
	s.clock.Advance(20 * time.Millisecond)
	return &testgrpc.Empty{}, nil
}

// TestE2EFastUnauthenticatedDrawsNoTraffic: of three embedding servers on
// loopback, one answers every call UNAUTHENTICATED at once. The policy
// counted that as a success, the fastest of all, and sent that server
// nearly every call; it is a client error now, and the server draws a
// handful of the calls.
func TestE2EFastUnauthenticatedDrawsNoTraffic(t *testing.T) {
	clock := testutil.NewClock()
	servers := make([]*keyServer, 3)
	for i := range servers {
		servers[i] = &keyServer{clock: clock}
	}
	bs := testBackends(t, servers...)
	name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(3), SlowStartWindow: -1})
	conn, _ := dial(t, bs, name, `{"defaultService": "embedding"}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	// Every server connected and answering before the key goes bad.
	callUntil(t, client, ctx, func() bool {
		return servers[0].calls.Load() > 0 && servers[1].calls.Load() > 0 && servers[2].calls.Load() > 0
	})
	bad := servers[2]
	bad.refuse.Store(true)
	before := bad.calls.Load()
	const n = 300
	refused := 0
	for range n {
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
		switch status.Code(err) {
		case codes.OK:
		case codes.Unauthenticated:
			refused++
		default:
			t.Fatal(err)
		}
	}
	drew := bad.calls.Load() - before
	t.Logf("the server answering UNAUTHENTICATED drew %d of %d calls", drew, n)
	if drew > n/20 {
		t.Errorf("the server answering UNAUTHENTICATED drew %d of %d calls", drew, n)
	}
	s := stats(t, b, bs[2].addr)
	if s.ClientErrors != uint64(refused) || s.Failures != 0 || s.BreakerOpen {
		t.Errorf("client errors %d (want %d), failures %d, breaker open %v", s.ClientErrors, refused, s.Failures, s.BreakerOpen)
	}
}

// testBackends serves each TestService implementation on loopback (serve)
// and returns them as backends, in order.
func testBackends[S testgrpc.TestServiceServer](t *testing.T, servers ...S) []*backend {
	t.Helper()
	bs := make([]*backend, len(servers))
	for i, s := range servers {
		bs[i] = &backend{addr: serve(t, func(srv *grpc.Server) { testgrpc.RegisterTestServiceServer(srv, s) })}
	}
	return bs
}

// callUntil makes EmptyCalls (wait for ready) with ctx until done reports
// true, failing t on an error or when 10s of calls did not get there
// (some server never connected). A count of calls, 1000 of them, took
// less than a busy machine may take to connect a server (see warm).
func callUntil(t *testing.T, client testgrpc.TestServiceClient, ctx context.Context, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; !done(); n++ {
		if time.Now().After(deadline) {
			t.Fatalf("some server got none of %d calls in 10s", n)
		}
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
}
