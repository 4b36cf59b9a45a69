package grpcbalancer

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/tokenest"
)

// TokenEstimator returns the prompt tokens and the output bound (the
// request's max_tokens, or what the caller knows of it) of a call of
// method whose request message is req. 0 for either means unknown: the
// pick then has no count of that part. It runs on the calling goroutine
// before each pick and must be safe for concurrent use; req is request
// data, so it must not panic on any message.
type TokenEstimator func(method string, req any) (promptTokens, maxOutputTokens int)

// SizeEstimate is the TokenEstimator UnaryEstimate and StreamEstimate use
// when given none: the encoded size of a protobuf message in bytes / 4
// (the HTTP transport's rule of thumb for text), at most 4,194,304
// (httpbalancer.MaxTokenEstimate), and no output bound. A message that is
// no protobuf message (another codec's), or one the protobuf runtime
// cannot size (a gogo/protobuf message it panics on), is unknown: 0.
//
// It counts every field's bytes, not just the prompt's: close for
// requests that are mostly text (a prompt string, Triton's BYTES tensor
// of text) or 4-byte token IDs (an INT32 tensor in Triton's
// raw_input_contents). A prompt given as a packed repeated field of token
// IDs (varints) takes 3 bytes a token for most IDs of a vocabulary of
// 100,000 or more (2 below 16,384), so the estimate comes out about 25%
// low there, up to 50% for prompts of mostly low IDs; INT64 token
// tensors, 8 bytes a token, come out at twice the count. Give a
// TokenEstimator of your own (the length of the ID field, the prompt
// field's alone) where that matters: an estimate above the true count
// also passes over endpoints the Balancer remembers too small for it
// (Outcome.ContextWindow) while others may take it.
func SizeEstimate(_ string, req any) (promptTokens, maxOutputTokens int) {
	var m proto.Message
	switch v := req.(type) {
	case proto.Message:
		m = v
	case protoadapt.MessageV1:
		// A MessageV1 need not be one the protobuf-go runtime can
		// size: gogo/protobuf's messages, which another codec marshals,
		// make it panic (a repeated field of non-nullable messages,
		// once not empty). Such a message is another codec's: unknown.
		defer func() {
			if recover() != nil {
				promptTokens, maxOutputTokens = 0, 0
			}
		}()
		m = protoadapt.MessageV2Of(v)
	default:
		return 0, 0
	}
	return min(proto.Size(m)/tokenest.BytesPerToken, tokenest.Max), 0
}

// estimate is a call's token counts from its request message, which the
// picker fills into the call's Request (see estimated).
type estimate struct {
	// method is the call's: another call made under a context derived
	// from it (per-RPC credentials that call a token service, a call the
	// application makes under a stream's Context) must not take the
	// call's counts (see estimateFrom).
	method            string
	prompt, maxOutput int
}

type estimateKey struct{}

// estimateInUse spares picks the context lookup until an estimating
// interceptor exists.
var estimateInUse atomic.Bool

// withEstimate returns ctx carrying the counts fn gives for req, or ctx
// itself when fn knows neither.
func withEstimate(ctx context.Context, fn TokenEstimator, method string, req any) context.Context {
	p, o := fn(method, req)
	p, o = min(max(p, 0), tokenest.Max), min(max(o, 0), tokenest.Max)
	if p == 0 && o == 0 {
		return ctx
	}
	return context.WithValue(ctx, estimateKey{}, &estimate{method: method, prompt: p, maxOutput: o})
}

// estimateFrom returns the estimate of the call of method that ctx
// carries, or nil. The picker calls it only once estimateInUse is set.
func estimateFrom(ctx context.Context, method string) *estimate {
	if ctx == nil {
		return nil
	}
	e, _ := ctx.Value(estimateKey{}).(*estimate)
	if e == nil || e.method != method {
		return nil
	}
	return e
}

// estimated returns req with the token counts of the call's estimate, if
// any, filled in where req has none (0): a caller's own counts, from the
// inferlb.Request of its context, stand. The Request filled is c's
// scratch space; req itself (the caller's, or a shared template) is
// never written.
func estimated(info balancer.PickInfo, req *inferlb.Request, c *call) *inferlb.Request {
	e := estimateFrom(info.Ctx, info.FullMethodName)
	if e == nil {
		return req
	}
	prompt := req.PromptTokens == 0 && e.prompt > 0
	output := req.MaxOutputTokens == 0 && e.maxOutput > 0
	if !prompt && !output {
		return req
	}
	if req != &c.req {
		c.req = *req
	}
	if prompt {
		c.req.PromptTokens = e.prompt
	}
	if output {
		c.req.MaxOutputTokens = e.maxOutput
	}
	return &c.req
}

