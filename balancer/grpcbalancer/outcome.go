package grpcbalancer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/shed"
	ctxwindow "github.com/inferlb/inferlb/internal/window"
)

var (
	// errNotSent marks a pick whose call never reached the endpoint (gRPC
	// found the transport gone and picked again, failed the call before
	// creating its stream, or the picker gave the pick back). It wraps
	// context.Canceled so the core counts it as neither success nor
	// failure.
	errNotSent = fmt.Errorf("inferlb: call not sent: %w", context.Canceled)
	// errUnknownModel is an answer that the endpoint does not serve the
	// call's model (see invoke.notServed). The call's report turns it into
	// Outcome.NotServedModel when the call names its model; otherwise it
	// counts as neither success nor failure, since it wraps
	// context.Canceled: the endpoint is healthy, only without that model.
	errUnknownModel = fmt.Errorf("inferlb: the endpoint does not serve the call's model: %w", context.Canceled)
	// errDeadlineMidStream is a deadline that ended a stream after its
	// first token (StreamTiming saw it): the endpoint was generating, and a
	// long answer outlasting the caller's time budget says nothing about
	// its health. Counted as failures, long generations under a tight
	// deadline would trip healthy endpoints' breakers. It wraps
	// context.Canceled so the core counts it as neither; a deadline before
	// the first token stays a failure.
	errDeadlineMidStream = fmt.Errorf("inferlb: the deadline ended the stream after its first token: %w", context.Canceled)
	// errNoAnswer is an attempt that gRPC ended without error although the
	// server sent nothing back. An answer, even an error, carries a
	// status, so this is no success: gRPC finishes an attempt so when
	// sending found its stream already reset (a refused stream, or one a
	// GOAWAY dropped, in a race with the reset) and then retries the
	// call. It counts as an overload answer without a hint, as a refused
	// stream does, but as no refusal (inferlb.Outcome.Drained; see
	// outcome).
	errNoAnswer = errors.New("inferlb: the attempt ended with no answer from the server")
	// errCanceled is the client's own cancellation (codes.Canceled).
	errCanceled = fmt.Errorf("inferlb: call canceled by the client: %w", context.Canceled)
	// errTooLargeToSend is a request over the client's send limit: it
	// never left, so it counts as neither (see outcome).
	errTooLargeToSend = fmt.Errorf("inferlb: request over the send size limit: %w", context.Canceled)
	// errNotEncoded is a request the client could not marshal or compress
	// (msgNotEncoded): it never left either, and counts as neither.
	errNotEncoded = fmt.Errorf("inferlb: the client could not encode the request: %w", context.Canceled)
	// errNotDecoded is an answer the client could not unmarshal
	// (msgNotDecoded): the endpoint answered, in a schema the client does
	// not read, which says nothing of its health; it counts as neither.
	errNotDecoded = fmt.Errorf("inferlb: the client could not unmarshal the answer: %w", context.Canceled)
)

// The messages grpc-go gives an attempt the server did not process (its
// transport marks the stream "unprocessed" and retries the call
// transparently, but DoneInfo does not say so). Pinned by
// TestE2EUnprocessedStreams, which runs both against a real client.
const (
	msgGoAway  = "the connection is draining"
	msgRefused = "RST_STREAM with error code: REFUSED_STREAM"
)

// msgHTTP429 starts the UNAVAILABLE grpc-go makes of an HTTP 429 answer
// that is not gRPC (a rate-limiting proxy in front of the server). Pinned
// by TestE2EHTTP429FromAProxyIsAnOverload.
const msgHTTP429 = "unexpected HTTP status code received from server: 429 "

// msgTooLarge is in each RESOURCE_EXHAUSTED grpc-go gives a message over a
// size limit: "grpc: received message larger than max (...)" (the
// client's MaxCallRecvMsgSize on an answer, or the server's
// MaxRecvMsgSize on a request), "trying to send message larger than max
// (...)", and the decompression variants. Pinned by
// TestE2EMessageOverASizeLimitIsNoOverload.
const msgTooLarge = "larger than max"

// msgNotEncoded starts each INTERNAL grpc-go gives a request the client
// could not encode, after the pick, with the stream open: "grpc: error
// while marshaling: ..." (a proto3 string that is not UTF-8, say) and
// "grpc: error while compressing: ...". Pinned by
// TestE2ERequestTheClientCannotEncodeIsNoFailure.
var msgNotEncoded = [...]string{"grpc: error while marshaling: ", "grpc: error while compressing: "}

