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

// scriptedStream is a server stream as the application sees it: each
// RecvMsg advances the clock by the next gap and returns a message; after
// the last it ends the attempt (gRPC reports Done before RecvMsg returns
// io.EOF) and returns io.EOF.
type scriptedStream struct {
	grpc.ClientStream
	clock *testutil.Clock
	gaps  []time.Duration
	done  func(balancer.DoneInfo)
	end   error // how the stream ends after its messages; nil: io.EOF
}

func (s *scriptedStream) RecvMsg(any) error {
	if len(s.gaps) == 0 {
		s.done(balancer.DoneInfo{Err: s.end, BytesSent: true, BytesReceived: true})
		if s.end != nil {
			return s.end
		}
		return io.EOF
	}
	s.clock.Advance(s.gaps[0])
	s.gaps = s.gaps[1:]
	return nil
}

// stream runs one server stream through the StreamTiming interceptor and
// the picker, as gRPC would: pick, then receive every message; tokens is
// the interceptor's counter. It returns the endpoint that served it.
func stream(t *testing.T, h *harness, clock *testutil.Clock, tokens func(any) int, gaps ...time.Duration) string {
	t.Helper()
	return streamEnding(t, h, clock, tokens, nil, gaps...)
}

// streamEnding is stream for a stream that ends with end after its
// messages (nil: a normal end).
func streamEnding(t *testing.T, h *harness, clock *testutil.Clock, tokens func(any) int, end error, gaps ...time.Duration) string {
	t.Helper()
	return streamPaced(t, h, clock, tokens, end, 0, 0, gaps...)
}

// streamPaced is streamEnding for a reader that spends away after each
// message it receives (its own work on it, out of RecvMsg), and before
// the receive that ends the stream, after its last message, beforeEnd.
func streamPaced(t *testing.T, h *harness, clock *testutil.Clock, tokens func(any) int, end error, away, beforeEnd time.Duration, gaps ...time.Duration) string {
	t.Helper()
	cs, addr := scriptedCall(t, h, clock, tokens, end, gaps)
	for range gaps {
		require.NoError(t, cs.RecvMsg(nil))
		clock.Advance(away)
	}
	clock.Advance(beforeEnd)
	require.Error(t, cs.RecvMsg(nil))
	return *addr
}

// scriptedCall opens a stream through StreamTiming(tokens) and the
// harness's picker whose messages come gaps apart (see scriptedStream),
// and returns it with where the address of the endpoint picked for it is
// written.
func scriptedCall(t *testing.T, h *harness, clock *testutil.Clock, tokens func(any) int, end error, gaps []time.Duration) (grpc.ClientStream, *string) {
	t.Helper()
	addr := new(string)
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
		if err != nil {
			return nil, err
		}
		*addr = res.SubConn.(*grpcfake.SubConn).Addr()
		return &scriptedStream{clock: clock, gaps: gaps, done: res.Done, end: end}, nil
	}
	cs, err := StreamTiming(tokens)(context.Background(), &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
	require.NoError(t, err)
	return cs, addr
}

// TestDeadlineMidStreamIsNotAFailure: a deadline that ends a stream after
// its first token counts as neither success nor failure (a long answer ran
// out the caller's time budget on a working endpoint); one that passes
// before any token is a failure.
func TestDeadlineMidStreamIsNotAFailure(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	deadline := status.Error(codes.DeadlineExceeded, "context deadline exceeded")

	a := streamEnding(t, h, clock, nil, deadline, 200*time.Millisecond, 20*time.Millisecond)
	s := stats(t, b, a)
	assert.Zero(t, s.Failures, "mid-stream deadline")
	assert.Zero(t, s.Successes)
	assert.Equal(t, 200*time.Millisecond, s.TTFT, "the first token is still measured")

	streamEnding(t, h, clock, nil, deadline) // no message before the deadline
	assert.EqualValues(t, 1, stats(t, b, a).Failures, "deadline before the first token")
}

func TestStreamTimingMeasuresFirstTokenAndDecodeSpeed(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)

	// First token 200 ms after the pick, then 9 more 20 ms apart.
	gaps := []time.Duration{200 * time.Millisecond}
	for range 9 {
		gaps = append(gaps, 20*time.Millisecond)
	}
	a := stream(t, h, clock, nil, gaps...)
	s := stats(t, b, a)
	assert.Equal(t, 200*time.Millisecond, s.TTFT)
	assert.Equal(t, 20*time.Millisecond, s.TimePerOutputToken)
	assert.Equal(t, 380*time.Millisecond, s.Latency)

	// A counter that reads tokens from the messages: a first message with
	// no output (a role or metadata frame) is not the first token.
	counts := []int{0, 4, 4, 4}
	tokens := func(any) int {
		n := counts[0]
		counts = counts[1:]
		return n
	}
	b2 := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(2)})
	h2 := newHarness(t, registerShared(b2), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	a = stream(t, h2, clock, tokens, 50*time.Millisecond, 100*time.Millisecond, 30*time.Millisecond, 30*time.Millisecond)
	s = stats(t, b2, a)
	assert.Equal(t, 150*time.Millisecond, s.TTFT)
	assert.Equal(t, 60*time.Millisecond/11, s.TimePerOutputToken, "60 ms over the 11 tokens after the first")
}

