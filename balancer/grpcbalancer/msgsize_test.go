package grpcbalancer_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
)

// bigAnswer answers UnaryCall with a payload of 1 KiB.
type bigAnswer struct {
	testgrpc.UnimplementedTestServiceServer
}

func (bigAnswer) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: make([]byte, 1024)}}, nil
}

// A message over a size limit (the client's MaxCallRecvMsgSize or
// MaxCallSendMsgSize, or the server's own) fails the call
// RESOURCE_EXHAUSTED, but says nothing of the endpoint's load: the message
// is too large wherever it goes. Counted as an overload answer, each such
// call cooled a healthy endpoint down, and with panic routing off a few
// of them left nothing to route to.
func TestE2EMessageOverASizeLimitIsNoOverload(t *testing.T) {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(512))
	testgrpc.RegisterTestServiceServer(srv, bigAnswer{})
	client, b, addr := serveOne(t, srv, core.Options{PanicThreshold: -1, BreakerFailures: -1, OutlierInterval: -1})
	ctx := testContext(t)
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name     string
		req      *testgrpc.SimpleRequest
		opt      grpc.CallOption
		answered bool // the endpoint answered: a success; else the call counts as nothing
	}{
		{"answer over the client's receive limit", &testgrpc.SimpleRequest{}, grpc.MaxCallRecvMsgSize(64), true},
		{"request over the client's send limit", &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1024)}}, grpc.MaxCallSendMsgSize(64), false},
		{"request over the server's receive limit", &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1024)}}, grpc.EmptyCallOption{}, true},
	}
	for _, c := range calls {
		before := stats(t, b, addr)
		_, err := client.UnaryCall(ctx, c.req, c.opt)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED", c.name, err)
		}
		s := stats(t, b, addr)
		if s.Overloads != 0 || !s.ExcludedUntil.IsZero() {
			t.Errorf("%s: %d overloads, excluded until %v; want none", c.name, s.Overloads, s.ExcludedUntil)
		}
		if got, want := s.Successes-before.Successes, map[bool]uint64{true: 1}[c.answered]; got != want || s.Failures != 0 {
			t.Errorf("%s: %d successes, %d failures; want %d and 0", c.name, got, s.Failures, want)
		}
		// The endpoint still takes calls that do not wait for ready.
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Errorf("%s: the next call: %v", c.name, err)
		}
	}
}

func init() { encoding.RegisterCompressor(brokenCompressor{}) }

// brokenCompressor fails to compress anything.
type brokenCompressor struct{}

func (brokenCompressor) Compress(io.Writer) (io.WriteCloser, error) {
	return nil, errors.New("compressor out of order")
}
func (brokenCompressor) Decompress(io.Reader) (io.Reader, error) {
	return nil, errors.New("compressor out of order")
}
func (brokenCompressor) Name() string { return "inferlb-test-broken" }

// A request the client cannot encode (a proto3 string that is not UTF-8,
// as a prompt cut mid-character can be; a compressor that fails) fails the call INTERNAL on the
// client, after the pick and with the stream open, but before the request
// left: the request's doing, not the endpoint's. Counted as failures, a
// few such calls tripped the breaker of whichever endpoint they picked,
// and a client sending them steadily ejected the fleet one by one.
func TestE2ERequestTheClientCannotEncodeIsNoFailure(t *testing.T) {
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, bigAnswer{})
	client, b, addr := serveOne(t, srv, core.Options{PanicThreshold: -1})
	ctx := testContext(t)
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	for range core.DefaultBreakerFailures {
		bad := &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Message: "\xff"}}
		if _, err := client.UnaryCall(ctx, bad); status.Code(err) != codes.Internal {
			t.Fatalf("a request that cannot be marshaled: %v, want INTERNAL", err)
		}
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 1}, grpc.UseCompressor(brokenCompressor{}.Name())); status.Code(err) != codes.Internal {
			t.Fatalf("a request that cannot be compressed: %v, want INTERNAL", err)
		}
	}
	if s := stats(t, b, addr); s.Failures != 0 || s.BreakerOpen || s.ErrorRate != 0 {
		t.Errorf("after requests the client could not encode: %d failures, breaker open %v, error rate %v; want none", s.Failures, s.BreakerOpen, s.ErrorRate)
	}
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
		t.Errorf("the next call: %v", err)
	}
}

// garbleCodec marshals every message as bytes no protobuf message parses
// (a length-delimited field 1 that claims more bytes than follow), and
// unmarshals anything into nothing.
type garbleCodec struct{}

func (garbleCodec) Marshal(any) ([]byte, error) { return []byte{0x0a, 0x7f, 'x'}, nil }
func (garbleCodec) Unmarshal([]byte, any) error { return nil }
func (garbleCodec) Name() string                { return "proto" }

// An answer the client cannot unmarshal (a server built from another
// version of the .proto, a field whose type changed) fails the call
// INTERNAL on the client after the endpoint answered: it says nothing of
// the endpoint's health, and a schema mismatch is usually the fleet's, not
// one endpoint's. Counted as failures, a client out of step with its
// servers tripped the breaker of every endpoint in turn, and with them the
// channel's other methods lost their endpoints too.
func TestE2EAnswerTheClientCannotDecodeIsNoFailure(t *testing.T) {
	srv := grpc.NewServer(grpc.ForceServerCodec(garbleCodec{}), grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		var in struct{}
		if err := st.RecvMsg(&in); err != nil {
			return err
		}
		return st.SendMsg(&in)
	}))
	client, b, addr := serveOne(t, srv, core.Options{PanicThreshold: -1})
	ctx := testContext(t)
	for i := range core.DefaultBreakerFailures + 1 {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(i == 0))
		if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "unmarshal") {
			t.Fatalf("call %d: %v, want INTERNAL failing to unmarshal", i, err)
		}
	}
	if s := stats(t, b, addr); s.Failures != 0 || s.BreakerOpen || s.ErrorRate != 0 {
		t.Errorf("after answers the client could not decode: %d failures, breaker open %v, error rate %v; want none", s.Failures, s.BreakerOpen, s.ErrorRate)
	}
}

// serveOne serves srv on loopback and returns a client of a channel that
// routes to it alone with a policy on a Balancer of opts, the Balancer,
// and the server's address (its endpoint ID).
func serveOne(t *testing.T, srv *grpc.Server, opts core.Options) (testgrpc.TestServiceClient, *core.Balancer, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	run(t, srv, lis)
	addr := lis.Addr().String()
	name, b := shared(t, opts)
	conn, _ := dial(t, []*backend{{addr: addr}}, name, `{}`)
	return testgrpc.NewTestServiceClient(conn), b, addr
}