// UnaryEstimate returns a unary client interceptor that estimates each
// call's prompt tokens (and output bound) from its request message with
// fn, before the pick, so that the inferlb policy can price the call as
// the HTTP transport prices a request body: its tokens count on the
// chosen endpoint's in-flight tokens, weigh its recent prefill for
// generation calls, and take part in the data-parallel barrier
// (balancer.Options.DPGroupLabel) and the context-window check. grpc-go's
// picker sees only a call's method and context, not its message, so
// without it (or an inferlb.Request with PromptTokens in the context,
// inferlb.NewContext) the policy prices no call's tokens.
//
// fn nil is SizeEstimate: a protobuf message's size / 4, which suits
// prompts of text; give a TokenEstimator of your own for protos that
// carry token IDs or whose size says little of the prompt (Triton's
// ModelInferRequest with INT64 IDs, a message with large non-prompt
// fields). Counts are capped at 4,194,304 (httpbalancer.MaxTokenEstimate).
//
// The estimate fills only what the call's facts leave unknown: an
// inferlb.Request in the context keeps every field it sets (its
// PromptTokens and MaxOutputTokens when not 0), and a call without one
// keeps its Service, affinity key, tenant and model from the method and
// the configured metadata. A pooling call (embedding, rerank) gets
// PromptTokens, which counts as load; its LongestInput, which the
// context-window check weighs for it, stays the caller's to set. Every
// attempt of the call carries the estimate: UnaryRetry's and gRPC's own
// retries. Chain it before or after UnaryRetry or
// UnaryOutcome (grpc.WithChainUnaryInterceptor); either order works. On
// channels without the inferlb policy it does nothing but call fn.
func UnaryEstimate(fn TokenEstimator) grpc.UnaryClientInterceptor {
	if fn == nil {
		fn = SizeEstimate
	}
	estimateInUse.Store(true)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(withEstimate(ctx, fn, method, req), method, req, reply, cc, opts...)
	}
}

// StreamEstimate is UnaryEstimate for server-streaming calls (one
// request, a stream of responses: the usual shape of a token stream).
// gRPC picks a stream's endpoint when the stream is created, before its
// request is sent, so for these calls the interceptor returns a stream
// that creates the real one in its first SendMsg: it estimates from that
// message, creates the stream (the pick), and sends. The generated client
// method of a server-streaming call sends its request at once, so a
// caller sees nothing change but the error of a stream that could not be
// created, which the call returns as before (from SendMsg, not from
// NewStream).
//
// A stream used before its first SendMsg behaves as one created without
// an estimate: Header, CloseSend and RecvMsg create the real stream then,
// unestimated, and act on it; Context returns the call's context until
// the stream is created, and Trailer nil (no trailer has come). Client-
// streaming and bidirectional calls pass through unchanged: their
// requests are many. Chain it with StreamTiming
// (grpc.WithChainStreamInterceptor) in either order.
func StreamEstimate(fn TokenEstimator) grpc.StreamClientInterceptor {
	if fn == nil {
		fn = SizeEstimate
	}
	estimateInUse.Store(true)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if !desc.ServerStreams || desc.ClientStreams {
			return streamer(ctx, desc, cc, method, opts...)
		}
		return &lateStream{ctx: ctx, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts, fn: fn}, nil
	}
}

// errNoStream is the error of a lateStream whose streamer returned
// neither a stream nor an error (an interceptor further in that is
// broken): a call error, not a nil stream to crash on.
var errNoStream = status.Error(codes.Internal, "inferlb: a stream interceptor inside StreamEstimate returned no stream and no error")

// lateStream is a server-streaming call whose stream is created in its
// first SendMsg, with that message's estimate (see StreamEstimate).
//
// Concurrency: gRPC allows one goroutine to send while another receives:
// mu serializes the creation, and made publishes cs and err, which are
// not written after it.
type lateStream struct {
	ctx      context.Context
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	fn       TokenEstimator

	mu   sync.Mutex
	made atomic.Bool
	cs   grpc.ClientStream
	err  error
}

// stream returns the real stream, created first if it is not yet: with
// the estimate of m when send, else without one.
func (s *lateStream) stream(send bool, m any) (grpc.ClientStream, error) {
	if s.made.Load() {
		return s.cs, s.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.made.Load() {
		ctx := s.ctx
		if send {
			ctx = withEstimate(ctx, s.fn, s.method, m)
		}
		s.cs, s.err = s.streamer(ctx, s.desc, s.cc, s.method, s.opts...)
		if s.err == nil && s.cs == nil {
			s.err = errNoStream
		}
		s.made.Store(true)
	}
	return s.cs, s.err
}

func (s *lateStream) SendMsg(m any) error {
	cs, err := s.stream(true, m)
	if err != nil {
		return err
	}
	return cs.SendMsg(m)
}

func (s *lateStream) RecvMsg(m any) error {
	cs, err := s.stream(false, nil)
	if err != nil {
		return err
	}
	return cs.RecvMsg(m)
}

func (s *lateStream) Header() (metadata.MD, error) {
	cs, err := s.stream(false, nil)
	if err != nil {
		return nil, err
	}
	return cs.Header()
}

func (s *lateStream) CloseSend() error {
	cs, err := s.stream(false, nil)
	if err != nil {
		return err
	}
	return cs.CloseSend()
}

// Trailer is nil until the stream exists: no trailer has come.
func (s *lateStream) Trailer() metadata.MD {
	if !s.made.Load() || s.cs == nil {
		return nil
	}
	return s.cs.Trailer()
}

// Context is the call's context until the stream exists, then the
// stream's.
func (s *lateStream) Context() context.Context {
	if !s.made.Load() || s.cs == nil {
		return s.ctx
	}
	return s.cs.Context()
}
