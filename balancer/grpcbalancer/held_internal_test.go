package grpcbalancer

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An attempt that ends without error is held until the call's error is
// known (retryState.hold): the call's failure is the attempt's; its
// success is the attempt's; and an attempt gRPC then retried failed, with
// an error of its retry policy's, and counts as neither. None stays in
// flight.
func TestHeldAttemptIsSettledByTheCallsError(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	ok := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	inFlight := func() int64 { return b.Stats()[0].InFlight }

	st := &retryState{method: "/svc/M"}
	ctx := context.WithValue(context.Background(), retryKey{}, st)
	retryInUse.Store(true)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(ok)
	assert.EqualValues(t, 1, inFlight(), "held until the call returns")
	st.settle(status.Error(codes.ResourceExhausted, "rate limited"))
	s := stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the call's error")
	assert.Zero(t, inFlight())

	st = &retryState{method: "/svc/M"}
	ctx = context.WithValue(context.Background(), retryKey{}, st)
	_, res = h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(ok)
	_, res = h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx}) // gRPC retries it
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the retried attempt counts as neither")
	assert.EqualValues(t, 1, inFlight(), "the retry")
	res.Done(ok)
	st.settle(nil)
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{1, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the call's success")
	assert.Zero(t, inFlight())
}

// An attempt that gRPC ended without error and with no answer (a refused
// stream racing the request's write: errNoAnswer) is not held by the
// unary interceptors: it is an overload at once, so the transparent retry
// gRPC makes next finds its endpoint cooled down and excluded. Held, the
// retry's pick would settle it as neither (errRetriedAttempt), and the
// retry could go back to the endpoint that refused it.
func TestUnheldNoAnswerCoolsDownBeforeTheRetry(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	st := &retryState{method: "/svc/M"}
	ctx := context.WithValue(context.Background(), retryKey{}, st)
	retryInUse.Store(true)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(balancer.DoneInfo{BytesSent: true}) // no answer
	s := stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "an overload at once")
	assert.False(t, s.ExcludedUntil.IsZero(), "cooled down before gRPC retries")
	assert.Equal(t, a, st.excluded(), "the call's next attempt avoids it")
	assert.Zero(t, s.InFlight)
	st.settle(nil) // the call succeeds elsewhere: nothing held to report
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads})
}

// heldStream picks for a stream opened through StreamTiming (state st,
// whose context is ctx) and ends the attempt as grpc-go ends one whose
// request write failed: without error, while the application sends.
func heldStream(t *testing.T, h *harness, ctx context.Context, st *streamState) string {
	t.Helper()
	streamInUse.Store(true)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: context.WithValue(ctx, streamKey{}, st)})
	st.sending.Store(true)
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	st.sending.Store(false)
	return a
}

// A stream attempt that grpc-go ends without error while the application
// sends its request (the server failed the stream first) is held until
// the application reads how the stream ended (streamState.hold): its
// RecvMsg's error is the attempt's, io.EOF a success. An attempt gRPC
// then retried counts as neither, and so does one whose application left
// the stream (its context ended) unread, however late. One that ends
// without error outside a send (every stream that ends well), or with no
// answer, is reported at once, as before. None stays in flight.
func TestHeldStreamAttemptIsSettledByTheStreamsEnd(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	inFlight := func() int64 { return b.Stats()[0].InFlight }
	counts := func(a string) [3]uint64 {
		s := stats(t, b, a)
		return [3]uint64{s.Successes, s.Failures, s.Overloads}
	}

	st := &streamState{ctx: context.Background(), method: "/ai.Gen/Stream"}
	a := heldStream(t, h, st.ctx, st)
	assert.EqualValues(t, 1, inFlight(), "held until the application reads the stream's end")
	st.settle(status.Error(codes.ResourceExhausted, "rate limited"))
	assert.Equal(t, [3]uint64{0, 0, 1}, counts(a), "RecvMsg's error")
	assert.Zero(t, inFlight())

	st = &streamState{ctx: context.Background(), method: "/ai.Gen/Stream"}
	heldStream(t, h, st.ctx, st)
	st.settle(io.EOF)
	assert.Equal(t, [3]uint64{1, 0, 1}, counts(a), "io.EOF: the stream ended well")

	st = &streamState{ctx: context.Background(), method: "/ai.Gen/Stream"}
	ctx := context.WithValue(st.ctx, streamKey{}, st)
	heldStream(t, h, st.ctx, st)
	_, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx}) // gRPC retries it
	assert.Equal(t, [3]uint64{1, 0, 1}, counts(a), "the retried attempt counts as neither")
	assert.EqualValues(t, 1, inFlight(), "the retry")
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true}) // ended well, in RecvMsg
	assert.Equal(t, [3]uint64{2, 0, 1}, counts(a), "reported at once outside a send")
	assert.Zero(t, inFlight())
	st.settle(io.EOF) // nothing held: nothing more
	assert.Equal(t, [3]uint64{2, 0, 1}, counts(a))

	st = &streamState{ctx: context.Background(), method: "/ai.Gen/Stream"}
	ctx = context.WithValue(st.ctx, streamKey{}, st)
	_, res = h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
	st.sending.Store(true)
	res.Done(balancer.DoneInfo{BytesSent: true}) // reset in a race with the send
	st.sending.Store(false)
	assert.Equal(t, [3]uint64{2, 0, 2}, counts(a), "no answer: an overload at once (errNoAnswer)")
	assert.Zero(t, inFlight())

	// A stream wrapper inside StreamTiming that turns the status into an
	// error of its own hides how the stream ended: held, the attempt was
	// no success (the send found the stream ended), and its error is
	// unknown, so it counts as neither.
	st = &streamState{ctx: context.Background(), method: "/ai.Gen/Stream"}
	heldStream(t, h, st.ctx, st)
	st.settle(errors.New("the wrapper's own error"))
	assert.Equal(t, [3]uint64{2, 0, 2}, counts(a), "an error that is no status: neither")
	assert.Zero(t, inFlight())

	cctx, cancel := context.WithCancel(context.Background())
	st = &streamState{ctx: cctx, method: "/ai.Gen/Stream"}
	heldStream(t, h, cctx, st)
	assert.EqualValues(t, 1, inFlight())
	cancel()
	awaitIdle(t, b, "the application left the stream")
	assert.Equal(t, [3]uint64{2, 0, 2}, counts(a), "left unread: neither")

	st = &streamState{ctx: cctx, method: "/ai.Gen/Stream"} // already ended when the attempt is held
	heldStream(t, h, cctx, st)
	assert.Zero(t, inFlight(), "settled at once")
	assert.Equal(t, [3]uint64{2, 0, 2}, counts(a))
}