// msgNotDecoded starts the INTERNAL grpc-go gives an answer the client
// could not unmarshal: "grpc: failed to unmarshal the received message:
// ...". Pinned by TestE2EAnswerTheClientCannotDecodeIsNoFailure.
const msgNotDecoded = "grpc: failed to unmarshal the received message"

// outcome turns how gRPC says a call ended into how the core should count it.
//
// The classification follows the HTTP status Envoy maps each code to
// (grpc-status to HTTP, as in its outlier detection): codes that map to 5xx
// are failures of the endpoint (Unknown, DeadlineExceeded, Unimplemented,
// Internal, Unavailable, DataLoss); ResourceExhausted (429) is an overload
// answer that cools the endpoint down for the trailer's pushback; Canceled
// (499) is the client's doing and counts as neither; the codes that map
// to 4xx (InvalidArgument, FailedPrecondition and OutOfRange, 400;
// Unauthenticated, 401; PermissionDenied, 403; NotFound, 404;
// AlreadyExists and Aborted, 409) describe the request, not the endpoint,
// which answered without doing the call's work: client errors
// (inferlb.Outcome.ClientError), neither success nor failure and no
// latency. Counted as successes, a replica that refuses every call at once
// (a wrong API key: UNAUTHENTICATED or PERMISSION_DENIED) looked the
// fastest and least loaded, and drew nearly every call. (A server that
// does not register the call's service answers UNIMPLEMENTED, and a
// proxy's HTTP 404 reaches the client as UNIMPLEMENTED too: a failure,
// as it was before client errors were told apart.) OK is a success. The
// pushback is the trailer's, else a google.rpc.RetryInfo's in the status
// details (pushback), which also makes an UNAVAILABLE an overload answer
// as a trailer's pushback does. An HTTP
// 429 from a proxy that does not speak gRPC, which gRPC maps to
// UNAVAILABLE, is an overload answer without a hint, as 429 is to the
// HTTP transport (the answer carries no trailer to read one from); an
// UNAVAILABLE whose trailer carries a pushback (hasPushback) is an
// overload answer for that pushback, as a 503 with Retry-After is to the
// HTTP transport: the server answered, and asked for a pause; so is
// the UNAVAILABLE with which a server sheds load (package internal/shed:
// Triton's queue full, or a request that waited in it past its timeout,
// and SGLang's and Ollama's texts; found anywhere in the message, as an
// ensemble, TensorRT-LLM's for one, puts where it failed before it),
// which would otherwise trip a busy server's breaker
// (TestE2ETritonQueueRejectionIsAnOverload).
//
// A ResourceExhausted that is a message over a size limit (msgTooLarge)
// is no overload either: the message is too large for any endpoint, and
// cooling the endpoint down for it would, with a few such calls, leave
// nothing to route to. When something came back (the server refused the
// request by its limit, or the client refused the answer by its own) the
// endpoint answered: a success, as before client errors were told apart
// (one limit refuses alike on every endpoint). Otherwise the
// request never left the client (over its send limit): neither.
//
// (A DEADLINE_EXCEEDED after a stream's first token becomes
// errDeadlineMidStream when the stream's timing is added: streamState.fill.)
//
// An attempt the server did not process is an overload answer without a
// hint: the endpoint cools down for the default time
// (balancer.Options.DefaultCooldown), and neither its breaker nor its error rate counts it. HTTP/2 guarantees
// such a stream had no effect, and gRPC retries the call transparently:
// a stream refused with RST_STREAM REFUSED_STREAM (a server at its stream
// limit or shedding load), or dropped by a GOAWAY that closes the
// connection gracefully (MaxConnectionAge, a rolling restart, a sidecar
// draining, which greets every new connection with a GOAWAY). Both reach
// Done as UNAVAILABLE with no byte received, like a crash; counted as
// failures, every connection rotation would add to the endpoint's error
// rate and a drain would trip its breaker. Counted as nothing, a draining
// endpoint would look idle and take the transparent retry too, which then
// fails the call. When the reset races with sending the request, gRPC
// ends the attempt with no error at all although nothing came back
// (errNoAnswer): that counts the same way, not as a success. A refused
// stream is the server's refusal, and counts towards the core's row of
// overload answers, which puts an endpoint that keeps refusing on
// probation (balancer.Options.DefaultCooldown); a GOAWAY's stream is no
// refusal (inferlb.Outcome.Drained): the connection closed, and a replica
// restarted behind a draining listener came back on probation, taking
// none of the first 30 calls after it was back
// (TestE2EDrainedReplicaTakesCallsWhenBack). Nor is errNoAnswer, which
// either can end in (2 of 200 attempts in each of
// TestE2EUnprocessedStreams' two cases, over 20 runs with -race): nothing
// came back to read a refusal in.
//
// A limit of grpc-go (v1.85): when the server ends the stream with an
// error before the client has written its request message (a proxy's
// HTTP 429 or 503 sent on the headers alone, a server failing the call at
// once), the client's write fails, and grpc-go finishes the attempt with
// that write's io.EOF, which it reads as success: Done gets no error and
// BytesReceived, and the call counts as a success, though the caller gets
// the server's error (see grpc-go's clientStream.retryLocked, and its
// pull request 2604 on io.EOF reaching the balancer). Nothing in DoneInfo
// tells the two apart. It takes a rejection faster than the client's own
// write: rare with small requests (the HTTP 429 test, answered before it
// read the request, flaked under load), common with requests larger than
// HTTP/2's initial flow-control window (64 KiB, a long prompt) that the server
// rejects before reading them, as a grpc-go server's tap.ServerInHandle
// (where rate limiters sit) does: of 20 such 1 MiB calls rejected
// RESOURCE_EXHAUSTED, 3 to 8 counted as successes and the rest as
// overloads (10-byte calls: 20 overloads), on loopback
// (benchmarks/experiments/grpc-early-rejection.patch). Only an
// interceptor sees the call's error: through UnaryOutcome or UnaryRetry,
// a unary call's attempt that ends without error but with an answer (one
// with none is errNoAnswer, above) is reported once the call returns,
// with the call's error (retryState.hold): 20 overloads of 20
// (TestEarlyRejectionIsAnOverloadThroughTheInterceptor). Streams fail the
// same way: of 20 such 1 MiB streams, 0 to 11 server streams and 0 to 10
// bidirectional ones counted as successes in 20 runs
// (TestEarlyRejectedStreamWithoutStreamTiming logs them). Through
// StreamTiming, a stream's attempt that grpc-go ends without error while
// the application sends its request (no success: on OK grpc-go leaves
// the attempt to RecvMsg) is reported once gRPC reads the stream's end
// (in the application's RecvMsg or Header), with the status it finishes
// the stream with (grpc.OnFinish), and as neither if the application
// leaves the stream before that (streamState.hold): 20 overloads of 20
// (TestEarlyRejectedStreamIsAnOverloadThroughStreamTiming, and
// TestEarlyRejectedStreamReadByHeaderAloneIsAnOverload for streams whose
// application reads only Header and leaves).
// Client-streaming calls are corrected the same way (TestEarlyRejectedStream*
// run them too); streams without StreamTiming are not corrected.
//
// A request the client could not encode (msgNotEncoded) never left it
// either: INTERNAL, but the request's doing, so it counts as nothing.
// Counted as failures, a client sending such requests tripped the breaker
// of every endpoint they went to.
//
// An answer the client could not unmarshal (msgNotDecoded) came from an
// endpoint that answered, in a schema the client does not read: a client
// built from another version of the .proto than its servers, which is
// the fleet's mismatch far more often than one endpoint's. It counts as
// nothing: as a failure, a client out of step tripped every endpoint's
// breaker in turn, and the channel's other methods lost them too; as a
// success, an endpoint whose answers no one can read would be credited.
// (An answer the client failed to decompress stays a failure: the bytes
// the endpoint sent were broken.)
//
// A call without a stream (BytesSent false) never reached the endpoint,
// whatever its error: gRPC failed it on the client, before the stream
// existed (per-RPC credentials that could not get a token, a connection
// that was closing). It counts as nothing, or a local outage would trip
// every endpoint's breaker, or pass for instant answers.
// serverFailure reports whether di is a failure the server sent as its
// answer, with the codes a server returns when the call's work failed
// (INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED) after some of its answer
// arrived: one that may be the model's alone on a server that serves
// others (inferlb.Outcome.Model). UNAVAILABLE and DEADLINE_EXCEEDED are
// not: grpc-go reports a broken connection and a deadline with them.
func serverFailure(di balancer.DoneInfo) bool {
	if di.Err == nil || !di.BytesReceived {
		return false
	}
	switch status.Code(di.Err) {
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		return true
	}
	return false
}

