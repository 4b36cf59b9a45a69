package grpcbalancer

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/pace"
	"github.com/inferlb/inferlb/internal/shed"
)

// streamState links one stream to the picker: the picker resets it for
// each attempt and records the Balancer that routed it, whose clock the
// stream then stamps its first token with (Balancer.Stamp: a forward step
// of the wall clock is no time between stamps; read from Now, a step of
// an hour before a stream's first token made its TTFT an hour, and one
// between its tokens its decode speed); Done reads what the stream saw.
//
// Concurrency: ctx and method are immutable; the application's goroutines
// receive and send, gRPC's reports Done; every other field is atomic.
type streamState struct {
	ctx context.Context // the application's, that the stream was opened with
	// method is the stream's: a pick for another method found st in a
	// context derived from the stream's own (ClientStream.Context carries
	// st), a call the application made under it, not one of its attempts.
	method string

	// sending is set while the application is in SendMsg: an attempt that
	// gRPC ends without error then is no success (see hold).
	sending atomic.Bool
	// An attempt's report held until the application learns how the
	// stream ended (see hold).
	held heldReport

	core   atomic.Pointer[core.Balancer]
	first  atomic.Int64 // the routing Balancer's Stamp at the first token; 0 = none yet
	last   atomic.Int64 // ... at the latest token
	tokens atomic.Int64 // output tokens received in the current attempt
	// Before the first token (see package pace): the time from which the
	// application's time away from the stream counts (when the stream was
	// created or the application's latest send returned, moved on by each
	// wait since in Header or in a RecvMsg that received no token), and
	// when the RecvMsg that received the token began. A transparent retry
	// keeps from: it resends what the application sent.
	from, entered atomic.Int64
	// The application's time blocked in RecvMsg since the first token: in
	// all (written by the receiving goroutine only), and up to the latest
	// token (see package pace).
	waited, waitedLast atomic.Int64
	// inband is the first error a response message of the current attempt
	// carried (StreamOptions.Error), or nil.
	inband atomic.Pointer[error]
	// got is set once a message of the current attempt is received;
	// awaiting is when the RecvMsg the application is in, waiting for the
	// stream's first message, began (the routing Balancer's Stamp; 0
	// when it is in none). See unanswered.
	got      atomic.Bool
	awaiting atomic.Int64

	// msgMu guards firstMsg, the first message the application sent,
	// which a refusal as too long is checked against (see
	// call.believed), and msgs, how many it sent. Written by the sending
	// goroutine, read by Done's.
	msgMu    sync.Mutex
	firstMsg any
	msgs     int
}

// believed reports whether a refusal of the stream as too long is
// believed: not when the message the application sent carries a refusal's
// text (carriesRefusal), nor when it sent more than one (only the first
// is kept: a server may have copied any of them). A stream that sent
// nothing yet carries nothing.
func (st *streamState) believed() bool {
	st.msgMu.Lock()
	m, n := st.firstMsg, st.msgs
	st.msgMu.Unlock()
	return n == 0 || n == 1 && !carriesRefusal(m)
}

type streamKey struct{}

// streamInUse spares picks the context lookup until a StreamTiming
// interceptor exists.
var streamInUse atomic.Bool

func streamStateFrom(ctx context.Context, method string) *streamState {
	if ctx == nil || !streamInUse.Load() {
		return nil
	}
	st, _ := ctx.Value(streamKey{}).(*streamState)
	if st == nil || st.method != method {
		return nil
	}
	return st
}

// attempt readies st for a new attempt routed by b. No response has
// arrived yet when gRPC picks (transparent retries happen before any), so
// nothing is lost by starting over.
func (st *streamState) attempt(b *core.Balancer) {
	st.first.Store(0)
	st.last.Store(0)
	st.tokens.Store(0)
	st.entered.Store(0)
	st.waited.Store(0)
	st.waitedLast.Store(0)
	st.inband.Store(nil)
	st.got.Store(false) // a retried attempt had none; awaiting is the application's, and stays
	st.core.Store(b)
}

