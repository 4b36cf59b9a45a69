package grpcbalancer_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// tokenServer is a TestService on loopback that records, as each call
// arrives, the in-flight tokens the Balancer routing to it counts on its
// endpoint (with one call in flight there, that call's own), and holds
// the calls whose metadata has x-hold until release is closed.
type tokenServer struct {
	testgrpc.UnimplementedTestServiceServer
	addr    string
	bal     *core.Balancer
	release chan struct{}
	arrived chan arrival // every call, as it arrives (buffered)
	// unknownModel: answer every unary call NOT_FOUND "Request for
	// unknown model", as Triton without the model loaded does.
	unknownModel atomic.Bool
	calls        atomic.Int64
}

type arrival struct {
	addr   string
	tokens int64 // the endpoint's in-flight tokens as the call arrived
}

func (s *tokenServer) arrive(ctx context.Context) error {
	s.calls.Add(1)
	var tokens int64
	for _, st := range s.bal.Stats() {
		if st.ID == s.addr {
			tokens = st.InFlightTokens
		}
	}
	s.arrived <- arrival{s.addr, tokens}
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-hold")) > 0 {
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *tokenServer) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if err := s.arrive(ctx); err != nil {
		return nil, err
	}
	if s.unknownModel.Load() {
		return nil, status.Error(codes.NotFound, "Request for unknown model: 'm' is not found")
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (s *tokenServer) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, ss grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	if err := s.arrive(ss.Context()); err != nil {
		return err
	}
	for range req.GetResponseParameters() {
		if err := ss.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

// earlyHeader sends the response headers before the stream's handler
// reads the request, so that a client's Header returns before it sends.
func earlyHeader(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := ss.SendHeader(metadata.Pairs("x-early", "1")); err != nil {
		return err
	}
	return handler(srv, ss)
}

// tokenFleet serves one tokenServer per endpoint of eps (each on a
// loopback port, its ID: eps give labels and weights only; its servers
// send stream headers early, see earlyHeader) and dials them through a
// policy on a Balancer of its own, with a fake clock that does not move
// and a seeded rand, slow start off. Every server has served a call before
// it returns; the calls of the test then arrive on the fleet's channel.
func tokenFleet(t *testing.T, eps []inferlb.Endpoint, cfg string, opts ...grpc.DialOption) (*fleetOf, *core.Balancer, *grpc.ClientConn) {
	t.Helper()
	name, bal := shared(t, core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1), SlowStartWindow: -1})
	f := &fleetOf{arrived: make(chan arrival, 1000), release: make(chan struct{})}
	t.Cleanup(f.releaseAll) // before the servers stop (cleanups run last first)
	var state resolver.State
	for _, ep := range eps {
		require.Empty(t, ep.ID, "tokenFleet names endpoints by address")
		s := &tokenServer{bal: bal, release: f.release, arrived: f.arrived}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := grpc.NewServer(grpc.StreamInterceptor(earlyHeader))
		testgrpc.RegisterTestServiceServer(srv, s)
		run(t, srv, lis)
		s.addr = lis.Addr().String()
		f.ss = append(f.ss, s)
		rep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: s.addr}}}
		state.Endpoints = append(state.Endpoints, grpcbalancer.WithEndpoint(rep, ep))
	}
	r := manual.NewBuilderWithScheme(fmt.Sprintf("est%d", policySeq.Add(1)))
	r.InitialState(state)
	conn, err := grpc.NewClient(r.Scheme()+":///fleet", append([]grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, name, cfg)),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	// Until every server has answered a call: all READY, and no call of
	// the test's goes to the first one READY for want of others.
	// Bounded by time, not by a count of calls, as warm is.
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		all := true
		for _, s := range f.ss {
			all = all && s.calls.Load() > 0
		}
		if all {
			break
		}
		require.False(t, time.Now().After(deadline), "some server got none of %d calls in 10s", n)
		// A session key each: keys are placed on every endpoint,
		// whatever its weight and cost.
		sctx := metadata.AppendToOutgoingContext(ctx, "x-session", fmt.Sprint("warm-", n))
		_, err := client.UnaryCall(sctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		require.NoError(t, err)
		<-f.arrived
	}
	return f, bal, conn
}