// isCancel reports whether err, an attempt's end, is a cancellation: the
// context's, or gRPC's CANCELLED (the caller's, or a CANCEL reset, which
// call.report tells apart by the call's context). This package's own
// reports of attempts gRPC ended without error (errStreamLeft,
// errStreamHidden, errRetriedAttempt: held, see heldReport) wrap
// context.Canceled to count as neither, and are none: the server ended
// those attempts, or gRPC retried them, whatever the application did
// after.
func isCancel(err error) bool {
	switch err {
	case errStreamLeft, errStreamHidden, errRetriedAttempt:
		return false
	}
	return errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled
}

func outcome(di balancer.DoneInfo) inferlb.Outcome {
	return outcomeOf(di, true)
}

// outcomeOf is outcome, reading di's status for a refusal as too long
// (tooLong) only with windows: without, such a refusal is the answer its
// code makes it (see call.believed).
func outcomeOf(di balancer.DoneInfo, windows bool) inferlb.Outcome {
	if !di.BytesSent {
		return inferlb.Outcome{Err: errNotSent}
	}
	if di.Err == nil {
		if !di.BytesReceived {
			// A GOAWAY or a refused stream, which is not known: no
			// refusal (see outcome).
			return inferlb.Outcome{Err: errNoAnswer, Overloaded: true, Drained: true}
		}
		return inferlb.Outcome{}
	}
	if errors.Is(di.Err, context.Canceled) {
		return inferlb.Outcome{Err: di.Err, Unanswered: !di.BytesReceived}
	}
	if w, prompt := tooLong(di); w > 0 && windows {
		return inferlb.Outcome{ContextWindow: w, PromptWindow: prompt}
	}
	switch status.Code(di.Err) {
	case codes.Canceled:
		return inferlb.Outcome{Err: errCanceled, Unanswered: !di.BytesReceived}
	case codes.ResourceExhausted:
		if st, ok := status.FromError(di.Err); ok && strings.Contains(st.Message(), msgTooLarge) {
			if !di.BytesReceived {
				return inferlb.Outcome{Err: errTooLargeToSend}
			}
			return inferlb.Outcome{} // answered: the message is too large anywhere
		}
		return inferlb.Outcome{Err: di.Err, Overloaded: true, RetryAfter: pushback(di)}
	case codes.NotFound:
		if notServed(di) {
			return inferlb.Outcome{Err: errUnknownModel}
		}
		return inferlb.Outcome{ClientError: true}
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated,
		codes.PermissionDenied, codes.AlreadyExists, codes.Aborted:
		return inferlb.Outcome{ClientError: true}
	case codes.Unavailable:
		if notServed(di) {
			return inferlb.Outcome{Err: errUnknownModel}
		}
		if st, ok := status.FromError(di.Err); ok {
			msg := st.Message()
			if !di.BytesReceived && msg == msgGoAway {
				// Not processed as the connection closed: no refusal.
				return inferlb.Outcome{Err: di.Err, Overloaded: true, Drained: true}
			}
			if !di.BytesReceived && strings.Contains(msg, msgRefused) {
				return inferlb.Outcome{Err: di.Err, Overloaded: true}
			}
			if di.BytesReceived && (strings.HasPrefix(msg, msgHTTP429) || shed.In(msg)) {
				// A pushback in the trailer says for how long (none
				// from a proxy's 429: it sent no gRPC trailer).
				return inferlb.Outcome{Err: di.Err, Overloaded: true, RetryAfter: pushback(di)}
			}
		}
		if di.BytesReceived && (hasPushback(di.Trailer) || hasRetryInfo(di.Err)) {
			return inferlb.Outcome{Err: di.Err, Overloaded: true, RetryAfter: pushback(di)}
		}
		return inferlb.Outcome{Err: di.Err}
	case codes.Internal:
		st, ok := status.FromError(di.Err)
		switch {
		case !ok:
		case !di.BytesReceived:
			for _, m := range msgNotEncoded {
				if strings.HasPrefix(st.Message(), m) {
					return inferlb.Outcome{Err: errNotEncoded}
				}
			}
		case strings.HasPrefix(st.Message(), msgNotDecoded):
			return inferlb.Outcome{Err: errNotDecoded}
		}
		return inferlb.Outcome{Err: di.Err}
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.DataLoss:
		return inferlb.Outcome{Err: di.Err}
	}
	return inferlb.Outcome{}
}