// unanswered reports whether the caller's cancellation of a stream whose
// server sent its headers, with start the attempt's pick (Pick.Stamped), left
// it with nothing of its answer: the application was in a RecvMsg
// waiting for the stream's first message when the attempt ended, and
// had come for it in time, as the HTTP transport's reader must
// (pace.ReaderLate: a message may have been received while it was away,
// and a RecvMsg the cancel ends returns the cancel, not the message).
// grpc-go counts the headers as bytes received
// (balancer.DoneInfo.BytesReceived), and a server sends them at once: a
// hung stream its callers gave up on before any message looked answered,
// and fed no signal (TestE2EHungStreamCancelledBeforeAMessageIsUnanswered).
// A RecvMsg that found the stream's context ended already waited for
// nothing, and a message received just as the context ends may count
// as none (grpc-go ends the attempt on a goroutine of its own). A
// bidirectional stream whose application sent no message yet asked for
// nothing (a session opened ahead of its first request): its cancel was
// no wait for an answer.
func (st *streamState) unanswered(start int64) bool {
	entered := st.awaiting.Load()
	b := st.core.Load()
	if entered == 0 || b == nil || st.got.Load() {
		return false
	}
	st.msgMu.Lock()
	asked := st.msgs > 0
	st.msgMu.Unlock()
	if !asked {
		return false
	}
	now := b.Stamp()
	from := st.from.Load()
	if from == 0 {
		from = start // not created through StreamTiming's interceptor
	}
	return !pace.ReaderLate(entered-from, now-entered, now-start)
}

// errStreamLeft is the report of a held attempt (see hold) whose
// application left the stream before gRPC read how it ended: its context
// ended, or a later SendMsg failed on the client. The server ended the
// stream with an error, but which one (an overload, a failure, or an
// answer about the request, which counts as a success) is in the status
// nobody read. It wraps context.Canceled, so the balancer counts it as
// neither: a success would be grpc-go's misreport again, and a guess
// could trip a breaker on rate-limit answers or cool down an endpoint
// that only refused a bad request.
var errStreamLeft = fmt.Errorf("inferlb: the application left the stream the server had failed before reading its status: %w", context.Canceled)

// hold keeps the report of an attempt that grpc-go ended without error
// while the application was sending the request, until the application
// learns how the stream ended (settle). grpc-go ends an attempt so when
// the server ended the stream with an error before the client had written
// its request (see outcome): the write fails with io.EOF, and grpc-go
// finishes the attempt with it only when the stream's status is not OK
// (clientStream.withRetry; on OK it leaves the attempt to RecvMsg), so
// this is no success (but for a request gRPC replays in a retry, whose
// failed write ends the attempt whatever its status), and the error is
// the status gRPC finishes the stream with (finished), which RecvMsg
// returns. A
// stream that ends well is reported at once, as before: grpc-go reports
// its success in the RecvMsg that returns io.EOF, or in the Header that
// finds the stream ended; so is an attempt with no answer at all
// (errNoAnswer), whose transparent retry must find it cooled down.
//
// Until settled, the report waits for the application's context too: an
// application that leaves the stream before gRPC has read its end (its
// own deadline, or a cancel after a failed send, or closing the
// ClientConn) settles it as errStreamLeft.
// hold reports false when another attempt is held already: that one is
// reported now, as before.
func (st *streamState) hold(c *call, di balancer.DoneInfo) bool {
	if st.held.c.Load() != nil {
		return false
	}
	if st.ctx != nil {
		c.heldStop = context.AfterFunc(st.ctx, st.left)
	}
	if !st.held.hold(c, di) {
		if c.heldStop != nil {
			c.heldStop()
			c.heldStop = nil
		}
		return false
	}
	if st.ctx != nil && st.ctx.Err() != nil {
		st.left() // its AfterFunc may have run before held took c
	}
	return true
}

// left settles the held attempt as errStreamLeft: the application's
// context ended before it read the stream's end.
func (st *streamState) left() { st.settle(errStreamLeft) }

// finished is the stream's grpc.OnFinish: gRPC ended the stream with
// err, the status it read (nil when the stream ended well). A
// cancellation (the application's context, or its ClientConn closing:
// grpc.ClientStream's other way to release a stream left unread, which no
// context of the application's tells) settles a held attempt as left, and
// so does the deadline of the application's context: the client's ends,
// not the server's answer. Any other end settles it as what it is, before
// the application reads it, if it ever does: grpc-go finishes a stream
// whose trailers-only answer Header found and returns no error from
// Header ("the user should get it by calling Recv"), and a stream wrapper
// inside StreamTiming may make an error of its own of RecvMsg's status.
// Left to those, an application that read Header and left counted the
// server's overload as neither, and so did one behind such a wrapper
// (errStreamHidden).
//
// An end during a SendMsg is left to SendMsg and RecvMsg: grpc-go
// finishes the stream with a SendMsg's own error (a message over the
// client's send limit, SendMsg after CloseSend), the client's and no
// answer of the server's (SendMsg settles it as left), unless RecvMsg on
// another goroutine read the server's status, which it settles with as
// it returns.
func (st *streamState) finished(err error) {
	code := status.Code(err)
	switch {
	case code == codes.Canceled:
		st.left()
	case code == codes.DeadlineExceeded && st.ctx != nil && st.ctx.Err() != nil:
		st.left()
	case st.sending.Load():
	default:
		// A DEADLINE_EXCEEDED here is the server's, or a deadline an
		// interceptor inside set: RecvMsg's error too.
		st.settle(err)
	}
}