// The application's read, its context's end and gRPC's retry may settle a
// held stream attempt at once, from three goroutines: exactly one
// reports it (the race detector watches the pooled call), and none stays
// in flight.
func TestHeldStreamAttemptIsSettledOnce(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	const n = 200
	for range n {
		ctx, cancel := context.WithCancel(context.Background())
		st := &streamState{ctx: ctx, method: "/ai.Gen/Stream"}
		heldStream(t, h, ctx, st)
		var wg sync.WaitGroup
		wg.Go(func() { st.settle(status.Error(codes.ResourceExhausted, "rate limited")) })
		wg.Go(cancel)
		wg.Go(func() { st.settle(errRetriedAttempt) })
		wg.Wait()
	}
	// cancel's settle runs on the context's AfterFunc goroutine, which
	// wg does not wait for: its Done may be under way when the loop
	// ends, in flight no more and its end not yet counted (Picks, which
	// adds the two, read 199 once in 50 runs of the package under load).
	// Wait until every end is counted, or in flight.
	ended := func() bool {
		s := b.Stats()[0]
		return s.InFlight == 0 && s.Successes+s.Failures+s.Overloads+s.Canceled == n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := testhook.Await(ctx, b, ended); err != nil {
		t.Fatalf("settled from three goroutines: not every end counted after 5s: %+v", b.Stats())
	}
	s := b.Stats()[0]
	assert.Zero(t, s.Successes+s.Failures)
	assert.LessOrEqual(t, s.Overloads, uint64(n))
	assert.EqualValues(t, n, s.Picks)
}

// Two attempts of one stream that end without error while it sends, with
// no pick between them (hedged attempts; grpc-go makes none today, and a
// retry's pick settles the held one first): streamState.hold keeps the
// first and reports the second at once, as grpc-go ended it, so neither
// stays in flight, and the first is settled by the stream's end. Ended
// at once from two goroutines, exactly one is held, whichever wins.
func TestSecondHeldStreamAttemptIsReportedAtOnce(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
	inFlight := func() int64 { return b.Stats()[0].InFlight }
	ok := balancer.DoneInfo{BytesSent: true, BytesReceived: true}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &streamState{ctx: ctx, method: "/ai.Gen/Stream"}
	streamInUse.Store(true)
	pctx := context.WithValue(ctx, streamKey{}, st)
	a, first := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: pctx})
	_, second := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: pctx})
	require.EqualValues(t, 2, inFlight())
	st.sending.Store(true)
	first.Done(ok)
	assert.EqualValues(t, 2, inFlight(), "the first is held")
	second.Done(ok)
	assert.EqualValues(t, 1, inFlight(), "the second is reported at once")
	s := stats(t, b, a)
	assert.Equal(t, [3]uint64{1, 0, 0}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "as grpc-go ended it")
	st.sending.Store(false)
	st.settle(status.Error(codes.ResourceExhausted, "rate limited"))
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{1, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the held one: the stream's end")
	assert.Zero(t, inFlight())
	cancel()

	const n = 200
	for range n {
		ctx, cancel := context.WithCancel(context.Background())
		st := &streamState{ctx: ctx, method: "/ai.Gen/Stream"}
		pctx := context.WithValue(ctx, streamKey{}, st)
		_, first := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: pctx})
		_, second := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: pctx})
		st.sending.Store(true)
		var wg sync.WaitGroup
		wg.Go(func() { first.Done(ok) })
		wg.Go(func() { second.Done(ok) })
		wg.Wait()
		assert.EqualValues(t, 1, inFlight(), "exactly one is held")
		st.settle(status.Error(codes.ResourceExhausted, "rate limited"))
		assert.Zero(t, inFlight())
		cancel()
	}
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{1 + n, 0, 1 + n}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "one reported at once, one held, per stream")
}

