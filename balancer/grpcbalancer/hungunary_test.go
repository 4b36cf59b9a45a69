package grpcbalancer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	grpcstats "google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Modes of hungUnary.
const (
	unaryAnswer         = iota // wait for the gate, then answer
	unaryHeadersHang           // send the headers, then nothing until the caller leaves
	unaryReplyHang             // send the answer's message, then no status until the caller leaves
	unaryEmptyReplyHang        // unaryReplyHang with a message whose fields are all unset
)

// hungUnary serves grpc.testing.TestService/UnaryCall as a generation
// server whose engine may hang behind its live API server. It is
// registered as a stream handler, so that it can send the headers, or the
// answer's message, and hold the call's status back, as a server that
// sends headers early (grpc.SendHeader) or a proxy between may.
type hungUnary struct {
	mode    atomic.Int32
	started chan struct{} // unaryAnswer: signalled as a call arrives
	gate    chan struct{} // unaryAnswer: the call answers once it can receive
	// contentType is the latest call's content-type: the interceptors
	// must leave it as it was.
	contentType atomic.Value
}

func (h *hungUnary) register(srv *grpc.Server) { registerUnaryAsStream(srv, h.handle) }

// registerUnaryAsStream registers handle as grpc.testing.TestService's
// UnaryCall, a stream handler, so that it can send the headers or the
// answer's message and hold the call's status back.
func registerUnaryAsStream(srv *grpc.Server, handle func(grpc.ServerStream) error) {
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "grpc.testing.TestService",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "UnaryCall",
			ServerStreams: true,
			ClientStreams: true,
			Handler:       func(_ any, ss grpc.ServerStream) error { return handle(ss) },
		}},
	}, struct{}{})
}