// fleetOf is tokenFleet's servers, and the channel every call arrives on.
type fleetOf struct {
	ss       []*tokenServer
	arrived  chan arrival
	release  chan struct{} // closed: the held calls end
	released sync.Once
}

func (f *fleetOf) releaseAll() { f.released.Do(func() { close(f.release) }) }

// next returns the next call to arrive.
func (f *fleetOf) next(t *testing.T) arrival {
	t.Helper()
	select {
	case a := <-f.arrived:
		return a
	case <-time.After(10 * time.Second): // a bound on a hang, not a wait
		t.Fatal("no call arrived in 10s")
		return arrival{}
	}
}

// index is the position in the fleet of the server at addr.
func (f *fleetOf) index(t *testing.T, addr string) int {
	t.Helper()
	for i, s := range f.ss {
		if s.addr == addr {
			return i
		}
	}
	t.Fatalf("no server %s", addr)
	return -1
}

// plainEndpoints is n endpoints with no weight or labels.
func plainEndpoints(n int) []inferlb.Endpoint { return make([]inferlb.Endpoint, n) }

// bigPrompt is a request of about 50,000 tokens by SizeEstimate.
var bigPrompt = &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 200_000)}}

func sizeTokens(m proto.Message) int64 { return int64(proto.Size(m) / 4) }

// heldCalls runs unary calls that the servers hold until the test ends
// (make their context before newHeldCalls: it must outlive the calls).
type heldCalls struct {
	t      *testing.T
	f      *fleetOf
	client testgrpc.TestServiceClient
	wg     sync.WaitGroup
	errs   chan error
}

func newHeldCalls(t *testing.T, f *fleetOf, conn *grpc.ClientConn) *heldCalls {
	h := &heldCalls{t: t, f: f, client: testgrpc.NewTestServiceClient(conn), errs: make(chan error, 100)}
	t.Cleanup(h.wait) // after the servers' release (cleanups run last first)
	return h
}

// call starts a held call of req under ctx and returns its arrival, once
// it has arrived: picked, counted in flight, and at its server.
func (h *heldCalls) call(ctx context.Context, req *testgrpc.SimpleRequest) arrival {
	h.t.Helper()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-hold", "1")
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if _, err := h.client.UnaryCall(ctx, req); err != nil {
			h.errs <- err
		}
	}()
	return h.f.next(h.t)
}

// wait releases the held calls and waits for them.
func (h *heldCalls) wait() {
	h.f.releaseAll()
	h.wg.Wait()
	close(h.errs)
	for err := range h.errs {
		h.t.Errorf("held call: %v", err)
	}
}

// estimateChains are the ways to install UnaryEstimate: alone, and before
// or after UnaryRetry and UnaryOutcome.
var estimateChains = []struct {
	name string
	ics  func() []grpc.UnaryClientInterceptor
}{
	{"estimate", func() []grpc.UnaryClientInterceptor {
		return []grpc.UnaryClientInterceptor{grpcbalancer.UnaryEstimate(nil)}
	}},
	{"estimate+retry", func() []grpc.UnaryClientInterceptor {
		return []grpc.UnaryClientInterceptor{grpcbalancer.UnaryEstimate(nil), grpcbalancer.UnaryRetry(3)}
	}},
	{"retry+estimate", func() []grpc.UnaryClientInterceptor {
		return []grpc.UnaryClientInterceptor{grpcbalancer.UnaryRetry(3), grpcbalancer.UnaryEstimate(nil)}
	}},
	{"estimate+outcome", func() []grpc.UnaryClientInterceptor {
		return []grpc.UnaryClientInterceptor{grpcbalancer.UnaryEstimate(nil), grpcbalancer.UnaryOutcome()}
	}},
	{"outcome+estimate", func() []grpc.UnaryClientInterceptor {
		return []grpc.UnaryClientInterceptor{grpcbalancer.UnaryOutcome(), grpcbalancer.UnaryEstimate(nil)}
	}},
}