// rejectedStream is a stream as grpc-go gives it to StreamTiming when the
// server failed it before the client wrote its request: the first SendMsg
// ends the attempt without error (and returns nil on a server stream,
// io.EOF on a bidirectional one), a later one returns laterErr, and
// RecvMsg returns the server's status.
type rejectedStream struct {
	grpc.ClientStream
	done              func(balancer.DoneInfo)
	sendErr, laterErr error
	sent              bool
}

func (s *rejectedStream) SendMsg(any) error {
	if s.sent {
		return s.laterErr
	}
	s.sent = true
	s.done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	return s.sendErr
}

func (s *rejectedStream) CloseSend() error { return nil }

func (s *rejectedStream) RecvMsg(any) error {
	return status.Error(codes.ResourceExhausted, "rate limited")
}

// Through StreamTiming's stream, a rejected stream's attempt counts as what
// the application's RecvMsg returns, on a server stream and on a
// bidirectional one, and as neither when a later send fails on the client
// (the application may leave the stream then).
func TestStreamTimingReportsTheStreamsOwnEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bidi     bool
		laterErr error // the application sends again, and leaves on an error
		want     [3]uint64
	}{
		{"server stream", false, nil, [3]uint64{0, 0, 1}},
		{"bidi", true, nil, [3]uint64{0, 0, 1}},
		{"bidi left after a client-side send error", true, status.Error(codes.ResourceExhausted, "trying to send message larger than max (9 vs. 4)"), [3]uint64{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := core.New(core.Options{Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 1)
			var sendErr error
			if tc.bidi {
				sendErr = io.EOF
			}
			streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
				res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Stream", Ctx: ctx})
				if err != nil {
					return nil, err
				}
				return &rejectedStream{done: res.Done, sendErr: sendErr, laterErr: tc.laterErr}, nil
			}
			desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: tc.bidi}
			cs, err := StreamTiming(nil)(context.Background(), desc, nil, "/ai.Gen/Stream", streamer)
			require.NoError(t, err)
			assert.Equal(t, sendErr, cs.SendMsg(nil))
			assert.EqualValues(t, 1, b.Stats()[0].InFlight, "held")
			if tc.laterErr != nil {
				assert.Equal(t, tc.laterErr, cs.SendMsg(nil))
			} else {
				require.NoError(t, cs.CloseSend())
				assert.Equal(t, codes.ResourceExhausted, status.Code(cs.RecvMsg(nil)))
			}
			s := b.Stats()[0]
			assert.Equal(t, tc.want, [3]uint64{s.Successes, s.Failures, s.Overloads})
			assert.Zero(t, s.InFlight)
		})
	}
}

// An attempt that ends as its interceptor's call returns (closing the
// held report) is reported exactly once, whichever comes first: held and
// settled by the close, or refused by a closed report and reported at
// once. Run with -race.
func TestHeldReportClosingRacesAnAttemptsEnd(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	retryInUse.Store(true)
	const rounds = 200
	var a string
	for range rounds {
		st := &retryState{method: "/svc/M"}
		ctx := context.WithValue(context.Background(), retryKey{}, st)
		var res balancer.PickResult
		a, res = h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true}) }()
		go func() { defer wg.Done(); st.first.held.close(nil) }()
		wg.Wait()
	}
	s := stats(t, b, a)
	assert.EqualValues(t, rounds, s.Successes, "each attempt reported once")
	assert.Zero(t, s.InFlight)
}

// gRPC's retry of a held attempt may be picked while no endpoint is READY
// (the channel's picker is then notReadyPicker): that pick settles the
// held attempt as retried, neither success nor failure, as the policy's
// own picker does. It was left held until the call returned, and then
// counted with the call's error (a failure when the retry found no
// endpoint).
func TestHeldAttemptSettledByAPickWhileNotReady(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	retryInUse.Store(true)
	st := &retryState{method: "/svc/M"}
	ctx := context.WithValue(context.Background(), retryKey{}, st)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	require.EqualValues(t, 1, b.Stats()[0].InFlight, "held")

	nr := &notReadyPicker{next: base.NewErrPicker(balancer.ErrNoSubConnAvailable)}
	_, err := nr.Pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx}) // gRPC retries it
	require.ErrorIs(t, err, balancer.ErrNoSubConnAvailable)
	s := stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 0}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the retried attempt counts as neither")
	assert.Zero(t, b.Stats()[0].InFlight)
	st.settle(status.Error(codes.Unavailable, "no endpoint"))
	s = stats(t, b, a)
	assert.Zero(t, s.Failures, "the call's error is not the retried attempt's")
}

// settle reports the first invoke's held attempt, if any, with err, as
// invokeSettled does for each invoke as its invoker returns. nil st
// settles nothing.
func (st *retryState) settle(err error) {
	if st != nil {
		st.first.held.settle(err)
	}
}
