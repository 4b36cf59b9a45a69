package grpcbalancer

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	ctxwindow "github.com/inferlb/inferlb/internal/window"
)

// retryState links one call's attempts to the picker: what holds for the
// call as a whole, whichever attempt learned it. Each run of the invoker
// has its own invoke, which records what its attempts did (see invoke).
// The attempts are the interceptor's and, within each of them, gRPC's own
// (transparent retries, and a retryPolicy's): the picker sees them all.
//
// Concurrency: attempts may overlap (gRPC hedging), so every field is atomic.
type retryState struct {
	method string // the call's, as gRPC names it to the picker (invokeFrom)
	// ctx is the call's context as the interceptor got it: whether the
	// call's caller cancelled it, rather than an interceptor inside ours
	// one attempt (see park).
	ctx context.Context
	// req is the call's request message, which a refusal as too long is
	// checked against (see carriesRefusal). reqMu guards it, reply and
	// returned, set when the interceptor returns: the application owns
	// the messages again then, and an attempt that ends later (one an
	// inner interceptor left running) must not read them while they
	// change.
	reqMu    sync.Mutex
	req      any
	returned bool
	// refusal holds the call's refusals as too long (the last first):
	// its token counts are the request's, whichever attempt was refused,
	// and every later attempt's pick carries them (fit).
	refusal atomic.Pointer[refusal]
	sent    atomic.Int32           // attempts that reached an endpoint, in every invoke
	exclude atomic.Pointer[string] // endpoint the last failed attempt failed on

	// reply is the call's reply message, which gRPC decodes a response
	// message into (guarded by reqMu, released with req). See unanswered.
	reply any

	// first is the call's first invoke: UnaryOutcome's only one, and
	// UnaryRetry's first (each retry has one of its own). An invoke's
	// attempts are held and parked in it, never in another invoke's.
	first invoke
}

// invoke is one run of the interceptor's invoker (UnaryRetry runs it once
// per retry): the attempts picked while it runs, what they did, and the
// reports held or parked for it. An attempt belongs to the invoke it was
// picked in (call.inv), and is held and parked only there: its slots
// close as the invoker returns (invokeSettled), so an attempt that an
// interceptor inside ours left running, ending after that, is reported
// at once, as grpc-go ended it, and not settled against the next invoke
// (its error, its reply, its attempts):
// TestLeftOverAttemptSettlesAgainstItsOwnInvoke. So does a left-over
// attempt's retry by gRPC (transparent, or a retry policy's): UnaryRetry's
// contexts carry their invoke (invokeFrom). Taken for the invoke under
// way, its pick made that invoke's attempt a hedge's sibling, and settled
// its held attempt as retried
// (TestLeftOverAttemptRetriedByGRPCPicksInItsOwnInvoke).
//
// What UnaryRetry decides after an invoke (retry or not, and how) rests
// on that invoke's attempts alone: a left-over attempt of an earlier one
// that got bytes back, or was refused as too long or as not serving the
// model, while a later invoke ran did not make the later invoke's
// failure an answer begun, or a refusal to return
// (TestLeftOverAttemptDoesNotDecideTheNextInvokesRetry). What it learned
// of the endpoints stays the call's: where it failed (exclude), and a
// refusal's token counts (refusal).
//
// Concurrency: st is immutable; every other field is atomic; a closed
// slot stays closed.
type invoke struct {
	st *retryState // the call's
	// An attempt that ended without error, held until the invoke's
	// error is known (see hold).
	held heldReport
	// parked holds the report of an attempt whose reading needs the
	// reply, until the invoker returns (see park).
	parked heldReport
	// attempts counts the attempts picked in the invoke (high 32 bits)
	// and those of them that have not ended (low 32 bits: picked, Done
	// not yet called), in one word so that each pick and each end see
	// the other in one order: see picked and ended.
	attempts atomic.Uint64

	// core is the Balancer that routed the invoke's last attempt: a
	// retry spends that Balancer's budget.
	core atomic.Pointer[core.Balancer]
	// received: a response byte of an attempt of the invoke arrived.
	received atomic.Bool
	// sent counts the invoke's attempts that reached an endpoint.
	sent atomic.Int32
	// notServed: an attempt's endpoint answered that it does not serve
	// the call's model (errUnknownModel).
	notServed atomic.Bool
	// tooLong: an attempt's endpoint refused the call as longer than its
	// context window for the call's model (see retryState.refusal).
	tooLong atomic.Bool
	// windowRetry: the invoke is the retry of a refusal as too long, or
	// of an answer that the endpoint does not serve the call's model;
	// its first pick is Membership.PickRetry (see Pick), or, with hop
	// (the answer was not-served), Membership.PickNotServedRetry, which
	// leaves failover a reserve of the retry budget. Set before the
	// invoke runs, and spent by that pick.
	windowRetry atomic.Bool
	hop         atomic.Bool
}

