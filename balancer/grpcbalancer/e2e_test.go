package grpcbalancer_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// backend is a real gRPC server on loopback that counts its calls.
type backend struct {
	testgrpc.UnimplementedTestServiceServer

	addr  string
	port  *testutil.PortHold // addr's port, held for the test, where start chose it
	srv   *grpc.Server
	calls atomic.Int64

	delay   time.Duration // how long each call is held
	started chan struct{} // if set, signalled (without blocking) as each call starts
	kv      float64       // per-call ORCA kv_cache_usage to report; 0 = none
	perMsg  time.Duration // StreamingOutputCall: time to "generate" each message after the first
	// hold, if set and on, holds each EmptyCall that b starts until its
	// context ends (the server stops), answering nothing (see holdGate).
	hold *holdGate
	// clock, if set, is the fake clock of the core that routes to b:
	// StreamingOutputCall then does not sleep perMsg but sends every
	// message at once, naming b in each, and the test's client advances
	// clock by a millisecond of prefill in its first receive and by perMsg
	// in each next one (decodingStream; see
	// TestE2EStreamTimingSteersFromASlowDecoder).
	clock *testutil.Clock
	// pace, if set, times EmptyCall on its fleet's count of calls instead
	// of the wall clock (see pace); slow makes b hold each call there.
	pace *pace
	slow bool
	smr  orca.ServerMetricsRecorder // out-of-band ORCA metrics; nil = no ORCA service
	// pushback, if set, answers the first EmptyCall RESOURCE_EXHAUSTED
	// with this retry pushback (grpc-retry-pushback-ms).
	pushback time.Duration
	// reject, if set, is the error every EmptyCall answers, or only those
	// whose x-model metadata is rejectModel when that is set.
	reject      error
	rejectModel string
	// rejectTrailer, if set, is the trailer sent with reject.
	rejectTrailer metadata.MD
	// window, if set, refuses an EmptyCall whose x-tokens metadata says
	// it is longer, with vLLM's INVALID_ARGUMENT text (or windowRefusal's,
	// if set: a format with the window and the tokens).
	window        int
	windowCode    codes.Code
	windowRefusal string
	// echo: UnaryCall and StreamingOutputCall with a payload answer
	// INVALID_ARGUMENT copying it, as Triton copies an input's name (see
	// UnaryCall).
	echo bool
}