const llmConfig = `{"methods": {"/grpc.testing.TestService/": "llm"}, "modelHeader": "x-model", "affinityKeyHeader": "x-session"}`

// A long prompt in flight on one of two endpoints: through UnaryEstimate
// its tokens (about 50,000) make that endpoint the dearer one while the
// other holds up to three short calls, so the next three go to the other;
// without it, the policy counts calls alone, and the endpoint holding the
// long prompt takes one of the three (the third at the latest: 1 call
// against 2).
func TestE2EUnaryEstimateSteersFromInFlightTokens(t *testing.T) {
	run := func(t *testing.T, ics []grpc.UnaryClientInterceptor) (big arrival, toBig int) {
		f, _, conn := tokenFleet(t, plainEndpoints(2), llmConfig, grpc.WithChainUnaryInterceptor(ics...))
		ctx := testContext(t)
		held := newHeldCalls(t, f, conn)
		big = held.call(ctx, bigPrompt)
		for range 3 {
			if held.call(ctx, &testgrpc.SimpleRequest{}).addr == big.addr {
				toBig++
			}
		}
		return big, toBig
	}
	t.Run("none", func(t *testing.T) {
		big, toBig := run(t, nil)
		assert.Zero(t, big.tokens, "no estimate")
		assert.GreaterOrEqual(t, toBig, 1, "short calls sent to the endpoint holding the long prompt")
	})
	for _, c := range estimateChains {
		t.Run(c.name, func(t *testing.T) {
			big, toBig := run(t, c.ics())
			assert.Equal(t, sizeTokens(bigPrompt), big.tokens, "in-flight tokens of the long prompt")
			assert.Zero(t, toBig, "short calls sent to the endpoint holding the long prompt")
		})
	}
}

// Data-parallel engines (dp_group): a0 a1 | b0 b1, with model labels that
// leave a long prompt for model m1 one rank (a0) and the next, for m2,
// two (a1 and b0), b0 of twice the weight. With the first prompt in
// flight on a0, the barrier sends the second to its engine-mate a1, where
// it fills the step a0 holds, rather than to b0, where it would start a
// new step b1 waits for: only when the estimate gives the barrier the
// prompts' tokens. Without the estimate, or without engines, b0's weight
// wins.
func TestE2EUnaryEstimateFeedsTheDataParallelBarrier(t *testing.T) {
	fleet := func(dp bool) []inferlb.Endpoint {
		ep := func(engine, model string, weight float64) inferlb.Endpoint {
			labels := map[string]string{"model": model}
			if dp {
				labels[core.DefaultDPGroupLabel] = engine
			}
			return inferlb.Endpoint{Weight: weight, Labels: labels}
		}
		return []inferlb.Endpoint{ep("a", "m1", 1), ep("a", "m2", 1), ep("b", "m2", 2), ep("b", "m3", 1)}
	}
	second := func(t *testing.T, dp bool, opts ...grpc.DialOption) int {
		f, _, conn := tokenFleet(t, fleet(dp), llmConfig, opts...)
		ctx := testContext(t)
		held := newHeldCalls(t, f, conn)
		first := held.call(metadata.AppendToOutgoingContext(ctx, "x-model", "m1"), bigPrompt)
		require.Equal(t, 0, f.index(t, first.addr), "m1 is a0's alone")
		next := held.call(metadata.AppendToOutgoingContext(ctx, "x-model", "m2"), bigPrompt)
		return f.index(t, next.addr)
	}
	estimate := grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryEstimate(nil))
	assert.Equal(t, 1, second(t, true, estimate), "with the estimate, to a0's engine-mate a1")
	assert.Equal(t, 2, second(t, true), "without it, to the heavier b0")
	assert.Equal(t, 2, second(t, false, estimate), "without engines, to the heavier b0")
}

