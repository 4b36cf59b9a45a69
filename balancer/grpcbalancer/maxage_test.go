package grpcbalancer_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/keepalive"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// gatedListener gives its server the first connection at once, the second
// only when the test sends on release, and none after that until Close: a
// reconnect waits, CONNECTING, where the test wants it.
type gatedListener struct {
	net.Listener
	arrived chan struct{} // the second connection is waiting
	release chan struct{} // let it through
	done    chan struct{} // closed by Close
	once    sync.Once

	mu sync.Mutex
	n  int
}

func newGatedListener(t *testing.T) *gatedListener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return &gatedListener{Listener: lis, arrived: make(chan struct{}, 1), release: make(chan struct{}, 1), done: make(chan struct{})}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.n++
	n := l.n
	l.mu.Unlock()
	if n == 1 {
		return c, nil
	}
	if n == 2 {
		l.arrived <- struct{}{}
		select {
		case <-l.release:
			return c, nil
		case <-l.done:
		}
	} else {
		<-l.done
	}
	c.Close()
	return nil, net.ErrClosed
}

func (l *gatedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// rotatingServer runs a test server that closes each connection after
// 50 ms (MaxConnectionAge, the same process), behind a gated listener
// that holds the second connection until released.
func rotatingServer(t *testing.T) (*gatedListener, *backend) {
	t.Helper()
	lis := newGatedListener(t)
	srv := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      50 * time.Millisecond,
		MaxConnectionAgeGrace: time.Minute,
	}))
	be := &backend{addr: lis.Addr().String()}
	testgrpc.RegisterTestServiceServer(srv, be)
	run(t, srv, lis)
	return lis, be
}

// A server's MaxConnectionAge (which Kubernetes deployments of gRPC servers
// set, often at 30 s to a few minutes, so that clients spread over new
// replicas) closes the connection with a graceful GOAWAY, and the channel
// connects again at once to the same, live process: the SubConn goes READY,
// IDLE, CONNECTING, READY, with no failed attempt between. That reconnect
// expires the endpoint's process load (telemetry.ProcessLoad), whoever
// published it: on a shared Balancer, a Poller's correct readings of that
// very process (KV cache, queue, GPU memory, LoRA adapters) are gone until
// its next scrape taken after the reconnect (which the Poller, woken by the
// expiry, takes at once: TestMaxConnectionAgeReconnectPollsAgainEarly),
// and its scrape taken before it, published after, is refused as the old
// process's.
//
// This pins that cost as accepted, not a behaviour to keep for its own
// sake. A restart with a gap shows a TRANSIENT_FAILURE between the READYs
// (the immediate reconnect is refused), a rotation does not; but the
// policy sees the same states as a rotation's when a new process answers
// the reconnect at once (a restart that hands its listening socket over,
// or whose socket systemd holds meanwhile), and keeping the old process's
// last report there (a full KV cache, a long queue) would price the new,
// idle process out of rotation (TestReconnectExpiresTheOldProcessReport,
// path "graceful"; TestFirstConnectKeepsTelemetryAReconnectExpiresIt).
// Nothing a balancer sees tells such a restart from a rotation.
func TestMaxConnectionAgeReconnectExpiresAPollerReading(t *testing.T) {
	lis, be := rotatingServer(t)

	// A Poller's scrapes of the live process (its model server's metrics,
	// and the GPU's), published before the channel connects (its first
	// connection expires nothing).
	clock := testutil.NewClock()
	name, b := shared(t, core.Options{Clock: clock})
	scrape := func(at time.Time) telemetry.Sample {
		s := telemetry.Sample{Time: at}
		s.Set(telemetry.KVCacheUsage, 0.4)
		s.Set(telemetry.Waiting, 3)
		s.SetAdapters(4, &telemetry.Adapters{Base: "llama", Running: []string{"sql-lora"}})
		return s
	}
	b.Telemetry().Publish(be.addr, scrape(clock.Now()))
	gpu := telemetry.Sample{Time: clock.Now()}
	gpu.Set(telemetry.GPUMemUsed, 60e9)
	gpu.Set(telemetry.GPUTemp, 65)
	b.Telemetry().Publish(be.addr, gpu)

	conn, _ := dial(t, []*backend{be}, name, `{}`)
	ctx := testContext(t)
	conn.Connect()
	// The first connection was READY, then closed by MaxConnectionAge
	// with a GOAWAY, and the channel is connecting again: the server
	// holds that connection until release, so the channel stays
	// CONNECTING (its only endpoint is) and cannot be READY before.
	select {
	case <-lis.arrived:
	case <-ctx.Done():
		t.Fatal("the server never closed its connection (MaxConnectionAge)")
	}
	for st := conn.GetState(); st != connectivity.Connecting; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the channel is %v, not reconnecting: %v", st, ctx.Err())
		}
	}
	tel := stats(t, b, be.addr).Telemetry
	require.True(t, tel.Has.Has(telemetry.KVCacheUsage) && tel.Has.Has(telemetry.LoRASlots) && tel.Has.Has(telemetry.GPUMemUsed), "the first connection expired the scrapes")

	clock.Advance(5 * time.Second)
	before := scrape(clock.Now()) // scraped while it reconnects, published after
	clock.Advance(5 * time.Second)
	lis.release <- struct{}{}
	// The channel leaves CONNECTING only when the reconnect is READY (the
	// policy has seen it by then); it may be IDLE again since, as the new
	// connection has a MaxConnectionAge too, but cannot connect a third time.
	if !conn.WaitForStateChange(ctx, connectivity.Connecting) {
		t.Fatalf("the reconnect never got READY: %v", ctx.Err())
	}
	require.NotEqual(t, connectivity.TransientFailure, conn.GetState())

	tel = stats(t, b, be.addr).Telemetry
	for _, f := range []telemetry.Field{telemetry.KVCacheUsage, telemetry.Waiting, telemetry.GPUMemUsed, telemetry.LoRASlots} {
		assert.False(t, tel.Has.Has(f), "%v survived the MaxConnectionAge reconnect (see the comment above before changing that)", f)
	}
	assert.Nil(t, tel.Adapters)
	assert.True(t, tel.Has.Has(telemetry.GPUTemp), "the reconnect expired the GPU's own reading")

	dropped := b.Telemetry().Stats().DroppedOld
	b.Telemetry().Publish(be.addr, before)
	assert.Equal(t, dropped+1, b.Telemetry().Stats().DroppedOld, "the scrape taken before the reconnect was not refused")
	assert.False(t, stats(t, b, be.addr).Telemetry.Has.Has(telemetry.KVCacheUsage))

	// The next scrape after the reconnect brings the readings back.
	clock.Advance(time.Second)
	b.Telemetry().Publish(be.addr, scrape(clock.Now()))
	tel = stats(t, b, be.addr).Telemetry
	assert.True(t, tel.Has.Has(telemetry.KVCacheUsage) && tel.Has.Has(telemetry.LoRASlots), "a scrape after the reconnect was refused")
}