func (b *backend) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	if md, _ := metadata.FromIncomingContext(ctx); b.window > 0 && len(md.Get("x-tokens")) > 0 {
		if n, _ := strconv.Atoi(md.Get("x-tokens")[0]); n > b.window {
			b.calls.Add(1)
			text, code := b.windowRefusal, b.windowCode
			if text == "" {
				text = "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages."
			}
			if code == codes.OK {
				code = codes.InvalidArgument
			}
			return nil, status.Errorf(code, text, b.window, n)
		}
	}
	if b.reject != nil && (b.rejectModel == "" || modelOf(ctx) == b.rejectModel) {
		b.calls.Add(1)
		if b.rejectTrailer != nil {
			_ = grpc.SetTrailer(ctx, b.rejectTrailer)
		}
		return nil, b.reject
	}
	if b.calls.Add(1) == 1 && b.pushback > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", fmt.Sprint(b.pushback.Milliseconds())))
		return nil, status.Error(codes.ResourceExhausted, "busy")
	}
	if b.pace != nil {
		if err := b.pace.call(ctx, b.slow); err != nil {
			return nil, err
		}
	}
	if b.started != nil {
		select {
		case b.started <- struct{}{}:
		default:
		}
	}
	if b.hold != nil && b.hold.on.Load() {
		b.hold.n.Add(1)
		select {
		case b.hold.arrived <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if b.kv > 0 {
		rec := orca.CallMetricsRecorderFromContext(ctx)
		rec.SetNamedMetric("kv_cache_usage", b.kv)
		rec.SetApplicationUtilization(b.kv)
	}
	if b.delay > 0 {
		t := time.NewTimer(b.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &testgrpc.Empty{}, nil
}

// holdGate holds the calls a backend starts once on is set: n counts
// them, and arrived (buffered, one) is told, without blocking, as each
// arrives. A held call writes nothing, so a test that stops the server
// when every call in flight to it is held knows none had begun its answer.
type holdGate struct {
	on      atomic.Bool
	n       atomic.Int64
	arrived chan struct{}
}

// StreamingOutputCall streams one message per response parameter, as a
// token stream: the first at once, each next one perMsg later.
func (b *backend) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	b.calls.Add(1)
	if body := req.GetPayload().GetBody(); b.echo && len(body) > 0 {
		return status.Errorf(codes.InvalidArgument, "unexpected inference input '%s' for model 'llm'", body) // see UnaryCall
	}
	if b.clock != nil {
		for range req.GetResponseParameters() {
			if err := ss.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(b.addr)}}); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range req.GetResponseParameters() {
		if i > 0 && b.perMsg > 0 {
			t := time.NewTimer(b.perMsg)
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

// start serves b on a fresh loopback port held for the test, or on the
// same port again once b's server is stopped (b restarts where it was), or
// on b.addr if the test set it. The held port (testutil.PortHold) refuses
// connections while b is down and is never free: another test's listener
// cannot be given it, to take b's calls or keep b from coming back.
func (b *backend) start(t testing.TB) {
	t.Helper()
	if b.port == nil && b.addr == "" {
		b.port = testutil.HoldPort(t)
	}
	listen := func() (net.Listener, error) { return net.Listen("tcp", b.addr) }
	if b.port != nil {
		b.addr, listen = b.port.Addr(), b.port.Listen
	}
	lis, err := listen()
	if err != nil {
		t.Fatalf("listen %s: %v", b.addr, err)
	}
	srv := grpc.NewServer(orca.CallMetricsServerOption(nil))
	testgrpc.RegisterTestServiceServer(srv, b)
	if b.smr != nil {
		if err := orca.Register(srv, orca.ServiceOptions{ServerMetricsProvider: b.smr}); err != nil {
			t.Fatal(err)
		}
	}
	b.srv = srv
	run(t, srv, lis)
}

// run serves srv on lis until the test ends, then stops it and waits for
// Serve to return (goleak checks nothing is left).
func run(t testing.TB, srv *grpc.Server, lis net.Listener) {
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

// fleet starts n backends; tweak may configure backend i before it starts.
func fleet(t testing.TB, n int, tweak func(i int, b *backend)) []*backend {
	t.Helper()
	bs := make([]*backend, n)
	for i := range bs {
		bs[i] = &backend{}
		if tweak != nil {
			tweak(i, bs[i])
		}
		bs[i].start(t)
	}
	return bs
}

func resolverState(bs []*backend) resolver.State {
	var s resolver.State
	for _, b := range bs {
		s.Endpoints = append(s.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: b.addr}}})
	}
	return s
}

var policySeq atomic.Int64

// dial connects to bs through a manual resolver with the given policy
// config; policy is the registered name to use ("" = grpcbalancer.Name).
func dial(t testing.TB, bs []*backend, policy, cfg string, opts ...grpc.DialOption) (*grpc.ClientConn, *manual.Resolver) {
	t.Helper()
	if policy == "" {
		policy = grpcbalancer.Name
	}
	r := manual.NewBuilderWithScheme(fmt.Sprintf("e2e%d", policySeq.Add(1)))
	r.InitialState(resolverState(bs))
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, policy, cfg)
	opts = append([]grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(sc),
	}, opts...)
	conn, err := grpc.NewClient(r.Scheme()+":///fleet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, r
}

// shared registers a NewBuilder policy around a fresh core and returns both.
// modelOf is the x-model metadata of an incoming call.
func modelOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-model"); len(v) > 0 {
		return v[0]
	}
	return ""
}

func shared(t testing.TB, opts core.Options) (string, *core.Balancer) {
	b := core.New(opts)
	name := fmt.Sprintf("inferlb-e2e-%d", policySeq.Add(1))
	balancer.Register(grpcbalancer.NewBuilder(name, b))
	return name, b
}

// load runs calls EmptyCalls on workers goroutines and returns the first error.
func load(ctx context.Context, conn *grpc.ClientConn, workers, calls int, opts ...grpc.CallOption) error {
	return loadWith(ctx, conn, workers, calls, 0, nil, opts...)
}