// The estimate fills only what the call's own facts leave 0: a caller's
// inferlb.Request keeps its model and its counts (and is not written), a
// call without one keeps the model and affinity key from its metadata.
// Counts are capped at 2^22.
func TestE2EUnaryEstimateKeepsTheCallersFacts(t *testing.T) {
	eps := []inferlb.Endpoint{{Labels: map[string]string{"model": "m1"}}, {Labels: map[string]string{"model": "m2"}}}
	fn := func(method string, req any) (int, int) {
		if r, ok := req.(*testgrpc.SimpleRequest); ok && r.GetFillUsername() {
			return min(1<<40, math.MaxInt), -3 // made up: capped, and negative is unknown (an int holds no 1<<40 on 32-bit)
		}
		p, _ := grpcbalancer.SizeEstimate(method, req)
		return p, 50
	}
	f, _, conn := tokenFleet(t, eps, llmConfig, grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryEstimate(fn)))
	ss := f.ss
	client := testgrpc.NewTestServiceClient(conn)
	prompt := sizeTokens(bigPrompt)
	call := func(ctx context.Context, req *testgrpc.SimpleRequest) arrival {
		t.Helper()
		_, err := client.UnaryCall(ctx, req)
		require.NoError(t, err)
		return f.next(t)
	}
	ctx := testContext(t)
	for i := range 6 { // model from metadata: m2's endpoint, every time
		a := call(metadata.AppendToOutgoingContext(ctx, "x-model", "m2", "x-session", fmt.Sprint(i)), bigPrompt)
		assert.Equal(t, ss[1].addr, a.addr, "call %d for m2", i)
		assert.Equal(t, prompt+50, a.tokens, "call %d", i)
	}
	own := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m1", MaxOutputTokens: 100}
	for i := range 6 { // model from the caller's Request, with its output bound
		a := call(inferlb.NewContext(metadata.AppendToOutgoingContext(ctx, "x-model", "m2"), own), bigPrompt)
		assert.Equal(t, ss[0].addr, a.addr, "call %d for the Request's m1", i)
		assert.Equal(t, prompt+100, a.tokens, "call %d", i)
	}
	assert.Equal(t, inferlb.Request{Service: inferlb.ServiceLLM, Model: "m1", MaxOutputTokens: 100}, *own, "the caller's Request is not written")
	counted := &inferlb.Request{Model: "m1", PromptTokens: 7}
	a := call(inferlb.NewContext(ctx, counted), bigPrompt)
	assert.Equal(t, int64(7+50), a.tokens, "the caller's prompt count stands")
	a = call(metadata.AppendToOutgoingContext(ctx, "x-model", "m1"), &testgrpc.SimpleRequest{FillUsername: true})
	assert.Equal(t, int64(1<<22), a.tokens, "capped")
}

// UnaryRetry's retry of a call the first endpoint answered it does not
// serve the model of carries the estimate too, chained before or after it.
func TestE2EUnaryEstimateOutlivesARetry(t *testing.T) {
	for _, c := range estimateChains[1:3] {
		t.Run(c.name, func(t *testing.T) {
			f, _, conn := tokenFleet(t, plainEndpoints(2), llmConfig, grpc.WithChainUnaryInterceptor(c.ics()...))
			ss := f.ss
			ss[0].unknownModel.Store(true) // after the warm-up calls
			client := testgrpc.NewTestServiceClient(conn)
			ctx := metadata.AppendToOutgoingContext(testContext(t), "x-model", "m")
			retried := false
			for i := 0; !retried; i++ {
				require.Less(t, i, 50, "no call went to the endpoint without the model")
				_, err := client.UnaryCall(ctx, bigPrompt)
				require.NoError(t, err)
				first := f.next(t)
				assert.Equal(t, sizeTokens(bigPrompt), first.tokens, "first attempt of call %d", i)
				if first.addr == ss[0].addr {
					retried = true
					again := f.next(t)
					assert.Equal(t, ss[1].addr, again.addr, "retry of call %d", i)
					assert.Equal(t, sizeTokens(bigPrompt), again.tokens, "retry of call %d", i)
				}
			}
		})
	}
}

