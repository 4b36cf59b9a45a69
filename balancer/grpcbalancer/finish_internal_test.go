package grpcbalancer

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// finishedStream is a stream the server failed with end before the client
// wrote its request, as grpc-go gives it when the application reads its
// end: the first SendMsg ends the attempt without error (the misreport
// held by StreamTiming); Header, on the trailers-only answer, finishes the
// stream with end (grpc.OnFinish) and returns no error ("the user should
// get it by calling Recv"); RecvMsg finishes it and returns recvErr, end
// itself unless a stream wrapper inside StreamTiming made its own of it.
//
// A later SendMsg that fails on the client (laterSendErr) finishes the
// stream with its own error, as grpc-go does, and returns it.
type finishedStream struct {
	grpc.ClientStream
	done         func(balancer.DoneInfo)
	onFinish     func(error)
	end          error
	recvErr      error
	laterSendErr error
	sent         bool
}

func (s *finishedStream) SendMsg(any) error {
	if s.sent {
		s.onFinish(s.laterSendErr)
		return s.laterSendErr
	}
	s.sent = true
	s.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	return nil
}

func (s *finishedStream) CloseSend() error { return nil }

func (s *finishedStream) Header() (metadata.MD, error) {
	s.onFinish(s.end)
	return nil, nil
}

func (s *finishedStream) RecvMsg(any) error {
	s.onFinish(s.end)
	return s.recvErr
}

// A held stream attempt counts as the status gRPC finished the stream
// with (grpc.OnFinish), which the application may never get: a trailers-
// only rejection read by Header alone, which returns no error, before the
// application leaves; or a status a stream wrapper inside StreamTiming
// turned into an error of its own. Before, both counted as neither (left
// unread; errStreamHidden) although gRPC had read the overload. The
// client's own ends (its deadline, its cancel, a later SendMsg's own
// error, which grpc-go finishes the stream with: a message over the send
// limit would have counted as a success) still count as neither: they are
// not the server's answer. A status RecvMsg reads while another goroutine
// sends is the attempt's.
func TestHeldStreamAttemptIsSettledByGRPCsFinish(t *testing.T) {
	busy := status.Error(codes.ResourceExhausted, "rate limited")
	for _, tc := range []struct {
		name    string
		end     error
		recvErr error
		header  bool // the application reads Header, not RecvMsg
		expired bool // the application's context has ended by then
		// laterSendErr: the application sends again, gets this error
		// and leaves.
		laterSendErr     error
		sendingMeanwhile bool // another goroutine is in SendMsg as RecvMsg reads the end
		want             [4]uint64
	}{
		{name: "Header alone", end: busy, header: true, want: [4]uint64{0, 0, 1, 0}},
		{name: "status hidden by a wrapper", end: busy, recvErr: errors.New("the wrapper's own error"), want: [4]uint64{0, 0, 1, 0}},
		{name: "RecvMsg", end: busy, recvErr: busy, want: [4]uint64{0, 0, 1, 0}},
		{name: "server's deadline", end: status.Error(codes.DeadlineExceeded, "server timeout"), recvErr: status.Error(codes.DeadlineExceeded, "server timeout"), want: [4]uint64{0, 1, 0, 0}},
		{name: "client's deadline", end: status.Error(codes.DeadlineExceeded, "context deadline exceeded"), header: true, expired: true, want: [4]uint64{0, 0, 0, 1}},
		{name: "client's cancel", end: status.Error(codes.Canceled, "context canceled"), header: true, want: [4]uint64{0, 0, 0, 1}},
		{name: "a later send over the client's limit", laterSendErr: status.Error(codes.ResourceExhausted, "trying to send message larger than max (9 vs. 4)"), want: [4]uint64{0, 0, 0, 1}},
		{name: "a later send after CloseSend", laterSendErr: status.Error(codes.Internal, "SendMsg called after CloseSend"), want: [4]uint64{0, 0, 0, 1}},
		{name: "RecvMsg while another goroutine sends", end: busy, recvErr: busy, sendingMeanwhile: true, want: [4]uint64{0, 0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := core.New(core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
				if err != nil {
					return nil, err
				}
				fs := &finishedStream{done: res.Done, end: tc.end, recvErr: tc.recvErr, laterSendErr: tc.laterSendErr}
				for _, o := range opts {
					if f, ok := o.(grpc.OnFinishCallOption); ok {
						fs.onFinish = f.OnFinish
					}
				}
				require.NotNil(t, fs.onFinish, "StreamTiming passes no grpc.OnFinish")
				return fs, nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cs, err := StreamTiming(nil)(ctx, &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
			require.NoError(t, err)
			require.NoError(t, cs.SendMsg(nil))
			require.NoError(t, cs.CloseSend())
			require.EqualValues(t, 1, b.Stats()[0].InFlight, "held")
			if tc.expired {
				cancel() // its AfterFunc may settle first: neither either way
			}
			switch {
			case tc.laterSendErr != nil:
				assert.Equal(t, tc.laterSendErr, cs.SendMsg(nil))
			case tc.header:
				_, err := cs.Header()
				require.NoError(t, err)
			case tc.sendingMeanwhile:
				st := cs.(*timedStream).st
				st.sending.Store(true) // as SendMsg on another goroutine
				assert.Equal(t, tc.recvErr, cs.RecvMsg(nil))
				st.sending.Store(false)
			default:
				assert.Equal(t, tc.recvErr, cs.RecvMsg(nil))
			}
			if tc.expired {
				awaitIdle(t, b, "expired")
			}
			s := b.Stats()[0]
			assert.Equal(t, tc.want, [4]uint64{s.Successes, s.Failures, s.Overloads, s.Canceled})
			assert.Zero(t, s.InFlight)
		})
	}
}
