package grpcbalancer_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
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

// rejectedStreams are the two ways to send a stream's one request: a
// server-streaming call (the generated stub sends it, and turns the
// request write's io.EOF into nil) and a bidirectional one (the
// application sends it, and may get that io.EOF).
var rejectedStreams = []struct {
	name string
	// open opens a stream and sends req, then CloseSend; the stream is
	// nil when opening it failed.
	open func(ctx context.Context, client testgrpc.TestServiceClient, req *testgrpc.StreamingOutputCallRequest) (grpc.ClientStream, error)
}{
	{"ServerStreaming", func(ctx context.Context, client testgrpc.TestServiceClient, req *testgrpc.StreamingOutputCallRequest) (grpc.ClientStream, error) {
		return client.StreamingOutputCall(ctx, req, grpc.WaitForReady(true))
	}},
	{"Bidi", func(ctx context.Context, client testgrpc.TestServiceClient, req *testgrpc.StreamingOutputCallRequest) (grpc.ClientStream, error) {
		st, err := client.FullDuplexCall(ctx, grpc.WaitForReady(true))
		if err != nil {
			return nil, err
		}
		if err := st.Send(req); err != nil && err != io.EOF { // io.EOF: the status is in Recv
			return st, err
		}
		return st, st.CloseSend()
	}},
	// A client-streaming upload (audio for a transcription, say): the
	// application sends, then reads the one answer or the status.
	{"ClientStreaming", func(ctx context.Context, client testgrpc.TestServiceClient, req *testgrpc.StreamingOutputCallRequest) (grpc.ClientStream, error) {
		st, err := client.StreamingInputCall(ctx, grpc.WaitForReady(true))
		if err != nil {
			return nil, err
		}
		if err := st.Send(&testgrpc.StreamingInputCallRequest{Payload: req.Payload}); err != nil && err != io.EOF {
			return st, err
		}
		return st, st.CloseSend()
	}},
}

// rejectStreams opens 20 streams of a 1 MiB request with open, through a
// policy of their own dialed with opts, to a server that rejects them
// RESOURCE_EXHAUSTED unread; reads each to its end, which must be that
// rejection; and returns how the policy counted them.
func rejectStreams(t *testing.T, open func(context.Context, testgrpc.TestServiceClient, *testgrpc.StreamingOutputCallRequest) (grpc.ClientStream, error), opts ...grpc.DialOption) core.EndpointStats {
	t.Helper()
	big := &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1<<20)}}
	b := rejectingServer(t)
	name, cb := shared(t, core.Options{})
	conn, _ := dial(t, []*backend{b}, name, `{}`, opts...)
	client := testgrpc.NewTestServiceClient(conn)
	for range 20 {
		st, err := open(testContext(t), client, big)
		for err == nil {
			err = st.RecvMsg(new(testgrpc.StreamingOutputCallResponse))
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a rejected stream: %v", err)
		}
	}
	return stats(t, cb, b.addr)
}