// msgUnknownModel is how Triton says it does not serve a call's model
// (a model not loaded there, in explicit model control, or not in its
// repository): "Request for unknown model: 'x' is not found" (NOT_FOUND
// in recent releases), "... has no available versions" (a model still
// loading or unloaded), "Inference request for unknown model 'x'"
// (UNAVAILABLE in older ones). Counted as a failure (UNAVAILABLE), such
// answers tripped the breaker of a server that serves its own models
// well; as a success (NOT_FOUND), they made it look like the fastest.
const msgUnknownModel = "request for unknown model"

// notServed reports whether di's error, a NOT_FOUND or UNAVAILABLE status
// the endpoint sent, says it does not serve the call's model.
func notServed(di balancer.DoneInfo) bool {
	st, ok := status.FromError(di.Err)
	return ok && di.BytesReceived && unknownModel(st.Message())
}

// unknownModel reports whether msg says the server does not serve the
// call's model (msgUnknownModel, in any case: "Inference request for ..."
// and "Request for ...").
func unknownModel(msg string) bool {
	for i := 0; i+len(msgUnknownModel) <= len(msg); i++ {
		if strings.EqualFold(msg[i:i+len(msgUnknownModel)], msgUnknownModel) {
			return true
		}
	}
	return false
}

// hasPushback reports whether the trailer carries the server's pushback
// (grpc-retry-pushback-ms, or an HTTP-style retry-after), whatever its
// value: an UNAVAILABLE with one is the server throttling the client, as
// gRFC A6 has servers do (UNAVAILABLE is the code retry policies retry),
// not a server that broke, as an HTTP 503 with Retry-After is "busy, come
// back later" to the HTTP transport. An unreadable or negative pushback
// ("do not retry") is still the server's own answer: an overload without
// a hint.
func hasPushback(md metadata.MD) bool {
	return len(md["grpc-retry-pushback-ms"]) > 0 || len(md["retry-after"]) > 0
}

