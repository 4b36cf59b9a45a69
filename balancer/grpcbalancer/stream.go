package grpcbalancer

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/pace"
)

// streamState links one stream to the picker: the picker resets it for
// each attempt and records the Balancer that routed it, whose clock the
// stream then stamps its first token with; Done reads what the stream saw.
//
// Concurrency: the application's goroutine receives, gRPC's reports Done;
// every field is atomic.
type streamState struct {
	core   atomic.Pointer[core.Balancer]
	first  atomic.Int64 // the routing Balancer's clock at the first token, unix ns; 0 = none yet
	last   atomic.Int64 // ... at the latest token
	tokens atomic.Int64 // output tokens received in the current attempt
	// The application's time blocked in RecvMsg since the first token: in
	// all (written by the receiving goroutine only), and up to the latest
	// token (see package pace).
	waited, waitedLast atomic.Int64
}

type streamKey struct{}

// streamInUse spares picks the context lookup until a StreamTiming
// interceptor exists.
var streamInUse atomic.Bool

func streamStateFrom(ctx context.Context) *streamState {
	if ctx == nil || !streamInUse.Load() {
		return nil
	}
	st, _ := ctx.Value(streamKey{}).(*streamState)
	return st
}

// attempt readies st for a new attempt routed by b. No response has
// arrived yet when gRPC picks (transparent retries happen before any), so
// nothing is lost by starting over.
func (st *streamState) attempt(b *core.Balancer) {
	st.first.Store(0)
	st.last.Store(0)
	st.tokens.Store(0)
	st.waited.Store(0)
	st.waitedLast.Store(0)
	st.core.Store(b)
}

// fill adds the stream's timing to a successful attempt's outcome: time to
// first token from the pick, and the output tokens received. Its latency,
// which decode speed is taken from, runs to the last token: an
// application that receives every token as it comes and ends the stream
// later (its last receive after its own work) has had all the endpoint
// did. A stream the application paced (package pace) reports no output
// tokens: its timing is the application's.
func (st *streamState) fill(o *inferlb.Outcome, pickedAt time.Time) {
	first := st.first.Load()
	n := st.tokens.Load()
	if first == 0 || n <= 0 {
		return
	}
	if ttft := time.Duration(first - pickedAt.UnixNano()); ttft > 0 {
		o.TTFT = ttft
		o.OutputTokens = int(min(n, 1<<31-1))
		last := st.last.Load()
		o.Latency = time.Duration(last - pickedAt.UnixNano())
		if pace.ReaderPaced(st.waitedLast.Load(), last-first) {
			o.OutputTokens = 0
		}
	}
}

// StreamTiming returns a stream client interceptor that times server
// streams as token generation: the first response message that carries
// output is the first token, and each message carries tokens(msg) output
// tokens (nil counts one per message, as Triton's decoupled models and
// most token streams send). The inferlb picker reports both with the
// stream's outcome, so the Balancer learns each endpoint's time to first
// token and decode speed (time per output token after the first), which P2C
// weighs between generation candidates as it does for the HTTP transport's
// SSE streams, and which Stats and the metrics export.
//
// Install it with grpc.WithChainStreamInterceptor on channels that use the
// inferlb policy; elsewhere, and on unary calls, it does nothing. It suits
// streams that carry one generation each (server streaming, or a
// bidirectional stream with one request); a stream that carries many
// requests would be timed as one long generation.
func StreamTiming(tokens func(msg any) int) grpc.StreamClientInterceptor {
	streamInUse.Store(true)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if !desc.ServerStreams {
			return streamer(ctx, desc, cc, method, opts...)
		}
		st := &streamState{}
		cs, err := streamer(context.WithValue(ctx, streamKey{}, st), desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &timedStream{ClientStream: cs, st: st, tokens: tokens}, nil
	}
}

// timedStream counts the output tokens of the messages it receives.
type timedStream struct {
	grpc.ClientStream
	st     *streamState
	tokens func(any) int
}

func (s *timedStream) RecvMsg(m any) error {
	b := s.st.core.Load()
	var entered int64
	if b != nil && s.st.first.Load() != 0 {
		entered = b.Now().UnixNano() // see package pace
	}
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		return err
	}
	var now int64
	if entered != 0 {
		now = b.Now().UnixNano()
		s.st.waited.Add(max(now-entered, 0))
	}
	n := 1
	if s.tokens != nil {
		n = s.tokens(m)
	}
	if n <= 0 || b == nil {
		return nil
	}
	if now == 0 {
		now = max(b.Now().UnixNano(), 1)
	}
	if s.st.tokens.Add(int64(n)) == int64(n) {
		s.st.first.Store(now)
	}
	s.st.waitedLast.Store(s.st.waited.Load())
	s.st.last.Store(now)
	return nil
}