// picked records a pick in inv and returns its number in the invoke
// (from 1) and whether another of the invoke's attempts was in flight
// then.
func (inv *invoke) picked() (seq uint32, overlap bool) {
	n := inv.attempts.Add(1<<32 | 1)
	return uint32(n >> 32), uint32(n) > 1
}

// ended records the end of the invoke's attempt number seq, and reports
// whether another attempt was picked while it was in flight.
func (inv *invoke) ended(seq uint32) bool {
	return uint32(inv.attempts.Add(^uint64(0))>>32) != seq
}

// pickedSince reports whether the invoke picked an attempt after its
// attempt number seq.
func (inv *invoke) pickedSince(seq uint32) bool {
	return uint32(inv.attempts.Load()>>32) != seq
}

// unanswered reports whether a unary call whose server sent its headers
// had no response message when its caller cancelled it: its reply
// message is still its type's zero value (a non-nil pointer to it, as
// generated clients pass). grpc-go counts the headers as bytes received,
// and a server may send them before it has an answer, also when its
// engine hangs: such a generation call that its caller gave up on looked
// answered, and fed no signal
// (TestE2EHungUnaryCancelledAfterHeadersIsUnanswered).
//
// It is read on the interceptor's goroutine once the invoker has
// returned (see park), never in the attempt's Done: an interceptor
// chained inside ours owns the reply until then, and may fill it on
// another goroutine than the attempt's (a hedge that decodes each
// attempt into a reply of its own and copies the winner's), where a read
// in Done raced with the copy, and read an answered call's loser as
// given up on with nothing back
// (TestInnerHedgeReplyIsReadAfterTheInvokerReturns). Without an
// interceptor inside, grpc-go's unary call decodes a response message
// into the reply before it waits for the status, and the invoker returns
// right after the attempt ends, so a cancel after the message never
// reads as none; a message that arrives as the caller cancels may count
// as none. A message decoded changes the reply even when it is empty,
// with the proto codec gRPC registers and generated messages: decoding
// records the message's type in its internal state
// (TestUnansweredReadsTheReply pins that). A codec or message type that
// leaves an empty message's reply at the zero value (encoding/json on
// "{}") makes that message read as none, and so does an interceptor
// inside that decodes into a reply of its own and leaves the call's
// empty when the caller cancels. A reply the application passed not
// empty (reused; or a generated message that anything reflective touched
// before the call, its Reset, proto.Size or String, each of which
// records its type as decoding does), or not as a pointer, tells
// nothing: the call counts as answered, as it did before this reading;
// so does an attempt that ends after the interceptor returned (an
// interceptor inside ours left it running), whose reply is the
// application's again. The reply is read only for the rare report that
// needs it: a call pays nothing for it.
func (st *retryState) unanswered() bool {
	st.reqMu.Lock()
	defer st.reqMu.Unlock()
	return !st.returned && zeroReply(st.reply)
}