// A stream the server rejects before the client has written its request
// (1 MiB, rejected unread) is a stream grpc-go ends without error for the
// policy, as it does a unary call (see
// TestEarlyRejectionIsAnOverloadThroughTheInterceptor): the request
// write's io.EOF. Through StreamTiming, the policy reads the stream's own
// end, which the application gets from RecvMsg: every rejection is the
// overload it is. (Without it, many count as successes: see
// TestEarlyRejectedStreamWithoutStreamTiming.)
func TestEarlyRejectedStreamIsAnOverloadThroughStreamTiming(t *testing.T) {
	for _, tc := range rejectedStreams {
		t.Run(tc.name, func(t *testing.T) {
			s := rejectStreams(t, tc.open, grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
			if s.Successes != 0 || s.Overloads != 20 || s.Failures != 0 || s.InFlight != 0 {
				t.Errorf("20 streams rejected unread: %d successes, %d overloads, %d failures, %d in flight; want 0, 20, 0, 0",
					s.Successes, s.Overloads, s.Failures, s.InFlight)
			}
		})
	}
}

// Without StreamTiming, the policy counts such streams as grpc-go reports
// them: each once, as an overload or, when the request's write failed, as
// a success. The test logs how many were successes (the figure in
// outcome's doc: go test -run TestEarlyRejectedStreamWithoutStreamTiming
// -count=20 -v ./balancer/grpcbalancer/).
func TestEarlyRejectedStreamWithoutStreamTiming(t *testing.T) {
	for _, tc := range rejectedStreams {
		t.Run(tc.name, func(t *testing.T) {
			s := rejectStreams(t, tc.open)
			t.Logf("20 streams rejected unread, without StreamTiming: %d successes, %d overloads", s.Successes, s.Overloads)
			if s.Successes+s.Overloads != 20 || s.Failures != 0 || s.InFlight != 0 {
				t.Errorf("20 streams rejected unread: %d successes, %d overloads, %d failures, %d in flight; want 20 successes and overloads, 0, 0",
					s.Successes, s.Overloads, s.Failures, s.InFlight)
			}
		})
	}
}

// A rejected stream whose application leaves it without reading its end
// (it cancels once it has sent the request) counts as neither: grpc-go
// ended some of these attempts without error, and the policy holds such a
// report until the application's context ends. None stays in flight.
// (Without the correction, the attempts grpc-go ended without error
// counted as successes.)
func TestEarlyRejectedStreamLeftUnreadCountsAsNeither(t *testing.T) {
	for _, tc := range rejectedStreams {
		t.Run(tc.name, func(t *testing.T) {
			s := rejectTwenty(t, func(ctx context.Context, client testgrpc.TestServiceClient, big *testgrpc.StreamingOutputCallRequest) {
				if _, err := tc.open(ctx, client, big); err != nil {
					t.Fatal(err)
				}
			})
			if s.Successes != 0 || s.Overloads != 0 || s.Failures != 0 {
				t.Errorf("20 rejected streams left unread: %d successes, %d overloads, %d failures; want none",
					s.Successes, s.Overloads, s.Failures)
			}
		})
	}
}

// A rejected stream whose application reads only its Header and then
// leaves is the overload it is: grpc-go finishes the stream with the
// status it found in the trailers-only answer (grpc.OnFinish), though
// Header returns no error. Before, the attempts grpc-go had ended without
// error counted as neither: of 20 such streams, 2 to 10 counted as
// overloads in two runs of each kind, the rest as neither.
func TestEarlyRejectedStreamReadByHeaderAloneIsAnOverload(t *testing.T) {
	for _, tc := range rejectedStreams {
		t.Run(tc.name, func(t *testing.T) {
			s := rejectTwenty(t, func(ctx context.Context, client testgrpc.TestServiceClient, big *testgrpc.StreamingOutputCallRequest) {
				st, err := tc.open(ctx, client, big)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Header(); err != nil {
					t.Fatal(err)
				}
			})
			if s.Successes != 0 || s.Overloads != 20 || s.Failures != 0 {
				t.Errorf("20 rejected streams read by Header alone: %d successes, %d overloads, %d failures; want 0, 20, 0",
					s.Successes, s.Overloads, s.Failures)
			}
		})
	}
}

// rejectTwenty opens 20 streams of a 1 MiB request, each with a context
// of its own that is cancelled after use (which does what the test's
// application does with the stream), to a server that rejects them
// unread through StreamTiming, and returns the server's endpoint's stats
// once nothing is in flight.
func rejectTwenty(t *testing.T, use func(ctx context.Context, client testgrpc.TestServiceClient, big *testgrpc.StreamingOutputCallRequest)) core.EndpointStats {
	t.Helper()
	big := &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1<<20)}}
	b := rejectingServer(t)
	name, cb := shared(t, core.Options{})
	conn, _ := dial(t, []*backend{b}, name, `{}`, grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
	client := testgrpc.NewTestServiceClient(conn)
	for range 20 {
		ctx, cancel := context.WithCancel(testContext(t))
		use(ctx, client, big)
		cancel()
	}
	return waitIdle(t, cb, b.addr)
}

