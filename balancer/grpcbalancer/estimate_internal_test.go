package grpcbalancer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
)

// fakeStream is a grpc.ClientStream that only names itself.
type fakeStream struct{ grpc.ClientStream }

// StreamEstimate defers only server streams: client-streaming and
// bidirectional calls are created at once, and their stream is the one
// the streamer made.
func TestStreamEstimatePassesOtherStreamsThrough(t *testing.T) {
	ic := StreamEstimate(nil)
	for _, desc := range []*grpc.StreamDesc{{ClientStreams: true}, {ClientStreams: true, ServerStreams: true}, {}} {
		made := &fakeStream{}
		calls := 0
		streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
			calls++
			return made, nil
		}
		cs, err := ic(context.Background(), desc, nil, "/a.B/C", streamer)
		require.NoError(t, err)
		assert.Equal(t, 1, calls, "%+v: created at once", desc)
		assert.Same(t, made, cs, "%+v: the streamer's stream", desc)
	}
}

// A server stream that cannot be created fails its first SendMsg with the
// streamer's error, and every later method with it too; the streamer is
// called once. A streamer that returns neither stream nor error (a broken
// interceptor further in) is an INTERNAL error, not a nil stream.
func TestStreamEstimateCreationError(t *testing.T) {
	ic := StreamEstimate(nil)
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, 1)
	boom := status.Error(codes.Unavailable, "no endpoint")
	for _, c := range []struct {
		err  error
		code codes.Code
	}{{boom, codes.Unavailable}, {nil, codes.Internal}} {
		calls := 0
		streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
			calls++
			return nil, c.err
		}
		cs, err := ic(ctx, &grpc.StreamDesc{ServerStreams: true}, nil, "/a.B/C", streamer)
		require.NoError(t, err)
		assert.Zero(t, calls, "not created before the first SendMsg")
		err = cs.SendMsg(&testgrpc.Empty{})
		assert.Equal(t, c.code, status.Code(err))
		assert.Equal(t, err, cs.RecvMsg(&testgrpc.Empty{}))
		assert.Equal(t, err, cs.CloseSend())
		md, herr := cs.Header()
		assert.Nil(t, md)
		assert.Equal(t, err, herr)
		assert.Nil(t, cs.Trailer())
		assert.Equal(t, 1, cs.Context().Value(key{}))
		assert.Equal(t, 1, calls)
	}
}

// The estimate is the call's: a pick for another method under a context
// derived from the call's (per-RPC credentials calling a token service)
// does not take it, and the Request it fills is the call's scratch
// space, never the shared template or a caller's.
func TestEstimateIsTheCallsOwn(t *testing.T) {
	estimateInUse.Store(true)
	msg := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 4000)}}
	ctx := withEstimate(context.Background(), SizeEstimate, "/a.B/C", msg)
	template := &inferlb.Request{Service: inferlb.ServiceLLM}
	c := &call{}
	assert.Same(t, template, estimated(balancer.PickInfo{FullMethodName: "/a.B/Other", Ctx: ctx}, template, c), "another method's pick")
	got := estimated(balancer.PickInfo{FullMethodName: "/a.B/C", Ctx: ctx}, template, c)
	assert.Same(t, &c.req, got)
	assert.Equal(t, inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 1001}, *got)
	assert.Equal(t, inferlb.Request{Service: inferlb.ServiceLLM}, *template, "the template is not written")

	// Nothing known: no value in the context at all.
	none := func(string, any) (int, int) { return 0, -1 }
	bg := context.Background()
	assert.Equal(t, bg, withEstimate(bg, none, "/a.B/C", msg))
	p, o := SizeEstimate("/a.B/C", "not a proto")
	assert.Zero(t, p+o, "a message of another codec is unknown")
}