// park holds the report of c's attempt, which ended with di (a
// generation call's, cancelled after its server's headers: whether it is
// Unanswered rests on the reply, see unanswered), until the invoker that
// made it returns (unpark). A parked attempt stays in flight on its
// endpoint, its request and tokens counted, until then: the core has no
// way to release its load before its outcome.
//
// It parks when the call's caller cancelled the call (its context,
// st.ctx, is cancelled: a cancel of the caller's reaches the attempt's
// context through it, so it is cancelled first), and when an interceptor
// inside ours cancelled an attempt while the caller still waits and no
// other attempt of the invoke was in flight at any time during it (a
// per-attempt timeout built on context.WithCancel and a timer: it
// returns the attempt's CANCELLED, or tries again, see another).
// Otherwise it reports false: an attempt that an interceptor inside ours
// cancelled while it overlapped another attempt of the invoke (picked
// while that one was in flight, or in flight as that one was picked: a
// hedge's loser, cancelled as the hedge commits to another attempt whose
// answer may take minutes) is no wait anyone gave up on. Such an attempt
// is reported at once, as answered (cancelled), as grpc-go ended it:
// parked, it held its endpoint's load for the rest of the call, and, when
// the call then came back empty (the attempt the hedge kept hung, and the
// caller gave up on it), it took the reading of Unanswered that belonged
// to the attempt the caller gave up on
// (TestInnerHedgeLoserLeavesNoLoadWhileTheCallGoesOn). Parking only
// the caller's cancels, an inner per-attempt timeout's cancel of a hung
// attempt after its headers read as answered, and the hung replica
// behind it drew its calls on
// (TestE2EHungUnaryBehindAnInnerPerAttemptCancelIsUnanswered).
//
// Attempts one after another do not overlap: gRPC's own retries
// (transparent ones, of a stream the server did not process, and a
// retry policy's) end the attempt before they pick the next (grpc-go's
// clientStream.retryLocked), and so does an interceptor inside ours that
// waits for each attempt before it tries again. An attempt timed out
// after such a retry is the invoke's only one in flight, and is read as
// such: when any second pick counted as a hedge's, the hung attempt
// after a refused stream or a GOAWAY, or the interceptor's own retry
// timed out in turn, read as answered, and its hung replica went
// unmarked (TestE2EHungUnaryAfterATransparentRetryIsUnanswered, and
// TestInnerCancelOfAnAttemptAfterItsHeaders).
//
// It also reports false when the attempt's invoke has returned (an
// interceptor inside ours left the attempt running; see invoke) or
// another attempt is parked (an inner hedge's, both cancelled by the
// caller): that one is reported now, as answered.
func (st *retryState) park(c *call, di balancer.DoneInfo) bool {
	if st.ctx == nil || c.inv == nil {
		return false
	}
	caller := st.ctx.Err() == context.Canceled
	if !caller && c.overlap {
		return false
	}
	if f := parkRace.Load(); f != nil {
		(*f)(st)
	}
	if !c.inv.parked.hold(c, di) {
		return false
	}
	if !caller && c.inv.pickedSince(c.seq) && c.inv.parked.c.CompareAndSwap(c, nil) {
		// The next attempt was picked after this one ended (it
		// overlapped none), and its pick (another) may have looked for
		// a parked one before c was held: an interceptor inside ours
		// that started the next attempt without waiting for this one's
		// report. Reported now, as another reports it, not held for
		// the rest of the call.
		c.noReply = true
		return false
	}
	return true
}

// parkRace, for tests only, runs in park between its look at the
// attempt's overlap and the hold: where a pick of the invoke's next
// attempt can come. One load on the cancel path alone.
var parkRace atomic.Pointer[func(*retryState)]

// another runs as inv, an invoke of st, picks an attempt after another
// one: a hedge's, an interceptor inside ours trying again, or gRPC's own
// retry. Only calls with more than one attempt come here. An attempt
// parked meanwhile was cancelled by an interceptor inside ours alone (a
// caller's cancel makes no attempt after it) and overlapped no other,
// and that interceptor went on to another attempt: it gave the parked
// one up with nothing back that it could use (a per-attempt timeout,
// then a retry), and it is reported so now, Unanswered, freeing its
// endpoint rather than holding it until the invoker returns; its reply
// is the next attempt's to fill, and tells nothing of it. A server that
// sent the answer's message and then held its status back would read as
// none here, as a message that arrives as the caller cancels may (see
// unanswered).
func (st *retryState) another(inv *invoke) {
	if inv.parked.c.Load() == nil || st.ctx != nil && st.ctx.Err() == context.Canceled {
		return
	}
	if c := inv.parked.c.Swap(nil); c != nil {
		c.noReply = true
		c.report(c.heldDI)
	}
}

// unpark reports inv's parked attempt, if any, reading the reply for it
// (unanswered); it runs on the interceptor's goroutine as inv's invoker
// returns, and inv parks nothing more.
func (st *retryState) unpark(inv *invoke) {
	inv.parked.closed.Store(true)
	if inv.parked.c.Load() == nil {
		return
	}
	c := inv.parked.c.Swap(nil)
	if c == nil {
		return
	}
	c.noReply = st.unanswered()
	c.report(c.heldDI)
}