// A client-streaming call through the interceptor, without it, or on a
// unary call, says nothing about tokens: the picker reports latency only.
// (A client-streaming call's end is still corrected: see
// TestEarlyRejectedStreamIsAnOverloadThroughStreamTiming.)
func TestStreamTimingOnlyTimesServerStreams(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(3)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		require.NotNil(t, streamStateFrom(ctx, "/ai.Gen/Upload"), "a client-streaming call's end goes uncorrected")
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Upload", Ctx: ctx})
		if err != nil {
			return nil, err
		}
		// The upload's one answer comes 300 ms after the call began.
		return &scriptedStream{clock: clock, gaps: []time.Duration{300 * time.Millisecond}, done: res.Done}, nil
	}
	cs, err := StreamTiming(nil)(context.Background(), &grpc.StreamDesc{ClientStreams: true}, nil, "/ai.Gen/Upload", streamer)
	require.NoError(t, err)
	require.NoError(t, cs.RecvMsg(nil))
	require.ErrorIs(t, cs.RecvMsg(nil), io.EOF)
	s := stats(t, b, addr(0))
	assert.Zero(t, s.TTFT, "an upload's answer is no first token")
	assert.Zero(t, s.TimePerOutputToken)
	assert.EqualValues(t, 1, s.Successes)

	_, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat"})
	clock.Advance(time.Second)
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	s = stats(t, b, addr(0))
	assert.Zero(t, s.TTFT)
	assert.Zero(t, s.TimePerOutputToken)
	assert.Equal(t, time.Second, s.Latency)
}

// TestStreamTimingIsTheEndpointsPace: decode speed is the endpoint's, not
// the reader's. A reader that spends longer on each message than the
// endpoint takes to send one finds the next one already received: the
// stream is paced by the reader, and its timing is left out (counted, an
// endpoint sending a token every 20ms read at 50ms a token looked 50ms).
// A reader that receives every token as it comes and only ends the stream
// later (its last receive, which ends the call, after its own work) does
// not slow the endpoint either: decode speed runs to the last token.
func TestStreamTimingIsTheEndpointsPace(t *testing.T) {
	gaps := func(ttft, gap time.Duration) []time.Duration {
		g := []time.Duration{ttft}
		for range 9 {
			g = append(g, gap)
		}
		return g
	}
	for _, tc := range []struct {
		name            string
		gap, away, last time.Duration
		want            time.Duration
	}{
		{"reader waits", 20 * time.Millisecond, 0, 0, 20 * time.Millisecond},
		{"reader ends the stream late", 20 * time.Millisecond, 0, 5 * time.Second, 20 * time.Millisecond},
		{"reader slower than the endpoint", 0, 50 * time.Millisecond, 0, 0},
		{"reader a little faster", 4 * time.Millisecond, 16 * time.Millisecond, 0, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			a := streamPaced(t, h, clock, nil, nil, tc.away, tc.last, gaps(200*time.Millisecond, tc.gap)...)
			s := stats(t, b, a)
			assert.Equal(t, 200*time.Millisecond, s.TTFT)
			assert.Equal(t, tc.want, s.TimePerOutputToken)
		})
	}
}

// TestDeadlineMidStreamWithoutTheTokensTime: a deadline after the first
// token counts as neither also when the token's time is not known, here
// because the Balancer's clock read the same at the pick and at the first
// token (a coarse clock, or a wall clock stepped back in between): the
// token came, so the endpoint was generating.
func TestDeadlineMidStreamWithoutTheTokensTime(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	deadline := status.Error(codes.DeadlineExceeded, "context deadline exceeded")

	a := streamEnding(t, h, clock, nil, deadline, 0, 20*time.Millisecond)
	s := stats(t, b, a)
	assert.Zero(t, s.Failures, "mid-stream deadline, the first token at the pick's clock reading")
	assert.Zero(t, s.Successes)
}

// TestStreamTimingIsTheStreamsOwn: a call made under a timed stream's
// context (ClientStream.Context carries it, and an application may make
// its other calls under it) is not that stream's attempt. Taken for one,
// it started the stream's timing over, and the stream's first token, 200
// ms after its pick, was timed at its second message.
func TestStreamTimingIsTheStreamsOwn(t *testing.T) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	var streamCtx context.Context
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, method string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		streamCtx = ctx
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		if err != nil {
			return nil, err
		}
		gaps := []time.Duration{200 * time.Millisecond}
		for range 9 {
			gaps = append(gaps, 20*time.Millisecond)
		}
		return &scriptedStream{clock: clock, gaps: gaps, done: res.Done}, nil
	}
	cs, err := StreamTiming(nil)(context.Background(), &grpc.StreamDesc{ServerStreams: true}, nil, "/ai.Gen/Stream", streamer)
	require.NoError(t, err)
	require.NoError(t, cs.RecvMsg(nil)) // the first token

	_, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Embed", Ctx: streamCtx})
	res.Done(sent)

	for range 9 {
		require.NoError(t, cs.RecvMsg(nil))
	}
	require.ErrorIs(t, cs.RecvMsg(nil), io.EOF)
	s := stats(t, b, addr(0))
	assert.Equal(t, 200*time.Millisecond, s.TTFT)
	assert.Equal(t, 20*time.Millisecond, s.TimePerOutputToken)
}
