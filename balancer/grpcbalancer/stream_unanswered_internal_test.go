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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// cancelledStream is a server stream whose headers came and whose first
// RecvMsg waits wait for a message that never comes; then the attempt
// ends CANCELLED (gRPC reports Done before RecvMsg returns), after
// cancel, when set, ended the caller's context.
type cancelledStream struct {
	grpc.ClientStream
	clock  *testutil.Clock
	wait   time.Duration
	cancel context.CancelFunc
	done   func(balancer.DoneInfo)
}

func (s *cancelledStream) SendMsg(any) error { return nil }

func (s *cancelledStream) CloseSend() error { return nil }

func (s *cancelledStream) RecvMsg(any) error {
	s.clock.Advance(s.wait)
	if s.cancel != nil {
		s.cancel()
	}
	err := status.Error(codes.Canceled, "context canceled")
	s.done(balancer.DoneInfo{Err: err, BytesSent: true, BytesReceived: true})
	return err
}

// A stream whose headers came and no message is Unanswered through
// StreamTiming when its caller gave up in a RecvMsg that waited for the
// first message: from the start, or long enough after coming late that
// it saw none come (pace.ReaderLate, as the HTTP transport's reader). A
// reader that came 10 s late and whose RecvMsg the cancel ended at once
// may have had a message waiting unread; a CANCEL reset while the caller
// still waits is not the caller's wait. Nor is a bidirectional stream's
// whose application sent nothing yet: nothing was asked (a session opened
// ahead of its first request, and closed before it).
func TestStreamCancelledAwaitingItsFirstMessage(t *testing.T) {
	for _, tc := range []struct {
		name         string
		late, wait   time.Duration
		callerCancel bool
		bidi         bool // a bidirectional stream, whose request the application sends itself
		sent         int  // ... messages it sent
		want         uint64
	}{
		{"reader waiting from the start", 0, 30 * time.Second, true, false, 0, 1},
		{"late reader that waited long", 10 * time.Second, 30 * time.Second, true, false, 0, 1},
		{"late reader, cancelled at once", 10 * time.Second, 0, true, false, 0, 0},
		{"a CANCEL reset, the caller still waiting", 0, 30 * time.Second, false, false, 0, 0},
		{"bidirectional, its request sent", 0, 30 * time.Second, true, true, 1, 1},
		{"bidirectional, nothing sent", 0, 30 * time.Second, true, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
				s := &cancelledStream{clock: clock, wait: tc.wait, done: res.Done}
				if tc.callerCancel {
					s.cancel = cancel
				}
				return s, nil
			}
			cs, err := StreamTiming(nil)(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: tc.bidi}, nil, "/ai.Gen/Stream", streamer)
			require.NoError(t, err)
			if !tc.bidi {
				require.NoError(t, cs.SendMsg(nil)) // as generated code sends a server stream's request
				require.NoError(t, cs.CloseSend())
			}
			for range tc.sent {
				require.NoError(t, cs.SendMsg(nil))
			}
			clock.Advance(tc.late)
			assert.Equal(t, codes.Canceled, status.Code(cs.RecvMsg(nil)))
			s := stats(t, b, a)
			assert.EqualValues(t, 1, s.Canceled)
			assert.Equal(t, tc.want, s.Unanswered)
		})
	}
}

// endedWhileSending is a bidirectional stream that the server ends (a
// rate limiter's rejection, unread) while the application sends its
// request and another of its goroutines waits in RecvMsg: grpc-go ends
// the attempt without error (see streamState.hold), and the application
// leaves before reading the stream's end.
type endedWhileSending struct {
	grpc.ClientStream
	done             func(balancer.DoneInfo)
	leave            context.CancelFunc
	entered, release chan struct{}
}

func (s *endedWhileSending) SendMsg(any) error {
	s.leave()
	s.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	return io.EOF
}

func (s *endedWhileSending) CloseSend() error { return nil }

func (s *endedWhileSending) RecvMsg(any) error {
	close(s.entered)
	<-s.release
	return status.Error(codes.ResourceExhausted, "rate limited")
}

// An attempt the server ended while the application sent its request,
// which the application left before reading how (errStreamLeft), counts
// as neither, and is not Unanswered though a RecvMsg of the application's
// waited for the first message: the server answered, with a status nobody
// read. Taken for the caller's give-up, it counted as a call the endpoint
// sent nothing back for, towards the run that prices a hung replica up.
func TestStreamLeftAfterTheServerEndedItIsNotUnanswered(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var a string
	s := &endedWhileSending{leave: cancel, entered: make(chan struct{}), release: make(chan struct{})}
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: ctx})
		if err != nil {
			return nil, err
		}
		a = res.SubConn.(*grpcfake.SubConn).Addr()
		s.done = res.Done
		return s, nil
	}
	cs, err := StreamTiming(nil)(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, nil, "/ai.Gen/Chat", streamer)
	require.NoError(t, err)
	recv := make(chan error, 1)
	go func() { recv <- cs.RecvMsg(nil) }()
	<-s.entered // awaiting the first message
	clock.Advance(30 * time.Second)
	assert.Equal(t, io.EOF, cs.SendMsg(nil))
	st := stats(t, b, a)
	assert.EqualValues(t, 1, st.Canceled, "left unread: neither")
	assert.Zero(t, st.Unanswered, "the server ended the stream: it answered")
	assert.Zero(t, st.InFlight)
	close(s.release)
	<-recv
}