// signalSink is the Balancer as a Poller's Sink (its Expired included),
// telling the test each time the Poller has published.
type signalSink struct {
	*core.Balancer
	published chan struct{}
}

func (s signalSink) Publish(id string, smp telemetry.Sample) {
	s.Balancer.Publish(id, smp)
	s.published <- struct{}{}
}

// TestMaxConnectionAgeReconnectPollsAgainEarly: the reconnect a server's
// MaxConnectionAge brings expires the endpoint's scraped readings (see
// TestMaxConnectionAgeReconnectExpiresAPollerReading), and the Poller
// publishing into the Balancer scrapes again at once: the readings are
// back after one scrape, not at the Poller's next Interval (an hour here;
// 15 s by default, so with connections rotated every 30 s an endpoint had
// no KV cache, queue or GPU memory reading for about a quarter of the time).
func TestMaxConnectionAgeReconnectPollsAgainEarly(t *testing.T) {
	lis, be := rotatingServer(t)

	clock := testutil.NewClock()
	name, b := shared(t, core.Options{Clock: clock})
	conn, _ := dial(t, []*backend{be}, name, `{}`)
	ctx := testContext(t)
	conn.Connect()
	select {
	case <-lis.arrived: // rotated once; the reconnect waits for release
	case <-ctx.Done():
		t.Fatal("the server never closed its connection (MaxConnectionAge)")
	}
	for st := conn.GetState(); st != connectivity.Connecting; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the channel is %v, not reconnecting: %v", st, ctx.Err())
		}
	}

	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		var s telemetry.Sample // stamped by the Poller with clock's time
		s.Set(telemetry.KVCacheUsage, 0.4)
		s.Set(telemetry.Waiting, 3)
		return []telemetry.Observation{{EndpointID: be.addr, Sample: s}}, nil
	})
	sink := signalSink{Balancer: b, published: make(chan struct{}, 4)}
	p, err := telemetry.NewPoller(src, sink, telemetry.PollerOptions{
		Interval: time.Hour, MinInterval: time.Millisecond, Jitter: -1, Clock: clock,
	})
	require.NoError(t, err)
	pctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	defer func() {
		stop()
		assert.ErrorIs(t, <-done, context.Canceled)
	}()
	published := func(what string) {
		t.Helper()
		select {
		case <-sink.published:
		case <-ctx.Done():
			t.Fatalf("no %s: %v", what, ctx.Err())
		}
	}
	published("first round")
	require.True(t, stats(t, b, be.addr).Telemetry.Has.Has(telemetry.KVCacheUsage), "the first round's reading")

	clock.Advance(10 * time.Second)
	lis.release <- struct{}{}
	if !conn.WaitForStateChange(ctx, connectivity.Connecting) {
		t.Fatalf("the reconnect never got READY: %v", ctx.Err())
	}
	published("round after the reconnect (the Poller's Interval is an hour)")
	tel := stats(t, b, be.addr).Telemetry
	assert.True(t, tel.Has.Has(telemetry.KVCacheUsage) && tel.Has.Has(telemetry.Waiting), "the reading did not come back")
	assert.True(t, tel.Time.Equal(clock.Now()), "the reading is not the new round's")
	assert.Equal(t, uint64(2), p.Stats().Rounds)
}
