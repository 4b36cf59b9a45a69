package grpcbalancer_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"

	core "github.com/inferlb/inferlb/balancer"
)

// oobServer serves the ORCA service and counts its open OOB streams.
type oobServer struct {
	testgrpc.UnimplementedTestServiceServer
	addr    string
	open    atomic.Int64
	changed chan<- struct{} // told, without blocking, after each change of open
}

// change adds d to the open streams and says so.
func (s *oobServer) change(d int64) {
	s.open.Add(d)
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (*oobServer) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// startOOB starts an oobServer that tells changed (buffered) when its
// open streams change.
func startOOB(t *testing.T, changed chan<- struct{}) *oobServer {
	t.Helper()
	s := &oobServer{changed: changed}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	srv := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.change(1)
		defer s.change(-1)
		return h(srv, ss)
	}))
	testgrpc.RegisterTestServiceServer(srv, s)
	smr := orca.NewServerMetricsRecorder()
	smr.SetApplicationUtilization(0.5)
	if err := orca.Register(srv, orca.ServiceOptions{ServerMetricsProvider: smr}); err != nil {
		t.Fatal(err)
	}
	run(t, srv, lis)
	return s
}

// waitOpen waits (5s at most) until the servers have want OOB streams open
// between them. It counts again each time one tells changed (the channel
// they were started with), not on a timer: the streams open and close on
// gRPC's goroutines.
func waitOpen(t *testing.T, ss []*oobServer, changed <-chan struct{}, want int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		// A change after this count is told on changed, whose buffer of
		// one keeps it until the select below.
		var n int64
		for _, s := range ss {
			n += s.open.Load()
		}
		if n == want {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%d ORCA streams open after 5s, want %d", n, want)
		}
	}
}

// Turning out-of-band ORCA on, changing its interval, turning it off, and
// endpoints leaving, on a live channel: each READY SubConn has exactly one
// ORCA stream while it is on and none after, and Close leaves none (nor a
// goroutine: TestMain's goleak).
func TestE2EOutOfBandORCAFollowsConfigAndEndpoints(t *testing.T) {
	changed := make(chan struct{}, 1)
	ss := []*oobServer{startOOB(t, changed), startOOB(t, changed), startOOB(t, changed)}
	name, _ := shared(t, core.Options{})
	state := func(n int, cfg string) resolver.State {
		var st resolver.State
		for _, s := range ss[:n] {
			st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: s.addr}}})
		}
		return st
	}
	conn, r := dial(t, nil, name, `{}`)
	push := func(n int, cfg string) {
		st := state(n, cfg)
		st.ServiceConfig = r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, name, cfg))
		if st.ServiceConfig.Err != nil {
			t.Fatal(st.ServiceConfig.Err)
		}
		r.UpdateState(st)
	}
	conn.Connect() // builds the resolver
	push(3, `{}`)
	ctx := testContext(t)
	client := testgrpc.NewTestServiceClient(conn)
	for range 30 { // every endpoint connected
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	waitOpen(t, ss, changed, 0)

	push(3, `{"orca": {"outOfBand": true, "interval": "50ms"}}`)
	waitOpen(t, ss, changed, 3)
	push(3, `{"orca": {"outOfBand": true, "interval": "60ms"}}`)
	waitOpen(t, ss, changed, 3)
	push(2, `{"orca": {"outOfBand": true, "interval": "60ms"}}`)
	waitOpen(t, ss, changed, 2)
	push(3, `{"orca": {"outOfBand": true, "interval": "60ms"}}`)
	for range 30 {
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	waitOpen(t, ss, changed, 3)
	push(3, `{"orca": {"outOfBand": false}}`)
	waitOpen(t, ss, changed, 0)
	push(3, `{"orca": {"outOfBand": true}}`)
	waitOpen(t, ss, changed, 3)
	conn.Close()
	waitOpen(t, ss, changed, 0)
}