// zeroReply reports whether reply is a non-nil pointer to its type's zero
// value. It allocates nothing.
func zeroReply(reply any) bool {
	v := reflect.ValueOf(reply)
	return v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().IsZero()
}

// hold keeps the report of an attempt that grpc-go ended without error
// until the interceptor sees the error the call returns (invokeSettled): grpc-go
// also ends an attempt so when the server failed the call before the
// client had written its request (see outcome), and only the call's error
// tells. Only an attempt with an answer is held (call.done): one that
// ended with none (errNoAnswer, a refused stream racing the write) is an
// overload at once, so that the transparent retry gRPC makes next finds
// its endpoint cooled down and excluded, as streamState.hold leaves it
// too. It reports false when another attempt is held already (hedging):
// that one is reported now, as before.
//
// It is held in the invoke it was picked in, and settled with that
// invoke's error: once that invoke has returned, it is reported at once.
func (st *retryState) hold(c *call, di balancer.DoneInfo) bool {
	return c.inv != nil && c.inv.held.hold(c, di)
}

// errRetriedAttempt is the error of a held attempt (see hold, and
// streamState.hold) that gRPC went on to retry: it failed, with an error
// that gRPC retries, transparently or by its retry policy (its code
// unknown here). It wraps context.Canceled, which the
// balancer reads as saying nothing about the endpoint: not a success, and
// not a failure it cannot name.
var errRetriedAttempt = fmt.Errorf("inferlb: the attempt ended without an error, and gRPC retried it: %w", context.Canceled)

// attemptDone records how an attempt of the call's invoke inv on endpoint
// id ended: a failure (or an overload answer) there is what the call's
// next attempt, whoever makes it, must avoid.
func (st *retryState) attemptDone(inv *invoke, id string, di balancer.DoneInfo, o *inferlb.Outcome) {
	if di.BytesReceived {
		inv.received.Store(true)
	}
	if di.BytesSent {
		st.sent.Add(1)
		inv.sent.Add(1)
		if o.Err == errUnknownModel {
			inv.notServed.Store(true) // retried, elsewhere (see UnaryRetry)
		} else if o.Err == nil || o.Canceled() {
			return // an answer, or the client's own cancellation
		}
	} else if di.Err == nil {
		return
	}
	// A failure there, or an attempt that never got a stream on it (its
	// transport broke): the next attempt goes elsewhere if it can.
	failed := id // moved to the heap here, on failures only
	st.exclude.Store(&failed)
}

// refusal is a refusal of the call as too long: the window and the
// server's counts of the call's tokens (ctxwindow.Refusal's results), and
// the status the server sent, which the caller gets when the call can go
// nowhere else. prev is the call's refusal before it, if any (one per
// attempt refused: bounded by the call's attempts).
type refusal struct {
	window, prompt, output int
	promptOnly             bool
	err                    error
	prev                   *refusal
}

// refusedTooLong records that the attempt of the call's invoke inv that
// ended with di was refused as longer than the endpoint's context window
// (see invoke.tooLong).
func (st *retryState) refusedTooLong(inv *invoke, di balancer.DoneInfo) {
	w, p, o, po := ctxwindow.Refusal(refusalText(status.Convert(di.Err).Message()))
	r := &refusal{window: w, prompt: p, output: o, promptOnly: po, err: di.Err}
	for { // hedged attempts may be refused at once
		r.prev = st.refusal.Load()
		if st.refusal.CompareAndSwap(r.prev, r) {
			break
		}
	}
	inv.tooLong.Store(true)
}

// fit returns req with the token counts of the call's refusals as too
// long (copied into c's scratch space), so that the pick passes over the
// endpoints the Balancer remembers too small for it; req itself when
// there was none. A call without a model (TEI's tei.v1 API names none)
// is fitted too: the Balancer remembers its windows under a key of its
// own. Every refusal's counts apply, in order, as the HTTP
// transport's do: a refusal that names the prompt alone (a limit on
// prompts) keeps the output an earlier one named, without which the
// retry would take the window of the endpoint that refused it for a fit.
func (st *retryState) fit(req *inferlb.Request, c *call) *inferlb.Request {
	r := st.refusal.Load()
	if r == nil {
		return req
	}
	if req != &c.req {
		c.req = *req
	}
	r.fit(&c.req)
	return &c.req
}