// loadWith is load that also runs hook on the worker that is about to
// start call number at, while the other workers keep calling.
func loadWith(ctx context.Context, conn *grpc.ClientConn, workers, calls, at int, hook func(), opts ...grpc.CallOption) error {
	client := testgrpc.NewTestServiceClient(conn)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(calls) {
					return
				}
				if n == int64(at) && hook != nil {
					hook()
				}
				if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, opts...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func counts(bs []*backend) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = b.calls.Load()
	}
	return out
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Calls spread over every backend: a policy that pinned a connection, or
// left a backend out, sends it none. The shares follow the calls each
// backend holds in flight on the wall clock, so a backend whose server
// goroutines the CPU serves late takes fewer: beside other jobs on 2 cores,
// one took 35 of 400 (a fair share is 100) with the floor at 40 (one
// run of four). The floor is a fifth of a fair share.
func TestE2ESpreadsLoad(t *testing.T) {
	bs := fleet(t, 4, nil)
	conn, _ := dial(t, bs, "", `{}`)
	ctx := testContext(t)
	warm(ctx, t, conn, bs) // count only calls made once every backend is connected
	before := counts(bs)
	if err := load(ctx, conn, 8, 400, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	c := counts(bs)
	for i := range c {
		c[i] -= before[i]
	}
	for i, n := range c {
		if n < 20 { // a fair share is 100
			t.Errorf("backend %d got %d of 400 calls: %v", i, n, c)
		}
	}
}

// A server slower than its peers gets fewer calls under every service's
// scorer: from the calls it holds in flight (unknown, llm) and, for
// embeddings, from its measured latency too.
//
// Speeds here are relative, not wall-clock (see pace): the slow server
// holds each call while the fleet starts 200 others, and the core's clock
// advances a millisecond per call started, so a held call measures about
// 200ms and a fast one a few dozen at most. The test used to sleep 50ms
// per slow call and time calls on the wall clock; under -race on a busy
// 2-core machine it failed 1 run in 25 (embedding), and 1 in 8 beside two
// spinning processes (unknown and llm too: 33-38 of 400 calls against
// 103-136). The client timed the fast servers' calls at 20-700ms there,
// queued on the CPU rather than on the server: peak-EWMA keeps the worst
// for its 10s time constant, so the embedding scorer priced the fast
// servers about as slow as the slow one; and with in-flight counts even,
// each server's share of the calls follows its speed (Little's law), so
// 50ms calls against fast ones slowed to 15ms took about a quarter.
// Slow start is off: the clock hardly moves, so a backend that connected
// after another was serving would ramp for the whole test, weighted down
// by connection order.
func TestE2ESlowServerGetsFewerCalls(t *testing.T) {
	const workers, calls, hold = 8, 400, 200
	for _, svc := range []string{"unknown", "llm", "embedding"} {
		t.Run(svc, func(t *testing.T) {
			clock := testutil.NewClock()
			p := newPace(clock, hold)
			bs := fleet(t, 4, func(i int, b *backend) {
				b.pace, b.slow = p, i == 0
			})
			name, bal := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1), SlowStartWindow: -1})
			conn, _ := dial(t, bs, name, fmt.Sprintf(`{"defaultService": %q}`, svc))
			ctx := testContext(t)
			warm(ctx, t, conn, bs) // count only calls made once every backend is connected
			before := counts(bs)
			p.arm(calls, workers)
			if err := load(ctx, conn, workers, calls, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
			c := counts(bs)
			for i := range c {
				c[i] -= before[i]
			}
			var lat []time.Duration
			for _, b := range bs {
				lat = append(lat, stats(t, bal, b.addr).Latency)
			}
			t.Logf("calls after warm-up, slow server first: %v; latency %v", c, lat)
			// Each held call keeps the slow server's in-flight count up, so
			// P2C prefers its peers until it finishes: it holds at most 3 or
			// 4 of the 8 workers' calls at once, each for half the load, so
			// about 10 calls against the others' 130 (7 to 14 in 150
			// subtests under -race beside two spinning processes, the
			// least-used peer taking at least 7 times as many).
			//
			// Embeddings compare all four (scoring.FullScanner), so a
			// fast server whose peak-EWMA caught one call paced slow
			// (latency 100ms and more) loses to its peers until it
			// decays, and this clock hardly moves: one peer may take few
			// calls ([7 217 171 5]). The slow server is held to a quarter
			// of its peers' mean instead (7 to 13 calls in 20 runs,
			// against 100 a peer).
			if svc == "embedding" {
				if peers := c[1] + c[2] + c[3]; c[0]*4*3 > peers {
					t.Errorf("the slow backend got %d calls, more than a quarter of its peers' mean %d: %v", c[0], peers/3, c)
				}
				return
			}
			for i := 1; i < 4; i++ {
				if c[0]*4 > c[i] {
					t.Errorf("the slow backend got %d calls, more than a quarter of backend %d's %d: %v", c[0], i, c[i], c)
				}
			}
		})
	}
}

