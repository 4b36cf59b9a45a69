package grpcbalancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// A server stream whose application took its time to send its request
// (20 s after the stream opened) and then waited in RecvMsg for the first
// message until it gave up had nothing of its answer: its time away
// counts from its latest send, not from the pick, as the server had
// nothing to answer before the request. Kills streamState.unanswered
// measuring the absence from the attempt's pick: the 20 s before the
// send read as the reader's, and the hung stream went uncounted.
func TestStreamRequestSentLateThenAwaitedIsUnanswered(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var a string
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
		if err != nil {
			return nil, err
		}
		a = res.SubConn.(*grpcfake.SubConn).Addr()
		return &cancelledStream{clock: clock, wait: 2 * time.Second, done: res.Done, cancel: cancel}, nil
	}
	cs, err := StreamTiming(nil)(ctx, &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
	require.NoError(t, err)
	clock.Advance(20 * time.Second) // the application builds its request
	require.NoError(t, cs.SendMsg(nil))
	require.NoError(t, cs.CloseSend())
	assert.Equal(t, codes.Canceled, status.Code(cs.RecvMsg(nil)))
	s := stats(t, b, a)
	assert.EqualValues(t, 1, s.Canceled)
	assert.EqualValues(t, 1, s.Unanswered)
}
