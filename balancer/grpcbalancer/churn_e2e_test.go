package grpcbalancer_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"

	core "github.com/inferlb/inferlb/balancer"
)

// churnServer is one gRPC server behind many listeners, one per address
// of a pod that comes and goes: it counts its open connections and its
// open streams (the channel's out-of-band ORCA streams; calls are unary).
type churnServer struct {
	testgrpc.UnimplementedTestServiceServer
	conns, streams atomic.Int64
	changed        chan struct{} // told, without blocking, after each change
}

func (s *churnServer) change(n *atomic.Int64, d int64) {
	n.Add(d)
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (*churnServer) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// countingListener counts the connections it accepted that are open.
type countingListener struct {
	net.Listener
	s *churnServer
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.change(&l.s.conns, 1)
	return &countedConn{Conn: c, s: l.s}, nil
}

type countedConn struct {
	net.Conn
	s    *churnServer
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.s.change(&c.s.conns, -1) })
	return c.Conn.Close()
}

// A live channel whose resolver gives it a new set of pod addresses 100
// times, with calls and out-of-band ORCA on: at the end the servers have
// the current pods' connections and ORCA streams only (the policy shut
// down every SubConn of an address that left, and stopped its listener),
// and the shared core holds the current endpoints only.
func TestE2EResolverChurnLeavesTheCurrentConnectionsOnly(t *testing.T) {
	s := &churnServer{changed: make(chan struct{}, 1)}
	srv := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.change(&s.streams, 1)
		defer s.change(&s.streams, -1)
		return h(srv, ss)
	}))
	testgrpc.RegisterTestServiceServer(srv, s)
	smr := orca.NewServerMetricsRecorder()
	smr.SetApplicationUtilization(0.5)
	if err := orca.Register(srv, orca.ServiceOptions{ServerMetricsProvider: smr}); err != nil {
		t.Fatal(err)
	}
	var serving sync.WaitGroup
	t.Cleanup(func() {
		srv.Stop()
		serving.Wait()
	})
	listen := func() (net.Listener, string) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serving.Add(1)
		go func() {
			defer serving.Done()
			_ = srv.Serve(countingListener{Listener: lis, s: s})
		}()
		return lis, lis.Addr().String()
	}

	name, b := shared(t, core.Options{})
	conn, r := dial(t, nil, name, `{}`)
	conn.Connect()
	ctx := testContext(t)
	client := testgrpc.NewTestServiceClient(conn)
	const rounds, size = 100, 3
	var old []net.Listener
	for range rounds {
		var st resolver.State
		var lis []net.Listener
		for range size {
			l, a := listen()
			lis = append(lis, l)
			st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
		}
		st.ServiceConfig = r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"orca": {"outOfBand": true, "interval": "50ms"}}}]}`, name))
		if st.ServiceConfig.Err != nil {
			t.Fatal(st.ServiceConfig.Err)
		}
		r.UpdateState(st)
		for range 2 * size {
			if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
		}
		// The pods that left stop listening; their connections stay
		// open until the channel closes them.
		for _, l := range old {
			_ = l.Close()
		}
		old = lis
	}
	for range 10 * size { // every current endpoint connected
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for s.conns.Load() != size || s.streams.Load() != size {
		select {
		case <-s.changed:
		case <-wctx.Done():
			t.Fatalf("after %d sets of %d addresses: %d connections and %d ORCA streams open, want %d each", rounds, size, s.conns.Load(), s.streams.Load(), size)
		}
	}
	if n := len(b.Stats()); n != size {
		t.Fatalf("the core has %d endpoints, want %d", n, size)
	}
}