// retryAfter reads the server's pushback from the trailer: gRPC's
// grpc-retry-pushback-ms (gRFC A6, milliseconds; negative means "do not
// retry", which for routing is just "no hint"), else an HTTP-style
// retry-after in seconds. 0 means no hint. A hint longer than a Duration
// holds saturates: the core caps it at MaxCooldown, and wrapped it would
// read as a short pause or as no hint at all.
func retryAfter(md metadata.MD) time.Duration {
	// Out of range, Parse* return the nearest value with ErrRange:
	// saturated, as wanted.
	if v := md["grpc-retry-pushback-ms"]; len(v) > 0 {
		s := strings.TrimSpace(v[0])
		if ms, err := strconv.ParseInt(s, 10, 64); (err == nil || errors.Is(err, strconv.ErrRange) && wholeNumber(s)) && ms > 0 {
			if ms > math.MaxInt64/int64(time.Millisecond) {
				return math.MaxInt64
			}
			return time.Duration(ms) * time.Millisecond
		}
	}
	if v := md["retry-after"]; len(v) > 0 {
		if s, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64); (err == nil || errors.Is(err, strconv.ErrRange)) && s > 0 {
			if s >= math.MaxInt64/float64(time.Second) {
				return math.MaxInt64
			}
			return time.Duration(s * float64(time.Second))
		}
	}
	return 0
}

// pushback is the pause the server asked for with di's answer: the
// trailer's (retryAfter), else the google.rpc.RetryInfo of the status
// (retryInfoDelay). 0 means no hint.
func pushback(di balancer.DoneInfo) time.Duration {
	if d := retryAfter(di.Trailer); d > 0 {
		return d
	}
	return retryInfoDelay(di.Err)
}

