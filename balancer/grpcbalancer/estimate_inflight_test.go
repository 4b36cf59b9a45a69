package grpcbalancer_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
)

// idle waits until no endpoint of bal has a call or a token in flight:
// gRPC reports some ends (a cancellation) on a goroutine of its own. It
// looks again at each Done, not on a timer.
func idle(t *testing.T, bal *core.Balancer, what string) {
	t.Helper()
	none := func() bool {
		for _, s := range bal.Stats() {
			if s.InFlight != 0 || s.InFlightTokens != 0 {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := testhook.Await(ctx, bal, none); err != nil {
		t.Fatalf("%s: still in flight after 5s: %+v", what, bal.Stats())
	}
}

func picks(bal *core.Balancer) (n uint64) {
	for _, s := range bal.Stats() {
		n += s.Picks
	}
	return n
}

// However a call through StreamEstimate or UnaryEstimate ends (canceled
// before its first send, a send the client refuses, a message the codec
// cannot encode, a stream used before its first send, canceled mid-stream,
// a stream kind the interceptor passes through), nothing stays in flight
// on any endpoint: no call, no token.
func TestE2EEstimateLeavesNothingInFlight(t *testing.T) {
	chains := []struct {
		name string
		ics  []grpc.StreamClientInterceptor
	}{
		{"estimate", []grpc.StreamClientInterceptor{grpcbalancer.StreamEstimate(nil)}},
		{"estimate+timing", []grpc.StreamClientInterceptor{grpcbalancer.StreamEstimate(nil), grpcbalancer.StreamTiming(nil)}},
		{"timing+estimate", []grpc.StreamClientInterceptor{grpcbalancer.StreamTiming(nil), grpcbalancer.StreamEstimate(nil)}},
	}
	for _, c := range chains {
		t.Run(c.name, func(t *testing.T) {
			_, bal, conn := tokenFleet(t, plainEndpoints(2), llmConfig, grpc.WithChainStreamInterceptor(c.ics...),
				grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(3), grpcbalancer.UnaryEstimate(nil)))
			base := testContext(t)
			open := func(ctx context.Context, opts ...grpc.CallOption) grpc.ClientStream {
				t.Helper()
				cs, err := conn.NewStream(ctx, streamDesc, streamMethod, opts...)
				require.NoError(t, err)
				return cs
			}

			t.Run("never sent", func(t *testing.T) {
				before := picks(bal)
				ctx, cancel := context.WithCancel(base)
				open(ctx)
				cancel()
				idle(t, bal, "never sent")
				assert.Equal(t, before, picks(bal), "no pick for a stream never used")
			})
			t.Run("canceled before the first send", func(t *testing.T) {
				ctx, cancel := context.WithCancel(base)
				cs := open(ctx)
				cancel()
				assert.Equal(t, codes.Canceled, status.Code(cs.SendMsg(streamRequest)))
				_, err := drain(cs)
				assert.Equal(t, codes.Canceled, status.Code(err))
				idle(t, bal, "canceled")
			})
			t.Run("over the send limit", func(t *testing.T) {
				cs := open(base, grpc.MaxCallSendMsgSize(1000))
				assert.Equal(t, codes.ResourceExhausted, status.Code(cs.SendMsg(streamRequest)))
				idle(t, bal, "over the send limit")
			})
			t.Run("not a proto", func(t *testing.T) {
				cs := open(base)
				assert.Equal(t, codes.Internal, status.Code(cs.SendMsg("a string")))
				idle(t, bal, "not a proto")
			})
			t.Run("nil message", func(t *testing.T) {
				cs := open(base)
				require.NoError(t, cs.SendMsg(nil)) // proto's codec sends it empty
				require.NoError(t, cs.CloseSend())
				_, err := drain(cs)
				assert.Equal(t, io.EOF, err)
				idle(t, bal, "nil message")
			})
			t.Run("CloseSend first", func(t *testing.T) {
				cs := open(base)
				require.NoError(t, cs.CloseSend())
				_, err := drain(cs)
				assert.Equal(t, codes.Internal, status.Code(err), "the server got no request")
				idle(t, bal, "CloseSend first")
			})
			t.Run("Header first", func(t *testing.T) {
				cs := open(base)
				_, err := cs.Header()
				require.NoError(t, err)
				require.NoError(t, cs.SendMsg(streamRequest))
				require.NoError(t, cs.CloseSend())
				n, err := drain(cs)
				assert.Equal(t, io.EOF, err)
				assert.Equal(t, 3, n)
				idle(t, bal, "Header first")
			})
			t.Run("canceled mid-stream", func(t *testing.T) {
				ctx, cancel := context.WithCancel(base)
				cs := open(ctx)
				require.NoError(t, cs.SendMsg(streamRequest))
				require.NoError(t, cs.CloseSend())
				require.NoError(t, cs.RecvMsg(new(testgrpc.StreamingOutputCallResponse)))
				cancel()
				idle(t, bal, "canceled mid-stream")
			})
			t.Run("bidirectional", func(t *testing.T) {
				cs, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(base)
				require.NoError(t, err)
				if err := cs.Send(&testgrpc.StreamingOutputCallRequest{}); err != io.EOF {
					require.NoError(t, err)
				}
				require.NoError(t, cs.CloseSend())
				_, err = cs.Recv()
				assert.Equal(t, codes.Unimplemented, status.Code(err))
				idle(t, bal, "bidirectional")
			})
			t.Run("unary", func(t *testing.T) {
				const method = "/grpc.testing.TestService/UnaryCall"
				err := conn.Invoke(base, method, "a string", new(testgrpc.SimpleResponse))
				assert.Equal(t, codes.Internal, status.Code(err))
				err = conn.Invoke(base, method, bigPrompt, new(testgrpc.SimpleResponse), grpc.MaxCallSendMsgSize(100))
				assert.Equal(t, codes.ResourceExhausted, status.Code(err))
				ctx, cancel := context.WithCancel(base)
				cancel()
				err = conn.Invoke(ctx, method, bigPrompt, new(testgrpc.SimpleResponse))
				assert.Equal(t, codes.Canceled, status.Code(err))
				idle(t, bal, "unary")
			})
		})
	}
}