// fit applies r's counts, after those of the refusals before it, to req.
func (r *refusal) fit(req *inferlb.Request) {
	if r.prev != nil {
		r.prev.fit(req)
	}
	ctxwindow.Fit(req, r.window, r.prompt, r.output, r.promptOnly)
}

// errNoWindow fails a retry's pick when no endpoint left might take a
// call that one refused as longer than its context window, or answered
// that it does not serve the call's model: a status
// error, so that gRPC ends the attempt at once (a wait-for-ready call
// would otherwise wait out its deadline), and UnaryRetry then returns
// the refusal as it came.
var errNoWindow = statusError{codes.Unavailable, fmt.Errorf("%w: none whose context window might take the call and not remembered without its model, or no retry budget", core.ErrNoEndpoints)}

// excluded returns the endpoint ID a retry must avoid, or "".
func (st *retryState) excluded() string {
	if st == nil {
		return ""
	}
	if id := st.exclude.Load(); id != nil {
		return *id
	}
	return ""
}

type retryKey struct{}

// retryInUse spares picks the context lookup until an interceptor exists.
var retryInUse atomic.Bool

// retriedStates returns the call's retry and stream states (nil when it
// has none), and the invoke the pick is for (with the retry state), once
// it has settled their held attempts as retried: gRPC picks for a call
// again only to retry an attempt that failed (see retryState.hold and
// streamState.hold). Every picker the policy publishes calls it, so none
// leaves an attempt held.
func retriedStates(info balancer.PickInfo) (*retryState, *invoke, *streamState) {
	st, inv := invokeFrom(info.Ctx, info.FullMethodName)
	if st != nil { // settle is not inlined: no call without an interceptor
		inv.held.settle(errRetriedAttempt)
	}
	ss := streamStateFrom(info.Ctx, info.FullMethodName)
	if ss != nil {
		ss.settle(errRetriedAttempt)
	}
	return st, inv, ss
}

// invokeFrom returns the retry state of the call of method that ctx
// carries and the invoke ctx was made for, or nils. Another call made
// under the same context (by an interceptor further in, or per-RPC
// credentials that call a gRPC token service) has its own method, and
// must neither spend the call's retry state nor have its attempts held
// and reported as the call's. UnaryRetry's contexts carry their invoke
// (one per retry), so an attempt picks in the invoke it was made for,
// also when gRPC retries it after that invoke returned (an interceptor
// inside ours left it running); UnaryOutcome's carries its retryState,
// whose one invoke is first.
func invokeFrom(ctx context.Context, method string) (*retryState, *invoke) {
	if ctx == nil || !retryInUse.Load() {
		return nil, nil
	}
	var st *retryState
	var inv *invoke
	switch v := ctx.Value(retryKey{}).(type) {
	case *invoke:
		st, inv = v.st, v
	case *retryState:
		st = v
	}
	if st == nil || st.method != method {
		return nil, nil
	}
	if inv == nil {
		inv = &st.first
	}
	return st, inv
}