// settle reports the held attempt, if any, with err, how the stream ended:
// the status gRPC finished it with (finished; nil when it ended well, and
// the report stands), RecvMsg's or Header's error (io.EOF: the stream
// ended well), errRetriedAttempt when gRPC retried the attempt, or
// errStreamLeft. Exactly one settle reports an attempt, whichever comes
// first: gRPC's finish, when there is one, comes before RecvMsg returns.
//
// An error that is no gRPC status (a stream wrapper inside StreamTiming
// made its own of the status, and gRPC's finish did not reach us: an
// interceptor inside dropped our grpc.OnFinish) hides how the stream
// ended: a held attempt is no success (its send found the stream ended),
// and its error is unknown, so it counts as neither (errStreamHidden).
func (st *streamState) settle(err error) {
	if _, ok := status.FromError(err); !ok && err != io.EOF && !adopts(err) {
		err = errStreamHidden
	}
	st.held.settle(err)
}

// inbandOutcome makes the outcome of an attempt one of whose messages
// carried an error (StreamOptions.Error) what that error says, unless the
// stream's own end was already a failure or an overload answer: a success,
// or an end the application or a deadline made (it may stop reading at the
// error), says less than the message. The timing fill added stays.
// It reports whether it did: the error is then one the server sent.
func (st *streamState) inbandOutcome(o *inferlb.Outcome) bool {
	p := st.inband.Load()
	if p == nil || o.Overloaded || o.Err != nil && !o.Canceled() {
		return false
	}
	err := *p
	var n inferlb.Outcome
	switch _, isStatus := status.FromError(err); {
	case isStatus:
		n = outcome(balancer.DoneInfo{Err: err, BytesSent: true, BytesReceived: true})
	case shed.In(err.Error()):
		n = inferlb.Outcome{Err: err, Overloaded: true}
	case unknownModel(err.Error()):
		n = inferlb.Outcome{Err: errUnknownModel} // see call.report
	default:
		if w, prompt := refusalWindow(err.Error()); w > 0 {
			n = inferlb.Outcome{ContextWindow: w, PromptWindow: prompt} // see call.report
			break
		}
		n = inferlb.Outcome{Err: err}
	}
	// ContextWindow too: dropped, a refusal as too long (Err nil) read as
	// a success.
	o.Err, o.Overloaded, o.RetryAfter, o.ContextWindow, o.PromptWindow = n.Err, n.Overloaded, n.RetryAfter, n.ContextWindow, n.PromptWindow
	o.ClientError = n.ClientError // an INVALID_ARGUMENT in a message: the request's
	o.Unanswered = false          // a message came back
	return true
}

// errStreamHidden is the report of a held stream attempt whose end the
// application read as an error that is no gRPC status (see settle). It
// wraps context.Canceled, so the balancer counts it as neither.
var errStreamHidden = fmt.Errorf("inferlb: the stream ended with an error that is no gRPC status: %w", context.Canceled)