// waitIdle waits until endpoint id has nothing in flight (a context's end
// reaches the policy on grpc-go's goroutine, or on the context's
// AfterFunc) and returns its stats. It reads the stats again at each Done
// the Balancer reports, never on a timer, and fails the test when the
// endpoint is still busy after 5 seconds.
func waitIdle(t *testing.T, b *core.Balancer, id string) core.EndpointStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var s core.EndpointStats
	if err := testhook.Await(ctx, b, func() bool {
		s = stats(t, b, id)
		return s.InFlight == 0
	}); err != nil {
		t.Fatalf("%d calls still in flight after 5s", s.InFlight)
	}
	return s
}

// Through StreamTiming, a stream that ends well counts as a success at
// once, with its time to first token; one whose application cancels after
// the server finished counts as grpc-go reports it: a success when it
// already said so (Header found the stream ended OK), else the client's
// cancellation, neither. None stays in flight.
func TestStreamTimingStreamsThatEndWell(t *testing.T) {
	tokens := &testgrpc.StreamingOutputCallRequest{ResponseParameters: make([]*testgrpc.ResponseParameters, 4)}
	for _, tc := range []struct {
		name string
		req  *testgrpc.StreamingOutputCallRequest
		// read reads the stream as the application does, then it cancels
		read      func(t *testing.T, st grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse])
		successes uint64
	}{
		{"read to the end", tokens, func(t *testing.T, st grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse]) {
			for {
				if _, err := st.Recv(); err != nil {
					if err != io.EOF {
						t.Fatal(err)
					}
					return
				}
			}
		}, 20},
		{"canceled after the last message", tokens, func(t *testing.T, st grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse]) {
			for range 4 {
				if _, err := st.Recv(); err != nil {
					t.Fatal(err)
				}
			}
		}, 0},
		{"canceled after Header found it ended", &testgrpc.StreamingOutputCallRequest{}, func(t *testing.T, st grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse]) {
			if md, err := st.Header(); md != nil || err != nil {
				t.Fatalf("Header of a stream without messages: %v, %v; want none: it ended", md, err)
			}
		}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := fleet(t, 1, nil)
			name, cb := shared(t, core.Options{})
			conn, _ := dial(t, bs, name, `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
				grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
			client := testgrpc.NewTestServiceClient(conn)
			for range 20 {
				ctx, cancel := context.WithCancel(testContext(t))
				st, err := client.StreamingOutputCall(ctx, tc.req, grpc.WaitForReady(true))
				if err != nil {
					t.Fatal(err)
				}
				tc.read(t, st)
				cancel()
			}
			s := waitIdle(t, cb, bs[0].addr)
			if s.Successes != tc.successes || s.Failures != 0 || s.Overloads != 0 {
				t.Errorf("20 streams: %d successes, %d failures, %d overloads; want %d, 0, 0",
					s.Successes, s.Failures, s.Overloads, tc.successes)
			}
			if tc.req == tokens && tc.successes > 0 && s.TTFT <= 0 {
				t.Errorf("time to first token %v, want it measured", s.TTFT)
			}
		})
	}
}

// An interceptor chained inside UnaryOutcome that fails a call the
// endpoint answered, with an error of its own that is not a gRPC status
// (a reply that fails the application's validation), says nothing of
// the endpoint: the attempt stays the success grpc-go reported. Counted
// as the call's error, it was UNKNOWN, a failure, and a few such replies
// tripped a healthy endpoint's breaker.
func TestUnaryOutcomeIgnoresAnInnerInterceptorsOwnError(t *testing.T) {
	bs := fleet(t, 1, nil)
	name, cb := shared(t, core.Options{})
	errInvalid := errors.New("the reply failed validation")
	validate := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		return errInvalid
	}
	conn, _ := dial(t, bs, name, `{}`, grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryOutcome(), validate))
	client := testgrpc.NewTestServiceClient(conn)
	for range core.DefaultBreakerFailures + 1 {
		if _, err := client.EmptyCall(testContext(t), &testgrpc.Empty{}, grpc.WaitForReady(true)); !errors.Is(err, errInvalid) {
			t.Fatalf("got %v, want the interceptor's error", err)
		}
	}
	s := stats(t, cb, bs[0].addr)
	if s.Successes != core.DefaultBreakerFailures+1 || s.Failures != 0 || s.BreakerOpen || s.InFlight != 0 {
		t.Errorf("%d answered calls failed by an inner interceptor: %d successes, %d failures, breaker open %v, %d in flight; want %[1]d, 0, false, 0",
			core.DefaultBreakerFailures+1, s.Successes, s.Failures, s.BreakerOpen, s.InFlight)
	}
}

// An interceptor chained inside UnaryOutcome or UnaryRetry may return
// before the call it invoked ends (it runs the invoker in a goroutine,
// and gives up on a deadline of its own). The attempt ends after the
// interceptor's call returned: it is reported then, as grpc-go ended it,
// and does not stay in flight. Held for a settle that had already come,
// it stayed one call on its endpoint for good.
func TestAnAttemptEndingAfterItsCallReturnedIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   grpc.UnaryClientInterceptor
	}{{"UnaryOutcome", grpcbalancer.UnaryOutcome()}, {"UnaryRetry", grpcbalancer.UnaryRetry(2)}} {
		t.Run(tc.name, func(t *testing.T) {
			bs := fleet(t, 1, nil)
			name, cb := shared(t, core.Options{})
			release := make(chan struct{})
			var ended sync.WaitGroup
			errGaveUp := errors.New("gave up waiting")
			abandon := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				ended.Add(1)
				go func() {
					defer ended.Done()
					<-release
					_ = invoker(ctx, method, req, reply, cc, opts...)
				}()
				return errGaveUp
			}
			conn, _ := dial(t, bs, name, `{}`, grpc.WithChainUnaryInterceptor(tc.in, abandon))
			client := testgrpc.NewTestServiceClient(conn)
			for range 3 {
				if _, err := client.EmptyCall(testContext(t), &testgrpc.Empty{}, grpc.WaitForReady(true)); !errors.Is(err, errGaveUp) {
					t.Fatalf("got %v, want the interceptor's error", err)
				}
			}
			close(release)
			ended.Wait() // grpc-go reports an attempt's end before its invoker returns
			s := stats(t, cb, bs[0].addr)
			if s.Successes != 3 || s.Failures != 0 || s.InFlight != 0 {
				t.Errorf("3 attempts ended after their calls returned: %d successes, %d failures, %d in flight; want 3, 0, 0",
					s.Successes, s.Failures, s.InFlight)
			}
		})
	}
}

// Closing the ClientConn is one of gRPC's ways to release a stream the
// application leaves unread (grpc.ClientStream's doc), besides ending its
// context. A rejected stream whose report the policy held (see
// TestEarlyRejectedStreamLeftUnreadCountsAsNeither) is settled then too,
// as neither: before, it stayed in flight on its endpoint for as long as
// the application's context lived, on a Balancer that outlives the
// channel (NewBuilder, shared with other channels or the HTTP transport),
// steering their calls away from that endpoint.
func TestEarlyRejectedStreamLeftUnreadIsSettledWhenTheChannelCloses(t *testing.T) {
	big := &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1<<20)}}
	b := rejectingServer(t)
	name, cb := shared(t, core.Options{})
	// The endpoint stays in the Balancer after the channel leaves, as it
	// does while another adapter routes to it.
	other, err := cb.NewMembership()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Update([]inferlb.Endpoint{{ID: b.addr}}); err != nil {
		t.Fatal(err)
	}
	conn, _ := dial(t, []*backend{b}, name, `{}`, grpc.WithChainStreamInterceptor(grpcbalancer.StreamTiming(nil)))
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t) // lives on past the check
	for range 40 {
		if _, err := client.StreamingOutputCall(ctx, big, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	s := waitIdle(t, cb, b.addr)
	// Those grpc-go ended with the rejection are overloads; the held
	// ones, neither.
	if s.Successes != 0 || s.Failures != 0 {
		t.Errorf("40 rejected streams left unread: %d successes, %d failures; want none",
			s.Successes, s.Failures)
	}
}