// UnaryRetry returns a unary client interceptor that fails a call over to
// another endpoint when it ended UNAVAILABLE before any response byte
// arrived (its connection died under it, as when a backend is killed), up
// to maxAttempts attempts in all (values below 2 mean 2). Each retry must
// fit the retry budget of the Balancer that routed the call
// (Balancer.AllowRetry: RetryRatio of the traffic plus RetryFloor per
// second, shared with every other adapter on that Balancer), so retries
// cannot storm a degraded fleet. The retry avoids the endpoint the call
// last failed on (Membership.PickFailover), unless no other can take it.
// An overload answer the server sent (RESOURCE_EXHAUSTED, or an
// UNAVAILABLE with a pushback) is not retried: it comes back to the
// caller, the endpoint cools down (see Outcomes in the package doc), and
// the caller's own retry is routed past it while it does.
//
// It also retries a call that an endpoint refused as longer than its
// context window for the call's model (vLLM's, SGLang's, TGI's or
// TensorRT-LLM's text in the status; see the package doc), within the
// same bounds, with a model or without one (TEI's tei.v1 API names
// none): each retry carries the
// token counts the server gave (at least one past that window) and passes
// over the endpoints the Balancer remembers too small for them. When no
// endpoint is left that might take it, the call ends with the refusal as
// the server sent it. A refusal is believed only of a call whose request
// message carries no such text (UnaryOutcome checks it too; see Outcomes
// in the package doc): one that does ends with it, nothing remembered.
//
// It also retries a call whose endpoint answered that it does not serve
// the call's model (Triton's "Request for unknown model", see the package
// doc), within the same bounds: the server did no work, and another
// endpoint may have the model. With the call's model known (modelHeader,
// or the inferlb.Request in its context), each retry also passes over the
// endpoints the Balancer remembers without it, and when every endpoint is
// remembered so the call ends with the server's answer as it came: a
// model no endpoint serves (a typo) costs one round of answers, each
// endpoint once, then one answer per call, whatever maxAttempts.
//
// Install it with grpc.WithChainUnaryInterceptor on channels that use the
// inferlb policy; elsewhere it never retries. gRPC's own transparent retry
// already covers calls that never left the client; this covers calls the
// server accepted but never answered. Only install it where such calls may
// safely run twice (inference calls without side effects usually may).
//
// With a retryPolicy in the service config, gRPC retries the call itself
// first. Those attempts count toward maxAttempts, so the two do not
// multiply, and, with the interceptor installed, they too avoid the
// endpoint the call last failed on (an affinity key would otherwise send
// each of them back to its owner). They are not drawn from the retry
// budget: bound them with the service config's retryThrottling.
//
// Like UnaryOutcome, it also gives the policy each call's own error, so a
// call the server rejected before the client wrote its request counts as
// the overload or failure it was, and tells it whether a generation call
// its caller cancelled had its answer's message (see UnaryOutcome).
func UnaryRetry(maxAttempts int) grpc.UnaryClientInterceptor {
	retryInUse.Store(true)
	maxAttempts = max(maxAttempts, 2)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		st := &retryState{method: method, ctx: ctx, req: req, reply: reply}
		st.first.st = st
		defer st.release() // after each invoke's close, whose report may read req
		// The last refusal as too long, when the call went on.
		var refused error
		// Whether the next invoke is the retry of a refusal (see
		// invoke.windowRetry), and of a not-served answer (hop).
		var window, hop bool
		for attempt := 1; ; attempt++ {
			inv := &st.first
			if attempt > 1 {
				inv = &invoke{st: st} // its attempts are its own (see invoke)
			}
			inv.windowRetry.Store(window)
			inv.hop.Store(hop)
			err := invokeSettled(context.WithValue(ctx, retryKey{}, inv), st, inv, invoker, method, req, reply, cc, opts)
			if refused != nil && err != nil && inv.sent.Load() == 0 {
				// Sent nowhere: no endpoint left whose window might
				// take it. The caller gets the server's refusal.
				return refused
			}
			if err == nil || attempt >= maxAttempts || int(st.sent.Load()) >= maxAttempts || ctx.Err() != nil {
				return err
			}
			if inv.tooLong.Load() || inv.notServed.Load() {
				// The next attempt's pick spends the retry budget, and
				// only when some endpoint might take the call (fit, and
				// not one remembered without its model): a retry to an
				// endpoint that has just answered the same would only
				// fetch that answer again, on the budget, up to
				// maxAttempts times in every call for a made-up model.
				refused = err // the refusal's status, not a later attempt's
				if r := st.refusal.Load(); inv.tooLong.Load() && r != nil && r.err != nil {
					refused = r.err // (gRPC's retry policy may have tried again)
				}
				window, hop = true, !inv.tooLong.Load()
				continue
			}
			window, hop = false, false
			if status.Code(err) != codes.Unavailable || inv.received.Load() {
				return err
			}
			if b := inv.core.Load(); b == nil || !b.AllowRetry() {
				return err
			}
			// The retry avoids where this attempt died: attemptDone
			// noted it.
		}
	}
}