// fill adds the stream's timing to an attempt's outcome: time to first
// token from the pick (start, its Pick.Stamped), and the output tokens received. Its latency, which
// decode speed is taken from, runs to the last token: an application that
// receives every token as it comes and ends the stream later (its last
// receive after its own work) has had all the endpoint did. A stream the
// application paced reports no output tokens, and one whose first token it
// came for late (package pace) no time to first token either: their timing
// is the application's. A deadline that ended the stream after its first
// token becomes errDeadlineMidStream here, whether or not the token's time
// is known.
func (st *streamState) fill(o *inferlb.Outcome, start int64) {
	first := st.first.Load()
	n := st.tokens.Load()
	if first == 0 || n <= 0 {
		return
	}
	// Before the time checks: the token came, even when the clock cannot
	// place it after the pick (a coarse clock, a wall clock stepped back).
	if o.Err != nil && !o.Canceled() && status.Code(o.Err) == codes.DeadlineExceeded {
		o.Err = errDeadlineMidStream
	}
	ttft := first - start
	if ttft <= 0 {
		return
	}
	last := st.last.Load()
	o.Latency = time.Duration(last - start)
	entered := st.entered.Load()
	from := st.from.Load()
	if from == 0 {
		from = start // not created through StreamTiming's interceptor
	}
	if pace.ReaderLate(entered-from, first-entered, ttft) {
		return
	}
	o.TTFT = time.Duration(ttft)
	if !pace.ReaderPaced(st.waitedLast.Load(), last-first) {
		o.OutputTokens = int(min(n, 1<<31-1))
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
//
// It also gives the policy each such stream's own end, as UnaryOutcome
// does for unary calls, and so for client-streaming calls too (which it
// does not time: their one answer is no token): grpc-go reports a stream the server failed before
// the client had written its request (a long prompt over HTTP/2's 64 KiB
// initial window, rejected unread by a rate limiter) to the balancer as a
// success, and through StreamTiming it counts as the status gRPC ends the
// stream with, which RecvMsg returns to the application (an overload, for
// RESOURCE_EXHAUSTED), also when the application reads only Header (which
// returns no error for such an answer) and leaves. A stream whose
// application leaves it before gRPC has read that end counts as neither.
// A stream its caller cancels in a RecvMsg that waited for its first
// message, its request sent and its headers received, had nothing of its answer
// (inferlb.Outcome.Unanswered): grpc-go counts the headers as received
// bytes, and a hung engine's server sends them at once.
//
// It keeps the first message the application sends, which a refusal of
// the stream as too long is checked against (see Outcomes in the package
// doc): a refusal of a stream whose message carries such text itself, or
// that sent more than one, is no refusal (nothing remembered).
func StreamTiming(tokens func(msg any) int) grpc.StreamClientInterceptor {
	return StreamTimingWith(StreamOptions{Tokens: tokens})
}

// StreamOptions says how StreamTimingWith reads a stream's response
// messages.
type StreamOptions struct {
	// Tokens returns the output tokens a message carries; nil counts one
	// per message (see StreamTiming).
	Tokens func(msg any) int
	// Error returns the error a message carries, or nil. Some servers
	// report a request's failure in a message, not in the stream's status:
	// Triton's decoupled models (ModelStreamInfer, as TensorRT-LLM's
	// streams are served) send a ModelStreamInferResponse whose
	// error_message is set, and the stream itself ends OK, or the
	// application cancels it there. The first such message of an attempt
	// makes the attempt's outcome, whatever status ends the stream after
	// it (OK, CANCELLED, a deadline): a gRPC status is read as a stream's
	// status is (INVALID_ARGUMENT the request's, RESOURCE_EXHAUSTED an
	// overload, INTERNAL a failure; see the package doc's Outcomes); any
	// other error is the endpoint's failure, or an overload answer when
	// its text is a server's load shedding (Triton's "Exceeds maximum
	// queue size" and "Request timeout expired", SGLang's and Ollama's
	// queue-full texts), or neither when it refuses the call as longer
	// than the endpoint's context window (TensorRT-LLM's "Prompt length
	// (N) exceeds maximum sequence length (M)", or vLLM's, SGLang's or
	// TGI's text: inferlb.Outcome.ContextWindow, as for a status that
	// says so). A message with an error carries no token. nil: no
	// message carries one. It runs in RecvMsg, on every message: keep it
	// cheap.
	//
	//	Error: func(msg any) error {
	//		if r, ok := msg.(*inference.ModelStreamInferResponse); ok && r.ErrorMessage != "" {
	//			return errors.New(r.ErrorMessage)
	//		}
	//		return nil
	//	},
	Error func(msg any) error
}

// StreamTimingWith is StreamTiming with the messages read as o says.
func StreamTimingWith(o StreamOptions) grpc.StreamClientInterceptor {
	tokens, errOf := o.Tokens, o.Error
	streamInUse.Store(true)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		count := tokens
		switch {
		case desc.ServerStreams:
		case desc.ClientStreams:
			// An upload (audio for a transcription, say): its one
			// answer is no token, but its end is corrected as a
			// stream's is (see hold).
			count = noTokens
		default:
			return streamer(ctx, desc, cc, method, opts...)
		}
		st := &streamState{ctx: ctx, method: method}
		opts = append(opts[:len(opts):len(opts)], grpc.OnFinish(st.finished))
		cs, err := streamer(context.WithValue(ctx, streamKey{}, st), desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		if b := st.core.Load(); b != nil {
			st.from.Store(b.Stamp()) // see timedStream.sent
		}
		return &timedStream{ClientStream: cs, st: st, tokens: count, errOf: errOf}, nil
	}
}

// noTokens counts no output tokens in a message: a client-streaming call's
// answer.
func noTokens(any) int { return 0 }

// timedStream counts the output tokens of the messages it receives.
type timedStream struct {
	grpc.ClientStream
	st     *streamState
	tokens func(any) int
	errOf  func(any) error // StreamOptions.Error
}

func (s *timedStream) RecvMsg(m any) error {
	b := s.st.core.Load()
	var entered int64
	started := false // the first token came
	if b != nil {
		// Before the first token, to tell whether it was waiting; after
		// it, to measure the wait (see package pace).
		entered = b.Stamp()
		started = s.st.first.Load() != 0
	}
	// Waiting for the first message: a cancel that ends this wait leaves
	// the caller with nothing (see unanswered).
	awaiting := b != nil && !s.st.got.Load() && (s.st.ctx == nil || s.st.ctx.Err() == nil)
	if awaiting {
		s.st.awaiting.Store(max(entered, 1))
	}
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.st.got.Store(true) // before awaiting ends: a Done between sees the message
	}
	if awaiting {
		s.st.awaiting.Store(0)
	}
	if err != nil {
		s.st.settle(err)
		return err
	}
	var now int64
	if started {
		now = b.Stamp()
		s.st.waited.Add(max(now-entered, 0))
	}
	n := 1
	if s.errOf != nil {
		if e := s.errOf(m); e != nil {
			s.st.inband.CompareAndSwap(nil, &e)
			n = 0 // the message carries an error, not a token
		}
	}
	if n > 0 && s.tokens != nil {
		n = s.tokens(m)
	}
	if b == nil {
		return nil
	}
	if n <= 0 {
		if !started {
			// A message before the first token: waiting for it is no
			// time away from the stream.
			s.st.from.Add(max(b.Stamp()-entered, 0))
		}
		return nil
	}
	if now == 0 {
		now = max(b.Stamp(), 1)
	}
	if s.st.tokens.Add(int64(n)) == int64(n) {
		s.st.entered.Store(entered) // before first: fill reads it after
		s.st.first.Store(now)
	}
	s.st.waitedLast.Store(s.st.waited.Load())
	s.st.last.Store(now)
	return nil
}

// SendMsg and CloseSend send the request: no token comes before they
// return, and the application's time away from the stream counts from
// then (see package pace).
//
// SendMsg also marks the send for hold. After a client-side error (not
// io.EOF, which says the status is in RecvMsg) the application may leave
// the stream: a report held then is settled as errStreamLeft.
func (s *timedStream) SendMsg(m any) error {
	s.st.msgMu.Lock()
	if s.st.msgs == 0 {
		s.st.firstMsg = m
	}
	s.st.msgs++
	s.st.msgMu.Unlock()
	s.st.sending.Store(true)
	err := s.ClientStream.SendMsg(m)
	s.st.sending.Store(false)
	if err != nil && err != io.EOF {
		s.st.settle(errStreamLeft)
	}
	s.sent()
	return err
}

func (s *timedStream) CloseSend() error {
	err := s.ClientStream.CloseSend()
	s.sent()
	return err
}

func (s *timedStream) sent() {
	if b := s.st.core.Load(); b != nil && s.st.first.Load() == 0 {
		s.st.from.Store(b.Stamp())
	}
}

// Header waits for the response headers: before the first token, the
// time the application waits in it is no time away from the stream (the
// first message often comes with the headers, and is received at once
// after).
func (s *timedStream) Header() (metadata.MD, error) {
	b := s.st.core.Load()
	if b == nil || s.st.first.Load() != 0 {
		md, err := s.ClientStream.Header()
		if err != nil {
			s.st.settle(err)
		}
		return md, err
	}
	entered := b.Stamp()
	md, err := s.ClientStream.Header()
	s.st.from.Add(max(b.Stamp()-entered, 0))
	if err != nil {
		s.st.settle(err)
	}
	return md, err
}
