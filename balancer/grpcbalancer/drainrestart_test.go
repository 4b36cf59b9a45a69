package grpcbalancer_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// restarting is one loopback address that first answers as a draining
// replica does, a GOAWAY on every stream it is asked to open (refuser),
// and after up as a real backend (a grpc.Server on the same listener):
// a replica restarted behind a listener that stays, as a sidecar's does
// while it drains and its application restarts. It is stopped when the
// test ends.
type restarting struct {
	addr   string
	drain  refuser  // counts the streams drained
	be     *backend // serves once up
	isUp   atomic.Bool
	upConn atomic.Int64 // connections the real server took

	mu     sync.Mutex
	conns  []net.Conn // the draining side's
	accept chan net.Conn
}

func startRestarting(t *testing.T) *restarting {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &restarting{addr: lis.Addr().String(), be: &backend{}, accept: make(chan net.Conn)}
	r.be.addr = r.addr
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, r.be)
	cl := &chanListener{c: r.accept, addr: lis.Addr(), done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(cl)
	}()
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			if r.isUp.Load() {
				r.upConn.Add(1)
				select {
				case r.accept <- c:
				case <-cl.done:
					_ = c.Close()
					return
				}
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r.drain.serve(c, true)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		srv.Stop() // closes cl
		r.closeDraining()
		wg.Wait()
	})
	return r
}

// up ends the drain: connections from now on go to the real server, and
// the draining side's are closed.
func (r *restarting) up() {
	r.isUp.Store(true)
	r.closeDraining()
}

func (r *restarting) closeDraining() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// chanListener is a net.Listener whose connections come from c.
type chanListener struct {
	c    chan net.Conn
	addr net.Addr
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// A replica restarted behind a listener that drained every connection with
// a GOAWAY (a sidecar's, as its application restarted) leaves gRPC's
// streams unprocessed, which cool it down as overload answers without a
// hint do, so that gRPC's transparent retry goes elsewhere. They were also
// counted as refusals in a row: three streams drained, each sent after the
// last one's cooldown, put it on probation until 5s after the last, and
// once back it took none of the first 30 calls (its peers took them all).
// A drained stream is no refusal (inferlb.Outcome.Drained): no row, no
// probation, and it takes its share once back. Slow start is off: a
// reconnect that went through TRANSIENT_FAILURE ramps it, which is
// another matter.
func TestE2EDrainedReplicaTakesCallsWhenBack(t *testing.T) {
	bs := fleet(t, 2, nil)
	rs := startRestarting(t)
	clock := testutil.NewClock()
	name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1), PanicThreshold: -1, OutlierInterval: -1, SlowStartWindow: -1})
	conn, _ := dial(t, append(bs, &backend{addr: rs.addr}), name, `{}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	wfr := grpc.WaitForReady(true)

	const drained = 3
	for n := 0; rs.drain.streams.Load() < drained; n++ {
		if n == 3000 {
			t.Fatalf("the draining replica saw %d of 3000 calls", rs.drain.streams.Load())
		}
		clock.Advance(2 * core.DefaultCooldown) // past any cooldown
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, wfr); err != nil {
			t.Fatalf("call %d: %v (gRPC retries an unprocessed stream transparently)", n, err)
		}
	}
	s := endpointStats(t, b, rs.addr)
	if got, want := int64(s.Overloads), rs.drain.streams.Load(); got != want || s.Failures != 0 {
		t.Errorf("drained streams: %d overloads and %d failures, want %d and 0", got, s.Failures, want)
	}
	if s.ExcludedUntil.IsZero() {
		t.Error("the last drained stream did not cool the replica down")
	}
	if s.OverloadStreak != 0 || !s.ProbationUntil.IsZero() {
		t.Errorf("%d drained streams counted as refusals in a row: streak %d, on probation until %v (now %v)",
			rs.drain.streams.Load(), s.OverloadStreak, s.ProbationUntil, clock.Now())
	}

	rs.up()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := testhook.Await(wctx, b, func() bool {
		return rs.upConn.Load() > 0 && endpointStats(t, b, rs.addr).Ready
	}); err != nil {
		t.Fatalf("the replica is not back in 10s: %v", err)
	}
	clock.Advance(2 * core.DefaultCooldown) // past the last drain's cooldown
	before := rs.be.calls.Load()
	const calls = 30
	for n := range calls {
		clock.Advance(10 * time.Millisecond)
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, wfr); err != nil {
			t.Fatalf("call %d after the restart: %v", n, err)
		}
	}
	got := rs.be.calls.Load() - before
	t.Logf("the restarted replica took %d of the first %d calls", got, calls)
	if got < calls/6 {
		t.Errorf("the restarted replica took %d of the first %d calls, want at least %d (a fair share is %d)", got, calls, calls/6, calls/3)
	}
}