// streamDesc is TestService's StreamingOutputCall, a server stream.
var streamDesc = &grpc.StreamDesc{StreamName: "StreamingOutputCall", ServerStreams: true}

const streamMethod = "/grpc.testing.TestService/StreamingOutputCall"

// StreamEstimate prices a server stream by its request, chained before or
// after StreamTiming, and the stream works as without it.
func TestE2EStreamEstimate(t *testing.T) {
	big := &testgrpc.StreamingOutputCallRequest{
		Payload:            &testgrpc.Payload{Body: make([]byte, 200_000)},
		ResponseParameters: make([]*testgrpc.ResponseParameters, 3),
	}
	chains := []struct {
		name string
		ics  []grpc.StreamClientInterceptor
		want int64
	}{
		{"none", []grpc.StreamClientInterceptor{grpcbalancer.StreamTiming(nil)}, 0},
		{"estimate+timing", []grpc.StreamClientInterceptor{grpcbalancer.StreamEstimate(nil), grpcbalancer.StreamTiming(nil)}, sizeTokens(big)},
		{"timing+estimate", []grpc.StreamClientInterceptor{grpcbalancer.StreamTiming(nil), grpcbalancer.StreamEstimate(nil)}, sizeTokens(big)},
	}
	for _, c := range chains {
		t.Run(c.name, func(t *testing.T) {
			f, bal, conn := tokenFleet(t, plainEndpoints(1), llmConfig, grpc.WithChainStreamInterceptor(c.ics...))
			ctx := testContext(t)
			st, err := testgrpc.NewTestServiceClient(conn).StreamingOutputCall(ctx, big)
			require.NoError(t, err)
			n := 0
			for {
				if _, err := st.Recv(); err != nil {
					require.Equal(t, io.EOF, err)
					break
				}
				n++
			}
			assert.Equal(t, 3, n)
			assert.Equal(t, c.want, f.next(t).tokens)
			s := stats(t, bal, f.ss[0].addr)
			assert.Zero(t, s.InFlightTokens, "the stream's tokens are counted out at its end")
			assert.Zero(t, s.Failures)
		})
	}
}

type ctxKey struct{}

// streamRequest asks for three messages, with a prompt of about 50,000
// tokens by SizeEstimate.
var streamRequest = &testgrpc.StreamingOutputCallRequest{
	Payload:            &testgrpc.Payload{Body: make([]byte, 200_000)},
	ResponseParameters: make([]*testgrpc.ResponseParameters, 3),
}

// drain receives until the stream ends and returns the messages received
// and the error that ended it (io.EOF: the stream ended well).
func drain(cs grpc.ClientStream) (int, error) {
	for n := 0; ; n++ {
		if err := cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse)); err != nil {
			return n, err
		}
	}
}