func (h *hungUnary) handle(ss grpc.ServerStream) error {
	if err := ss.RecvMsg(new(testgrpc.SimpleRequest)); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	h.contentType.Store(md.Get("content-type"))
	switch h.mode.Load() {
	case unaryAnswer:
		h.started <- struct{}{}
		<-h.gate
		return ss.SendMsg(&testgrpc.SimpleResponse{})
	case unaryHeadersHang:
		if err := ss.SendHeader(metadata.Pairs("x-engine", "hung")); err != nil {
			return err
		}
	case unaryReplyHang:
		if err := ss.SendMsg(&testgrpc.SimpleResponse{Username: "partial"}); err != nil {
			return err
		}
	case unaryEmptyReplyHang:
		if err := ss.SendMsg(&testgrpc.SimpleResponse{}); err != nil {
			return err
		}
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

// arrivals is a client stats handler that signals (without blocking) as
// a call's response headers, and its response messages, arrive: the test
// cancels a call once it has them, without a sleep. gRPC reports the
// headers after it has marked the attempt's bytes received, and a message
// after it has decoded it.
type arrivals struct {
	header, payload chan struct{}
}

// drain drops the arrivals signalled so far.
func (a *arrivals) drain() {
	for _, ch := range []chan struct{}{a.header, a.payload} {
		select {
		case <-ch:
		default:
		}
	}
}

func (a *arrivals) TagRPC(ctx context.Context, _ *grpcstats.RPCTagInfo) context.Context { return ctx }
func (a *arrivals) TagConn(ctx context.Context, _ *grpcstats.ConnTagInfo) context.Context {
	return ctx
}
func (a *arrivals) HandleConn(context.Context, grpcstats.ConnStats) {}
func (a *arrivals) HandleRPC(_ context.Context, s grpcstats.RPCStats) {
	var ch chan struct{}
	switch s.(type) {
	case *grpcstats.InHeader:
		ch = a.header
	case *grpcstats.InPayload:
		ch = a.payload
	default:
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// awaitArrival waits for a signal on ch (see arrivals), and fails the
// test at once if the call ends first (ended): a call that failed, its
// request not read by the server, sends no headers to wait for.
func awaitArrival(t *testing.T, ch chan struct{}, ended chan error) {
	t.Helper()
	select {
	case <-ch:
	case err := <-ended:
		t.Fatalf("the call ended before the server's answer came: %v", err)
	}
}

// A unary generation call whose server sent its headers and no message
// (grpc.SendHeader before the answer, with its engine hung), and whose
// caller gave up on it, had nothing of its answer: through UnaryOutcome or
// UnaryRetry it is Unanswered, and two such give-ups after waiting 30 s on
// a replica whose answers took a second make the run that prices a hung
// replica up (scoring.State.Abandoned). grpc-go counts the headers as
// bytes received: before, both counted as answered (Unanswered 0,
// Abandoned 0), as they still do without either interceptor, which alone
// sees the messages (a reply still empty had none decoded into it), with
// any codec and content-subtype, set in the call's options or by an
// interceptor inside. A caller that gives up after the answer's message
// arrived (the server held its status back) had its answer, also when the
// message was empty, decoded by proto's codec; with a JSON codec an empty
// message ("{}") leaves the reply as it was, and reads as none (a limit
// of reading the reply). An embedding call keeps counting its headers as
// answered.
func TestE2EHungUnaryCancelledAfterHeadersIsUnanswered(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ic            grpc.UnaryClientInterceptor // nil: none
		service       string
		mode          int32
		opts          []grpc.CallOption
		inner         []grpc.CallOption // options an interceptor inside adds
		contentType   string            // on the wire; "" is "application/grpc"
		want, wantRun uint64
	}{
		{name: "headers, UnaryOutcome", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryHeadersHang, want: 2, wantRun: 2},
		{name: "headers, UnaryRetry", ic: grpcbalancer.UnaryRetry(3), service: "llm", mode: unaryHeadersHang, want: 2, wantRun: 2},
		{name: "headers, proto content-subtype", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryHeadersHang,
			opts: []grpc.CallOption{grpc.CallContentSubtype("proto")}, contentType: "application/grpc+proto", want: 2, wantRun: 2},
		{name: "headers, codec set inside", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryHeadersHang,
			inner: []grpc.CallOption{grpc.ForceCodecV2(encoding.GetCodecV2("proto"))}, contentType: "application/grpc+proto", want: 2, wantRun: 2},
		{name: "headers, JSON content-subtype set inside", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryHeadersHang,
			inner: []grpc.CallOption{grpc.CallContentSubtype(testJSONName)}, contentType: "application/grpc+" + testJSONName, want: 2, wantRun: 2},
		{name: "headers, UnaryRetry, JSON content-subtype set inside", ic: grpcbalancer.UnaryRetry(3), service: "llm", mode: unaryHeadersHang,
			inner: []grpc.CallOption{grpc.CallContentSubtype(testJSONName)}, contentType: "application/grpc+" + testJSONName, want: 2, wantRun: 2},
		{name: "headers, JSON codec", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryHeadersHang,
			opts: []grpc.CallOption{grpc.ForceCodec(testJSON{})}, contentType: "application/grpc+" + testJSONName, want: 2, wantRun: 2},
		{name: "headers, without an interceptor", service: "llm", mode: unaryHeadersHang},
		{name: "after the answer's message", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryReplyHang},
		{name: "after the answer's message, UnaryRetry", ic: grpcbalancer.UnaryRetry(3), service: "llm", mode: unaryReplyHang},
		{name: "after an empty message", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryEmptyReplyHang},
		{name: "after the answer's message, JSON codec", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryReplyHang,
			opts: []grpc.CallOption{grpc.ForceCodec(testJSON{})}, contentType: "application/grpc+" + testJSONName},
		{name: "after an empty message, JSON codec", ic: grpcbalancer.UnaryOutcome(), service: "llm", mode: unaryEmptyReplyHang,
			opts: []grpc.CallOption{grpc.ForceCodec(testJSON{})}, contentType: "application/grpc+" + testJSONName, want: 2, wantRun: 2},
		{name: "headers, embedding", ic: grpcbalancer.UnaryOutcome(), service: "embedding", mode: unaryHeadersHang},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := &hungUnary{started: make(chan struct{}), gate: make(chan struct{})}
			addr := serve(t, engine.register)
			clock := testutil.NewClock()
			name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			arrived := &arrivals{header: make(chan struct{}, 1), payload: make(chan struct{}, 1)}
			dopts := []grpc.DialOption{grpc.WithStatsHandler(arrived)}
			if tc.ic != nil {
				dopts = append(dopts, grpc.WithChainUnaryInterceptor(tc.ic))
			}
			if tc.inner != nil {
				dopts = append(dopts, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					return invoker(ctx, method, req, reply, cc, append(opts, tc.inner...)...)
				}))
			}
			conn, _ := dial(t, []*backend{{addr: addr}}, name, `{"methods": {"/grpc.testing.TestService/": "`+tc.service+`"}}`, dopts...)
			client := testgrpc.NewTestServiceClient(conn)
			opts := append([]grpc.CallOption{grpc.WaitForReady(true)}, tc.opts...)
			idle := func() {
				t.Helper()
				ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
				defer cancel()
				require.NoError(t, testhook.Await(ctx, b, func() bool { return endpointStats(t, b, addr).InFlight == 0 }))
			}

			// An answer that takes a second: the replica's latency.
			answered := make(chan error, 1)
			go func() {
				_, err := client.UnaryCall(testContext(t), &testgrpc.SimpleRequest{}, opts...)
				answered <- err
			}()
			select {
			case <-engine.started:
			case err := <-answered:
				t.Fatalf("the call ended before the server began it: %v", err)
			}
			clock.Advance(time.Second)
			close(engine.gate)
			require.NoError(t, <-answered)
			idle()
			for _, ch := range []chan struct{}{arrived.header, arrived.payload} {
				select {
				case <-ch: // the answer's
				default:
				}
			}

			engine.mode.Store(tc.mode)
			for range 2 {
				ctx, cancel := context.WithCancel(testContext(t))
				ended := make(chan error, 1)
				go func() {
					_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, opts...)
					ended <- err
				}()
				awaitArrival(t, arrived.header, ended) // the headers came: bytes received
				if tc.mode == unaryReplyHang || tc.mode == unaryEmptyReplyHang {
					awaitArrival(t, arrived.payload, ended) // and the answer's message, decoded
				}
				clock.Advance(30 * time.Second)
				cancel()
				assert.Equal(t, codes.Canceled, status.Code(<-ended))
				idle()
			}
			contentType := tc.contentType
			if contentType == "" {
				contentType = "application/grpc"
			}
			assert.Equal(t, []string{contentType}, engine.contentType.Load(), "content-type on the wire")
			s := endpointStats(t, b, addr)
			t.Logf("canceled %d, unanswered %d, abandoned run %d", s.Canceled, s.Unanswered, s.Abandoned)
			assert.EqualValues(t, 2, s.Canceled)
			assert.Equal(t, tc.want, s.Unanswered, "cancels reported unanswered")
			assert.EqualValues(t, tc.wantRun, s.Abandoned, "run of abandoned generation calls")
		})
	}
}
