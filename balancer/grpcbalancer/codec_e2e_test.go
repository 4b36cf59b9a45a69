package grpcbalancer_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// testJSON is a codec that is not proto's: encoding/json on the
// messages' Go structs, registered (client and server are in this
// process) under the content-subtype testJSONName.
type testJSON struct{}

const testJSONName = "inferlb-test-json"

func (testJSON) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (testJSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (testJSON) Name() string                       { return testJSONName }

func init() { encoding.RegisterCodec(testJSON{}) }

// subtypeServer answers UnaryCall with the request's response size in its
// username, and keeps the content-type of the latest call.
type subtypeServer struct {
	testgrpc.UnimplementedTestServiceServer
	contentType atomic.Value
}

func (s *subtypeServer) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.contentType.Store(md.Get("content-type"))
	return &testgrpc.SimpleResponse{Username: "size " + string(rune('0'+req.GetResponseSize()))}, nil
}

// An interceptor chained inside UnaryOutcome or UnaryRetry that sets only
// the call's content-subtype (grpc.CallContentSubtype) has the call
// encoded with the codec registered for it, as without them: the server
// gets JSON under "+inferlb-test-json" and reads the request's field. The
// codec the interceptors gave gRPC (grpc.ForceCodecV2 around proto's, to
// learn whether a message came) won over the content-subtype: the server
// got proto's bytes under the JSON content-type, and the call failed
// INTERNAL ("grpc: error unmarshalling request").
func TestE2EInnerContentSubtypeKeepsItsCodec(t *testing.T) {
	for _, tc := range []struct {
		name string
		ic   grpc.UnaryClientInterceptor
	}{
		{"UnaryOutcome", grpcbalancer.UnaryOutcome()},
		{"UnaryRetry", grpcbalancer.UnaryRetry(3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &subtypeServer{}
			addr := serve(t, func(s *grpc.Server) { testgrpc.RegisterTestServiceServer(s, srv) })
			inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return invoker(ctx, method, req, reply, cc, append(opts, grpc.CallContentSubtype(testJSONName))...)
			}
			conn, _ := dial(t, []*backend{{addr: addr}}, "", `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
				grpc.WithChainUnaryInterceptor(tc.ic, inner))
			resp, err := testgrpc.NewTestServiceClient(conn).UnaryCall(testContext(t), &testgrpc.SimpleRequest{ResponseSize: 7}, grpc.WaitForReady(true))
			require.NoError(t, err)
			assert.Equal(t, "size 7", resp.GetUsername(), "the server read the request, and the client its answer")
			assert.Equal(t, []string{"application/grpc+" + testJSONName}, srv.contentType.Load(), "content-type on the wire")
		})
	}
}

// The allocations a unary call makes (client and server, over loopback:
// AllocsPerRun counts the process's) through UnaryOutcome and UnaryRetry,
// against the same call through the same policy without either. Each
// adds its call state and the context that carries it, and nothing per
// call besides.
func TestUnaryInterceptorAllocs(t *testing.T) {
	if testutil.Race {
		t.Skip("the race detector drops pooled values at random")
	}
	srv := &subtypeServer{}
	addr := serve(t, func(s *grpc.Server) { testgrpc.RegisterTestServiceServer(s, srv) })
	per := func(ics ...grpc.UnaryClientInterceptor) float64 {
		conn, _ := dial(t, []*backend{{addr: addr}}, "", `{"methods": {"/grpc.testing.TestService/": "llm"}}`,
			grpc.WithChainUnaryInterceptor(ics...))
		client := testgrpc.NewTestServiceClient(conn)
		ctx := testContext(t)
		req := &testgrpc.SimpleRequest{ResponseSize: 7}
		call := func() {
			if _, err := client.UnaryCall(ctx, req, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
		}
		for range 20 {
			call() // connected, and the pools warm
		}
		return testing.AllocsPerRun(500, call)
	}
	// Made first: once either exists, every pick looks for its state.
	oc, rt := grpcbalancer.UnaryOutcome(), grpcbalancer.UnaryRetry(3)
	bare := per()
	outcome := per(oc)
	retry := per(rt)
	t.Logf("allocs per unary call: %v without an interceptor, %v through UnaryOutcome, %v through UnaryRetry", bare, outcome, retry)
	assert.LessOrEqual(t, outcome-bare, 2.0, "UnaryOutcome's")
	assert.LessOrEqual(t, retry-bare, 2.0, "UnaryRetry's")
}
