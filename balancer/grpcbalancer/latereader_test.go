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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// streamLate runs one server stream as stream does, for an application
// that calls RecvMsg for the first time late after the stream began, and
// then receives every message as soon as it can. The server sends its
// first message at ttft from the stream's start and the next ones gap
// apart; those sent before the application came are already received. It
// returns the endpoint that served it.
func streamLate(t *testing.T, h *harness, clock *testutil.Clock, end error, late, ttft, gap time.Duration, n int) string {
	t.Helper()
	var gaps []time.Duration
	reader := late
	for i := range n {
		at := ttft + time.Duration(i)*gap
		gaps = append(gaps, max(at-reader, 0))
		reader = max(reader, at)
	}
	cs, addr := scriptedCall(t, h, clock, nil, end, gaps)
	clock.Advance(late)
	for range gaps {
		require.NoError(t, cs.RecvMsg(nil))
	}
	require.Error(t, cs.RecvMsg(nil))
	return *addr
}

// TestStreamTimingLateReader: the time of a stream's first token is the
// endpoint's only when the application was in RecvMsg, or came for it soon
// after the stream began. One that starts receiving a second late (setting
// up, logging, a handoff to another goroutine) finds the first tokens
// received: its first RecvMsg returns one at once, and an endpoint's 50ms
// to the first token read as 1s and, as the application then caught up on
// the received tokens, its 20ms per token as 10ms, so it looked twice as
// fast at decoding as it is. A RecvMsg that waits for the first token
// measures it however late it began.
func TestStreamTimingLateReader(t *testing.T) {
	const (
		tokens = 100
		ttft   = 50 * time.Millisecond
		gap    = 20 * time.Millisecond
	)
	for _, tc := range []struct {
		name            string
		late, ttft      time.Duration
		wantTTFT, wantT time.Duration
	}{
		{"prompt reader", 0, ttft, ttft, gap},
		{"reader a second late", time.Second, ttft, 0, 0},
		{"reader a little late", 5 * time.Millisecond, ttft, ttft, gap},
		{"reader late, but before the first token", time.Second, 3 * time.Second, 3 * time.Second, gap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			a := streamLate(t, h, clock, nil, tc.late, tc.ttft, gap, tokens)
			s := stats(t, b, a)
			t.Logf("TTFT %v, time per output token %v", s.TTFT, s.TimePerOutputToken)
			assert.Equal(t, tc.wantTTFT, s.TTFT)
			assert.Equal(t, tc.wantT, s.TimePerOutputToken)
			assert.EqualValues(t, 1, s.Successes)
		})
	}
	t.Run("deadline mid-stream", func(t *testing.T) {
		// The first token came, if at an unknown time: a deadline after
		// it still counts as neither success nor failure.
		clock := testutil.NewClock()
		b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
		h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
		deadline := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
		a := streamLate(t, h, clock, deadline, time.Second, ttft, gap, tokens)
		s := stats(t, b, a)
		assert.Zero(t, s.Failures)
		assert.Zero(t, s.TTFT)
	})
}

// headerStream is a scriptedStream whose Header waits wait for the
// response headers.
type headerStream struct {
	*scriptedStream
	wait time.Duration
}

func (s *headerStream) Header() (metadata.MD, error) {
	s.clock.Advance(s.wait)
	return nil, nil
}

// TestStreamTimingWaitsBeforeTheFirstToken: time the application spends
// waiting on the stream before the RecvMsg that delivers the first token
// is no time away from it: in Header (the first message often comes with
// the headers, and is received at once after), or in receiving a message
// that carries no token. Time spent elsewhere is.
func TestStreamTimingWaitsBeforeTheFirstToken(t *testing.T) {
	for _, tc := range []struct {
		name     string
		late     time.Duration // away before Header, or before the first RecvMsg
		header   time.Duration // Header's wait; -1: Header is not called
		gaps     []time.Duration
		counts   []int
		wantTTFT time.Duration
		wantTPOT time.Duration
	}{
		{"waits in Header", 0, 50 * time.Millisecond, []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}, nil, 50 * time.Millisecond, 20 * time.Millisecond},
		{"late, then Header at once", time.Second, 0, []time.Duration{0, 0, 0, 0}, nil, 0, 0},
		{"waits for a message with no token", 0, -1, []time.Duration{50 * time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}, []int{0, 1, 1, 1, 1}, 52 * time.Millisecond, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			var tokens func(any) int
			if tc.counts != nil {
				counts := tc.counts
				tokens = func(any) int {
					n := counts[0]
					counts = counts[1:]
					return n
				}
			}
			var addr string
			streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
				res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
				if err != nil {
					return nil, err
				}
				addr = res.SubConn.(*grpcfake.SubConn).Addr()
				return &headerStream{&scriptedStream{clock: clock, gaps: tc.gaps, done: res.Done}, tc.header}, nil
			}
			cs, err := StreamTiming(tokens)(context.Background(), &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
			require.NoError(t, err)
			clock.Advance(tc.late)
			if tc.header >= 0 {
				_, err := cs.Header()
				require.NoError(t, err)
			}
			for range tc.gaps {
				require.NoError(t, cs.RecvMsg(nil))
			}
			require.Error(t, cs.RecvMsg(nil))
			s := stats(t, b, addr)
			assert.Equal(t, tc.wantTTFT, s.TTFT)
			assert.Equal(t, tc.wantTPOT, s.TimePerOutputToken)
		})
	}
}