// pace times a fleet's EmptyCalls on its own count of calls started, so
// that which server is slower, and by how much, does not depend on how
// fast a busy machine runs the test: each call started advances clock (the
// core's) by a millisecond, and once armed, a slow server holds each call
// until the fleet has started hold calls more. A held call is let go
// early once the load's last call has started (nothing would come to end
// it) or every worker waits in one (the balancer sent them all to the
// slow server: the test then fails on its counts, not on its deadline).
type pace struct {
	clock *testutil.Clock // immutable
	hold  int             // immutable

	mu      sync.Mutex
	started int           // calls started, the fleet's time
	end     int           // armed: let every held call go once started reaches it
	workers int           // armed: let every held call go once this many are held
	held    int           // calls being held
	flushes int           // how often every worker was held and let go
	changed chan struct{} // closed and replaced when started or flushes move
}

func newPace(clock *testutil.Clock, hold int) *pace {
	return &pace{clock: clock, hold: hold, changed: make(chan struct{})}
}

// arm starts holding slow calls, for a load of calls calls on workers
// workers; before it (while the test warms up one call at a time), no call
// is held.
func (p *pace) arm(calls, workers int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.end, p.workers = p.started+calls, workers
}

// call starts one call on the fleet and, when slow and armed, returns when
// the fleet has started hold calls more (or ctx ends).
func (p *pace) call(ctx context.Context, slow bool) error {
	p.mu.Lock()
	p.started++
	p.clock.Advance(time.Millisecond)
	p.wake()
	if !slow || p.workers == 0 {
		p.mu.Unlock()
		return nil
	}
	until, flushes := p.started+p.hold, p.flushes
	p.held++
	if p.held == p.workers {
		p.flushes++
		p.wake()
	}
	for p.started < until && p.started < p.end && p.flushes == flushes {
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			p.held--
			p.mu.Unlock()
			return ctx.Err()
		}
		p.mu.Lock()
	}
	p.held--
	p.mu.Unlock()
	return nil
}

// wake tells the held calls that something moved. Call it with mu held.
func (p *pace) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func TestE2ESaturatedORCAReportGetsFewerCalls(t *testing.T) {
	bs := fleet(t, 4, func(i int, b *backend) {
		if i == 0 {
			b.kv = 0.99 // KV cache nearly full: every call says so
		}
	})
	conn, _ := dial(t, bs, "", `{"methods": {"/grpc.testing.TestService/": "llm"}}`)
	// Connect every backend first, and count only the calls after. The
	// connections come up one by one, and a backend READY alone takes every
	// call, saturated or not: under -race on 2 busy cores backend 0 was
	// alone long enough to serve 24-30 calls before the others' first (1 in
	// ~400 runs), and then only 1 or 2 of the rest.
	ctx := testContext(t)
	warm(ctx, t, conn, bs)
	before := counts(bs)
	if err := load(ctx, conn, 4, 400, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	c := counts(bs)
	for i := range c {
		c[i] -= before[i]
	}
	for i := 1; i < 4; i++ {
		if c[0]*4 > c[i] {
			t.Errorf("the saturated backend got %d calls, more than a quarter of backend %d's %d: %v", c[0], i, c[i], c)
		}
	}
}

func TestE2EOutOfBandORCA(t *testing.T) {
	busy := orca.NewServerMetricsRecorder()
	busy.SetApplicationUtilization(0.99)
	busy.SetCPUUtilization(0.97)
	busy.SetNamedUtilization("kv_cache_usage", 0.98) // OOB reports carry named utilizations, in [0, 1]
	bs := fleet(t, 2, func(i int, b *backend) {
		b.smr = orca.NewServerMetricsRecorder()
		if i == 0 {
			b.smr = busy
		}
	})
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, bs, name, `{"orca": {"outOfBand": true, "perCall": false}}`)
	conn.Connect()

	// The ORCA service sends a first report as soon as the stream opens;
	// the policy publishes it on a goroutine of gRPC's. Look again at
	// each Publish (testhook), not on a timer, for at most 10s.
	var s telemetry.Sample
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := testhook.Await(ctx, b, func() bool {
		s, _ = b.Telemetry().Latest(bs[0].addr, time.Now(), time.Minute)
		return s.Has.Has(telemetry.AppUtil) && s.Has.Has(telemetry.KVCacheUsage)
	})
	if err != nil {
		t.Fatalf("no out-of-band report reached the telemetry store in 10s (have %+v)", s)
	}
	u, _ := s.Get(telemetry.AppUtil)
	kv, _ := s.Get(telemetry.KVCacheUsage)
	if u != 0.99 || kv != 0.98 {
		t.Fatalf("out-of-band report gave app_util %v kv_cache_usage %v, want 0.99 and 0.98", u, kv)
	}
}

