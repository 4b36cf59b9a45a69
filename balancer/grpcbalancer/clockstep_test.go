package grpcbalancer

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// stepStream is a server stream whose RecvMsg runs the next of its
// actions (the time the message takes to come: clock moves) and returns a
// message; after the last it ends the attempt and returns io.EOF.
type stepStream struct {
	grpc.ClientStream
	before []func()
	done   func(balancer.DoneInfo)
}

func (s *stepStream) RecvMsg(any) error {
	if len(s.before) == 0 {
		s.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		return io.EOF
	}
	s.before[0]()
	s.before = s.before[1:]
	return nil
}

// A forward step of the wall clock while a stream is out is no time to
// its first token, nor between its tokens: StreamTiming stamped the
// tokens from the wall clock, so a step of an hour before the first token
// (which came 200 ms after the pick) set the endpoint's TTFT to 1h0m0.2s,
// and one between the 3rd and 4th of five tokens 20 ms apart its time per
// output token to 15m0.02s. Without a step the stream measures as it did.
func TestForwardClockStepIsNoStreamTimingOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stepAt int // the message before which the wall clock steps an hour (-1: none)
	}{
		{name: "no step", stepAt: -1},
		{name: "step before the first token", stepAt: 0},
		{name: "step between tokens", stepAt: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewMonoClock()
			clock.Advance(time.Second) // readings other than 0
			b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			var before []func()
			for i := range 5 {
				d := 20 * time.Millisecond
				if i == 0 {
					d = 200 * time.Millisecond
				}
				before = append(before, func() {
					clock.Advance(d / 2)
					if i == tc.stepAt {
						clock.Step(time.Hour)
					}
					clock.Advance(d / 2)
				})
			}
			streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
				res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
				if err != nil {
					return nil, err
				}
				return &stepStream{before: before, done: res.Done}, nil
			}
			cs, err := StreamTiming(nil)(context.Background(), &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
			require.NoError(t, err)
			for range 5 {
				require.NoError(t, cs.RecvMsg(nil))
			}
			require.ErrorIs(t, cs.RecvMsg(nil), io.EOF)
			s := stats(t, b, addr(0))
			t.Logf("endpoint TTFT %v, time per output token %v", s.TTFT, s.TimePerOutputToken)
			assert.EqualValues(t, 1, s.Successes)
			assert.Equal(t, 200*time.Millisecond, s.TTFT, "endpoint's TTFT")
			assert.Equal(t, 20*time.Millisecond, s.TimePerOutputToken, "endpoint's time per output token")
		})
	}
}