// Before its first SendMsg, a server stream through StreamEstimate has no
// real stream yet. Context is the call's and Trailer nil; Header,
// CloseSend and RecvMsg create the stream, unestimated, and act on it as
// on a stream without the interceptor.
func TestE2EStreamEstimateBeforeTheFirstSend(t *testing.T) {
	chain := grpc.WithChainStreamInterceptor(grpcbalancer.StreamEstimate(nil), grpcbalancer.StreamTiming(nil))
	f, _, conn := tokenFleet(t, plainEndpoints(1), llmConfig, chain)
	ctx := context.WithValue(testContext(t), ctxKey{}, "mine")

	t.Run("Header", func(t *testing.T) {
		cs, err := conn.NewStream(ctx, streamDesc, streamMethod)
		require.NoError(t, err)
		assert.Equal(t, "mine", cs.Context().Value(ctxKey{}))
		assert.Nil(t, cs.Trailer())
		md, err := cs.Header() // the server sends it before it reads the request
		require.NoError(t, err)
		assert.Equal(t, []string{"1"}, md.Get("x-early"))
		require.NoError(t, cs.SendMsg(streamRequest))
		require.NoError(t, cs.CloseSend())
		n, err := drain(cs)
		assert.Equal(t, io.EOF, err)
		assert.Equal(t, 3, n)
		assert.Zero(t, f.next(t).tokens, "created by Header, before the request: no estimate")
		assert.Equal(t, "mine", cs.Context().Value(ctxKey{}), "the stream's context, from the call's")
		assert.NotNil(t, cs.Trailer())
	})

	t.Run("CloseSend", func(t *testing.T) {
		// As without the interceptor: the server gets no request.
		_, _, plain := tokenFleet(t, plainEndpoints(1), llmConfig, grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
		var errs []error
		for _, c := range []*grpc.ClientConn{plain, conn} {
			cs, err := c.NewStream(ctx, streamDesc, streamMethod)
			require.NoError(t, err)
			require.NoError(t, cs.CloseSend())
			n, err := drain(cs)
			assert.Zero(t, n)
			errs = append(errs, err)
		}
		require.Error(t, errs[0])
		assert.NotEqual(t, io.EOF, errs[0])
		assert.Equal(t, status.Code(errs[0]), status.Code(errs[1]), "without, then with the interceptor: %v; %v", errs[0], errs[1])
	})

	t.Run("RecvMsgWhileSending", func(t *testing.T) {
		// gRPC lets one goroutine receive while another sends: whichever
		// comes first creates the stream (run with -race).
		cs, err := conn.NewStream(ctx, streamDesc, streamMethod)
		require.NoError(t, err)
		type result struct {
			n   int
			err error
		}
		got := make(chan result, 1)
		go func() {
			n, err := drain(cs)
			got <- result{n, err}
		}()
		require.NoError(t, cs.SendMsg(streamRequest))
		require.NoError(t, cs.CloseSend())
		r := <-got
		assert.Equal(t, io.EOF, r.err)
		assert.Equal(t, 3, r.n)
		f.next(t)
	})
}

// gogoLabel and gogoRequest are shaped as gogo/protobuf's protoc-gen-gogo
// generates a message with a repeated field of (gogoproto.nullable) =
// false and no marshaler plugin: a MessageV1 whose repeated message field
// holds structs, not pointers. gogo's own codec marshals it; the
// protobuf-go runtime, which SizeEstimate sizes it with, panics on it
// once the field is not empty ("reflect: Elem of invalid type").
type gogoLabel struct {
	Name string `protobuf:"bytes,1,opt,name=name,proto3" json:"name"`
}

func (m *gogoLabel) Reset()       { *m = gogoLabel{} }
func (*gogoLabel) String() string { return "gogoLabel" }
func (*gogoLabel) ProtoMessage()  {}

type gogoRequest struct {
	Labels []gogoLabel `protobuf:"bytes,1,rep,name=labels,proto3" json:"labels"`
}

func (m *gogoRequest) Reset()       { *m = gogoRequest{} }
func (*gogoRequest) String() string { return "gogoRequest" }
func (*gogoRequest) ProtoMessage()  {}

// A message the protobuf runtime cannot size (another codec's, such as a
// gogo message of non-nullable repeated fields sent with gogo's codec) is
// unknown to SizeEstimate, as its doc says, and the call goes on: before,
// SizeEstimate panicked on it, and UnaryEstimate(nil) with it, in the
// caller's goroutine, on every call whose field was not empty.
func TestSizeEstimateOfAMessageTheRuntimeCannotSize(t *testing.T) {
	req := &gogoRequest{Labels: []gogoLabel{{Name: "a prompt"}}}
	var p, o int
	require.NotPanics(t, func() { p, o = grpcbalancer.SizeEstimate("/a.B/C", req) })
	assert.Zero(t, p+o, "unknown")

	invoked := false
	invoker := func(_ context.Context, _ string, got, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		invoked = true
		assert.Same(t, req, got)
		return nil
	}
	require.NotPanics(t, func() {
		assert.NoError(t, grpcbalancer.UnaryEstimate(nil)(context.Background(), "/a.B/C", req, nil, nil, invoker))
	})
	assert.True(t, invoked, "the call went on")
}