// retryInfo returns the google.rpc.RetryInfo among err's status details,
// or nil. Servers that follow Google's API design (AIP-194) say how long
// a client should wait with one, on RESOURCE_EXHAUSTED and UNAVAILABLE;
// it travels in grpc-status-details-bin, which grpc-go keeps out of the
// trailer and puts in the status. Only called for an answer that may be
// an overload: reading the details unmarshals them.
func retryInfo(err error) *errdetails.RetryInfo {
	st, ok := status.FromError(err)
	if !ok || len(st.Proto().GetDetails()) == 0 {
		return nil
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}

// hasRetryInfo reports whether err's status carries a google.rpc.RetryInfo,
// whatever its delay: as a pushback in the trailer (hasPushback), the
// server asking for a pause.
func hasRetryInfo(err error) bool { return retryInfo(err) != nil }

// retryInfoDelay reads the retry delay of err's google.rpc.RetryInfo; 0
// when there is none, or it is not positive or not a valid Duration. One
// longer than a Duration holds saturates (the core caps it at
// MaxCooldown).
func retryInfoDelay(err error) time.Duration {
	d := retryInfo(err).GetRetryDelay()
	if d == nil || d.CheckValid() != nil {
		return 0
	}
	return max(d.AsDuration(), 0)
}

// wholeNumber reports whether s is a sign and digits and nothing else.
// ParseInt reports a number past int64 as out of range as soon as its
// digits overflow, before it reads on: "99999999999999999999x" is
// unreadable, not a very long pushback.
func wholeNumber(s string) bool {
	rest := strings.TrimRight(s, "0123456789")
	return len(rest) < len(s) && (rest == "" || rest == "+" || rest == "-")
}

// maxRefusalText bounds how much of a status message tooLong reads: the
// texts it looks for come first, and the message is the server's.
const maxRefusalText = 2048

// tooLong reads di's error, a status the endpoint sent, for a refusal of
// the call as longer than the endpoint's context window for its model
// (the texts of package internal/window: vLLM's, SGLang's, TGI's,
// TensorRT-LLM's, which servers behind gRPC, Triton's backends among
// them, send as INVALID_ARGUMENT or, from a backend that does not map its
// errors, INTERNAL or UNKNOWN). It returns the window, or 0.
//
// Such an answer is no failure of the endpoint (counted as one, with
// INTERNAL, it would trip a healthy server's breaker) and no success
// either (a call refused at once would make the server look fast): the
// call's report gives it as inferlb.Outcome.ContextWindow, and the
// Balancer passes the endpoint over for the model's calls that do not
// fit (their inferlb.Request's token counts). UnaryRetry sends the call
// on to another endpoint that might take it.
func tooLong(di balancer.DoneInfo) (window int, prompt bool) {
	if di.Err == nil || !di.BytesReceived {
		return 0, false
	}
	st, ok := status.FromError(di.Err)
	if !ok {
		return 0, false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition, codes.Internal, codes.Unknown:
	default:
		return 0, false
	}
	return refusalWindow(st.Message())
}

// refusalWindow reads msg, an error text of the endpoint's, for a refusal
// of the call as longer than its context window (see tooLong), and
// returns the window, or 0, and whether it bounds the prompt alone
// (inferlb.Outcome.PromptWindow).
func refusalWindow(msg string) (window int, prompt bool) {
	w, _, _, p := ctxwindow.Refusal(refusalText(msg))
	return w, p
}

// refusalText is the part of msg, a status message, that tooLong reads:
// at most maxRefusalText bytes, less the digits the cut ends in, which
// may be the start of a longer number ("4096" cut to "40": a window
// remembered a hundred times too small).
func refusalText(msg string) []byte {
	if len(msg) > maxRefusalText {
		msg = strings.TrimRight(msg[:maxRefusalText], "0123456789")
	}
	return []byte(msg)
}

// maxCarriedCheck bounds the request message carriesRefusal marshals and
// reads: a longer one is not believed to be refused for its length.
const maxCarriedCheck = 32 << 20

// carriesRefusal reports whether req, a call's request message, holds
// text that reads as a refusal as too long (ctxwindow.Carried), or may (it
// is no proto.Message nor []byte, cannot be marshalled, or is longer than
// maxCarriedCheck). Servers copy a request's text into their
// INVALID_ARGUMENT: Triton's "unexpected inference input '<name>'" and the
// "[request id: <id>]" it puts before its errors, whatever the call sent
// as an input's name or the request's id. A call could otherwise have any
// window it likes remembered for the endpoints that copy it. A message's
// wire bytes hold its strings as they are. It runs only on a refusal.
func carriesRefusal(req any) bool {
	var b []byte
	switch m := req.(type) {
	case nil:
		return false // no message: nothing a server could copy
	case proto.Message:
		if proto.Size(m) > maxCarriedCheck {
			return true
		}
		var err error
		if b, err = proto.Marshal(m); err != nil {
			return true
		}
	case []byte:
		b = m
	default:
		return true
	}
	carried, whole := ctxwindow.Carried(bytes.NewReader(b), maxCarriedCheck)
	return carried || !whole
}