// invokeSettled runs inv, an invoke of the call: it invokes the call,
// settles inv's held attempt (see hold) with the call's error, reports its
// parked one (see park), and closes both, also when the invoker panics:
// an attempt of inv that ends later is reported as it ends.
func invokeSettled(ctx context.Context, st *retryState, inv *invoke, invoker grpc.UnaryInvoker, method string, req, reply any, cc *grpc.ClientConn, opts []grpc.CallOption) (err error) {
	err = errRetriedAttempt // what a panic leaves: no success
	defer func() {
		inv.held.close(err)
		st.unpark(inv) // the invoker returned: the reply is ours to read
	}()
	err = invoker(ctx, method, req, reply, cc, opts...)
	return err
}

// UnaryOutcome returns a unary client interceptor that gives the inferlb
// policy each call's own error. grpc-go reports a call the server failed
// before the client had written its request to the balancer as a success
// (a request larger than HTTP/2's 64 KiB initial flow-control window,
// such as a long prompt, rejected unread: by a rate limiter in a server's
// tap handle, by a proxy's HTTP 429 or 503): through the interceptor it is
// the overload or failure it was. UnaryRetry does the same; install one of
// the two, with grpc.WithChainUnaryInterceptor, on channels that use the
// inferlb policy. Chain it first: an error that an interceptor inside it
// returns of its own, not a gRPC status (a reply that fails validation),
// does not count against the endpoint that answered.
//
// Both also tell the policy whether a response message arrived: a unary
// generation call (the llm service) that its caller cancels once the
// server's headers came but before its answer's message did had nothing
// back (inferlb.Outcome.Unanswered). grpc-go counts the headers as bytes
// received, and a server may send them before it has the answer
// (grpc.SendHeader), also when its engine hangs: without either
// interceptor such calls count as answered, and a hung replica behind
// such a server is not priced up (scoring.State.Abandoned). They learn it
// from the call's reply message, which they read and leave alone: one
// that the application passed as its type's zero value (as generated
// clients do) and that still is when the call its caller cancelled comes
// back to them (from gRPC, or from the interceptors chained inside) had
// no message decoded into it. The call's options, and its codec and
// content-subtype, stay as the caller and any interceptor set them. A
// reused reply that was not empty tells nothing: such calls count as
// answered, as without the interceptors; a response message that a codec
// other than proto's decodes to the zero value (encoding/json's "{}")
// reads as none. The caller's cancel counts,
// and so does the cancel of an interceptor chained inside them while the
// call's context lives when no other attempt of the invoke was in
// flight at any time during the one it cancels (a per-attempt timeout
// built on context.WithCancel and a timer; gRPC's own retries within
// that attempt, transparent or by a retry policy, end each try before
// the next, and do not count); when the interceptor then tries again,
// the attempt it gave up is reported Unanswered as the next one is
// picked. An attempt that such an interceptor cancels while it
// overlapped another (a hedge's loser) is reported as it ends, as
// answered, and frees its endpoint then. An attempt read from the reply
// stays in flight on its endpoint until the interceptors' invoker
// returns, which reads the reply for it: with an
// interceptor inside that does not return once the caller has
// cancelled, until it does. An attempt that ends after the invoker that
// picked it returned (an interceptor inside left it running) is reported
// as it ends, as grpc-go ended it: UnaryRetry's next invoke neither
// holds it nor reads its reply for it (see invoke).
func UnaryOutcome() grpc.UnaryClientInterceptor {
	retryInUse.Store(true)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		st := &retryState{method: method, ctx: ctx, req: req, reply: reply}
		st.first.st = st
		defer st.release() // after the invoke's close, whose report may read req
		return invokeSettled(context.WithValue(ctx, retryKey{}, st), st, &st.first, invoker, method, req, reply, cc, opts)
	}
}

// release gives the call's request and reply messages back to the
// application: a refusal of an attempt that ends later is not believed
// (see believed), and its reply tells nothing (see unanswered).
func (st *retryState) release() {
	st.reqMu.Lock()
	st.req, st.reply, st.returned = nil, nil, true
	st.reqMu.Unlock()
}

// believed reports whether a refusal of the call as too long is believed:
// its request message carries no refusal's text (carriesRefusal), and the
// call has not returned (its message is the application's again, and
// nothing is known of it).
func (st *retryState) believed() bool {
	st.reqMu.Lock()
	defer st.reqMu.Unlock()
	return !st.returned && !carriesRefusal(st.req)
}