// peerOf runs one call and returns the address that served it.
func peerOf(ctx context.Context, t testing.TB, client testgrpc.TestServiceClient) string {
	t.Helper()
	var p peer.Peer
	if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true), grpc.Peer(&p)); err != nil {
		t.Fatal(err)
	}
	return p.Addr.String()
}

func TestE2EAffinityKeyPinsAServer(t *testing.T) {
	bs := fleet(t, 4, nil)
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, bs, name, `{"methods": {"/grpc.testing.TestService/": "llm"}, "affinityKeyHeader": "x-session-id"}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	// Until every backend is connected, a key whose owner is still
	// connecting goes elsewhere: wait until every owner is READY. (A
	// warm-up of 200 calls left one unconnected now and then on a busy
	// machine.)
	allReady(t, conn, b, len(bs))
	if err := load(ctx, conn, 4, 200, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for k := range 24 {
		kctx := metadata.AppendToOutgoingContext(ctx, "x-session-id", fmt.Sprintf("conversation-%d", k))
		first := peerOf(kctx, t, client)
		used[first] = true
		for range 9 {
			if got := peerOf(kctx, t, client); got != first {
				t.Fatalf("session %d moved from %s to %s", k, first, got)
			}
		}
	}
	if len(used) < 2 {
		t.Errorf("24 sessions all landed on %v: keys are not spread", used)
	}
}

func TestE2ERemovingAServerMovesItsTraffic(t *testing.T) {
	bs := fleet(t, 4, nil)
	conn, r := dial(t, bs, "", `{}`)
	ctx := testContext(t)
	wfr := grpc.WaitForReady(true)
	// Every backend connected first: backend 3 must have calls to lose,
	// and on a busy machine one may take a second to connect (see warm),
	// longer than the 200 calls take.
	warm(ctx, t, conn, bs)
	if err := load(ctx, conn, 4, 200, wfr); err != nil {
		t.Fatal(err)
	}
	if bs[3].calls.Load() == 0 {
		t.Fatal("backend 3 got no calls before its removal")
	}

	// Remove backend 3 while calls are running: none may fail.
	remove := func() { r.UpdateState(resolverState(bs[:3])) }
	if err := loadWith(ctx, conn, 4, 400, 100, remove, wfr); err != nil {
		t.Fatalf("a wait-for-ready call failed across the removal: %v", err)
	}

	// The resolver update installed the new picker before returning, and
	// every call of the batch above has ended: backend 3 gets nothing more.
	before := bs[3].calls.Load()
	if err := load(ctx, conn, 4, 200, wfr); err != nil {
		t.Fatal(err)
	}
	if got := bs[3].calls.Load() - before; got != 0 {
		t.Errorf("the removed backend got %d calls after its removal", got)
	}
}

// Two channels on one shared core, each to its own fleet (an LLM service and
// an embedding service, say): each keeps its own endpoints and readiness, so
// both serve every call, on their own servers only.
func TestE2ETwoChannelsShareOneCore(t *testing.T) {
	llm, embed := fleet(t, 3, nil), fleet(t, 2, nil)
	name, b := shared(t, core.Options{})
	connA, _ := dial(t, llm, name, `{}`)
	connB, _ := dial(t, embed, name, `{}`)
	ctx := testContext(t)
	// Interleaved: each channel's updates land after the other's. A
	// server's subchannel may turn READY after a round's calls were all
	// sent, on a busy machine, so the rounds go on (for up to 10s) until
	// every server has served, the other servers serving meanwhile. Not
	// for up to 20 rounds: they took 0.7s under -race, less than a busy
	// machine may take to connect a server (see warm).
	everyServerCalled := func() bool {
		for _, bk := range append(slices.Clone(llm), embed...) {
			if bk.calls.Load() == 0 {
				return false
			}
		}
		return true
	}
	rounds := 0
	deadline := time.Now().Add(10 * time.Second)
	for rounds < 3 || !everyServerCalled() && time.Now().Before(deadline) {
		rounds++
		if err := load(ctx, connA, 2, 30, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		if err := load(ctx, connB, 2, 30, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	// Each channel's calls on its own servers only, and on every one of
	// them. How many each takes is the scorer's reading of loopback load:
	// with two calls at a time, a server whose goroutines a busy machine
	// schedules late looks busier, and one of three took 3 of 90 calls
	// (a few runs in a hundred), which says nothing about the core.
	want := int64(30 * rounds)
	for _, side := range []struct {
		name  string
		fleet []*backend
	}{{"llm", llm}, {"embedding", embed}} {
		total := int64(0)
		for i, bk := range side.fleet {
			n := bk.calls.Load()
			total += n
			if n == 0 {
				t.Errorf("%s server %d got none of its channel's %d calls in %d rounds", side.name, i, want, rounds)
			}
		}
		if total != want {
			t.Errorf("%s servers got %d calls; want their channel's %d, no more, no less", side.name, total, want)
		}
	}
	if got := len(b.Stats()); got != 5 {
		t.Errorf("shared core knows %d endpoints, want all 5 of both channels", got)
	}
	// Closing one channel takes its endpoints out of the core and leaves
	// the other's.
	connB.Close()
	if err := load(ctx, connA, 2, 30, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if got := len(b.Stats()); got != 3 {
		t.Errorf("after one channel closed the core knows %d endpoints, want the other's 3", got)
	}
}

// With StreamTiming, a server whose streams decode 5x slower is measured so
// (time per output token) and takes few of the streams once both speeds are
// known, as a slower GPU would.
//
// The core runs on a fake clock that the client advances by the serving
// backend's time per token while it waits for each token after the first
// (an interceptor inside StreamTiming, as if the receive blocked that
// long): with real sleeps, a 2ms token on a loaded 2-core machine under
// -race took 5.8ms while the 10ms one took 11ms, under the 2x the test
// asserts. The stream's timing is taken by StreamTiming and the picker's
// Done (run inside the Recv that returns io.EOF), both on this goroutine,
// so each reading is exact.
func TestE2EStreamTimingSteersFromASlowDecoder(t *testing.T) {
	clock := testutil.NewClock()
	bs := fleet(t, 2, func(i int, b *backend) {
		b.clock = clock
		b.perMsg = 2 * time.Millisecond
		if i == 1 {
			b.perMsg = 10 * time.Millisecond
		}
	})
	perMsg := map[string]time.Duration{bs[0].addr: bs[0].perMsg, bs[1].addr: bs[1].perMsg}
	name, bal := shared(t, core.Options{SlowStartWindow: -1, Clock: clock})
	// waits stands for the time a receive blocks on the serving backend.
	waits := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return &decodingStream{ClientStream: cs, clock: clock, perMsg: perMsg}, err
	}
	conn, _ := dial(t, bs, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
		grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil), waits))
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	const tokens = 8
	req := &testgrpc.StreamingOutputCallRequest{ResponseParameters: make([]*testgrpc.ResponseParameters, tokens)}
	run := func() {
		t.Helper()
		st, err := client.StreamingOutputCall(ctx, req, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := st.Recv()
			if err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
			if _, ok := perMsg[string(m.GetPayload().GetBody())]; !ok {
				t.Fatalf("message from unknown server %q", m.GetPayload().GetBody())
			}
			n++
		}
		if n != tokens {
			t.Fatalf("received %d of %d messages", n, tokens)
		}
	}
	for bs[0].calls.Load() == 0 || bs[1].calls.Load() == 0 { // until both have a speed
		run()
	}
	fast, slow := stats(t, bal, bs[0].addr), stats(t, bal, bs[1].addr)
	t.Logf("time per output token: fast %v, slow %v; fast TTFT %v, latency %v", fast.TimePerOutputToken, slow.TimePerOutputToken, fast.TTFT, fast.Latency)
	if fast.TimePerOutputToken <= 0 || slow.TimePerOutputToken < 2*fast.TimePerOutputToken {
		t.Fatalf("time per output token: fast %v, slow %v; want both measured, slow at least 2x", fast.TimePerOutputToken, slow.TimePerOutputToken)
	}
	if fast.TTFT <= 0 || fast.TTFT > fast.Latency {
		t.Fatalf("fast server TTFT %v with latency %v", fast.TTFT, fast.Latency)
	}
	before := bs[1].calls.Load()
	for range 12 {
		run()
	}
	if got := bs[1].calls.Load() - before; got > 2 {
		t.Errorf("the 5x slower decoder took %d of 12 streams once its speed was known", got)
	}
}

func stats(t *testing.T, b *core.Balancer, id string) core.EndpointStats {
	t.Helper()
	for _, s := range b.Stats() {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no endpoint %s", id)
	return core.EndpointStats{}
}

// With panic routing off, a server that asked for a pause (RESOURCE_EXHAUSTED
// with a retry pushback) is excluded until the pause ends, and a call finds
// nothing to pick. gRPC holds a wait-for-ready call until the next picker;
// the policy publishes one when the exclusion may have ended, so the call
// goes through then instead of waiting for its deadline.
func TestE2EWaitForReadyCallOutlastsACooldown(t *testing.T) {
	bs := fleet(t, 1, func(_ int, b *backend) { b.pushback = 200 * time.Millisecond })
	conn, _ := dial(t, bs, "", `{"balancer": {"panicThreshold": -1}}`)
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	_, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("first call: %v, want RESOURCE_EXHAUSTED", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := client.EmptyCall(cctx, &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("wait-for-ready call after a 200ms cooldown: %v", err)
	}
}

// decodingStream advances clock, before each receive after the first
// message, by the time per token of the server that sent the first: the
// receive waits on a decoder that slow.
type decodingStream struct {
	grpc.ClientStream
	clock   *testutil.Clock
	perMsg  map[string]time.Duration
	wait    time.Duration
	started bool
}

// RecvMsg advances the clock inside the receive, where StreamTiming counts
// the time as waited for the endpoint: a millisecond of prefill before the
// first token, the serving backend's perMsg before each next one. (The
// backend advanced the prefill itself once, and when that landed between
// the stream's start and the client's first receive, the client read as
// a late reader and the stream went untimed: a flake on a busy machine.)
func (s *decodingStream) RecvMsg(m any) error {
	if !s.started {
		s.started = true
		s.clock.Advance(time.Millisecond)
	}
	s.clock.Advance(s.wait)
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*testgrpc.StreamingOutputCallResponse); ok && err == nil && s.wait == 0 {
		s.wait = s.perMsg[string(r.GetPayload().GetBody())]
	}
	return err
}

// A Balancer its owner closed while a channel still routes with it
// (NewBuilder) cannot serve again: every call fails at once, UNAVAILABLE
// with a message that says so, wait-for-ready ones too. They waited for a
// picker that could never come, woken every second until their deadline.
func TestClosedSharedBalancerFailsCallsAtOnce(t *testing.T) {
	bs := fleet(t, 2, nil)
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, bs, name, `{}`)
	client := testgrpc.NewTestServiceClient(conn)
	if _, err := client.EmptyCall(testContext(t), &testgrpc.Empty{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, wait := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(wait))
		cancel()
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "closed") {
			t.Errorf("wait for ready %v: %v, want UNAVAILABLE saying the Balancer is closed", wait, err)
		}
	}
}

// A NewBuilder Balancer closed while none of the channel's connections is
// up fails the channel's calls at once, wait-for-ready ones too, as it
// does with a connection up (NewBuilder's doc): before, the picker gRPC
// uses while nothing is READY asked no one, and such a call waited for
// its deadline for endpoints the Balancer would never give again.
func TestE2EClosedSharedBalancerFailsCallsWhileNothingIsReady(t *testing.T) {
	dead := testutil.RefusedAddr(t) // every connection attempt is refused
	name, b := shared(t, core.Options{})
	conn, _ := dial(t, []*backend{{addr: dead}}, name, `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn.Connect() // the policy joins b, and its connection fails
	for st := conn.GetState(); st != connectivity.TransientFailure; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the channel never saw its connection fail: %v", st)
		}
	}
	b.Close()
	_, err := testgrpc.NewTestServiceClient(conn).EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), core.ErrClosed.Error()) {
		t.Fatalf("a wait-for-ready call on a closed Balancer, no connection up: %v; want UNAVAILABLE with %q", err, core.ErrClosed)
	}
}
