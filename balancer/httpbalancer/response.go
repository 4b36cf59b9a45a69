package httpbalancer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/pace"
	"github.com/inferlb/inferlb/telemetry/loadheader"
)

// ErrDeadlineMidStream is the Outcome.Err of a stream that the caller's
// deadline ended after its first token, and of any other answer (a JSON
// body: an embedding, a rerank, a chat not streamed) that it ended after
// the headers, while the caller read the body, unless a Read gave up
// before the first byte of a body whose length the headers did not
// announce: the endpoint was
// generating or had answered, and a long answer outlasting the caller's
// time budget, or a large body read slowly, says nothing about its
// health, so it counts as neither success nor failure (it wraps
// context.Canceled, which the balancer reads so) and errors.Is also finds
// context.DeadlineExceeded in it. Counted as failures, a workload of long
// generations under a tight deadline would trip the breakers of healthy
// endpoints, moving their load to the others, where it times out too. A
// deadline that passes before the first token (before the headers, for
// an answer that is no stream, or in a Read before the first byte of one
// whose headers announced no length) is a failure, as before: an endpoint
// that hangs or queues without answering is what the breaker is for.
var ErrDeadlineMidStream error = deadlineMidStream{}

type deadlineMidStream struct{}

func (deadlineMidStream) Error() string {
	return "inferlb: the caller's deadline ended the answer after it began (a stream's first token, another body's headers)"
}

func (deadlineMidStream) Is(target error) bool {
	return target == context.DeadlineExceeded || target == context.Canceled
}

// StatusError is the Outcome.Err reported to the balancer for a 5xx answer
// that is not an overload signal, for a 424 (TGI's and TEI's failed
// inference), and for a 200 stream that reports, after it started, an
// error read as the endpoint's failure (a 5xx code, or a kind or text
// read as one, such as TGI's failed generation: see the package doc);
// StatusCode is then that status, while Result.Status stays 200. The
// response itself still goes to the caller unchanged.
type StatusError struct {
	StatusCode int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("inferlb: endpoint answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// EndpointError names the endpoint behind an error that says nothing of
// which backend broke (an io.ErrUnexpectedEOF, a bare EOF, a TLS or
// protocol error): RoundTrip returns one when the call failed on an
// endpoint before any response (the last endpoint tried, after a
// failover), and a response body's Read when the body fails before its
// end (a connection reset, a server that died mid-stream). errors.Is and
// errors.As find the error underneath. Errors that are not an endpoint's
// come as they are: the end of a body is io.EOF itself, as io.Reader
// callers expect; the context's end is context.Canceled or
// context.DeadlineExceeded itself, as net/http returns it (callers compare
// those with ==: httputil.ReverseProxy tells a client that went away by
// err == context.Canceled), or the cause the caller gave it
// (context.WithCancelCause); and a request net/http will not send fails
// with net/http's error.
type EndpointError struct {
	Endpoint string // the endpoint's ID (inferlb.Endpoint.Key)
	Err      error
	body     bool // the response body failed, not the call
}

func (e *EndpointError) Error() string {
	if e.body {
		return "inferlb: response body from endpoint " + strconv.Quote(e.Endpoint) + ": " + e.Err.Error()
	}
	return "inferlb: endpoint " + strconv.Quote(e.Endpoint) + ": " + e.Err.Error()
}

func (e *EndpointError) Unwrap() error { return e.Err }

// Timeout reports whether the error underneath is a timeout. http.Client's
// *url.Error and os.IsTimeout ask the error they hold by type assertion,
// not errors.As, so without it the common err.(net.Error).Timeout() check
// would stop seeing timeouts. (There is no Temporary, so an EndpointError
// is not itself a net.Error: errors.As finds the one underneath, if any.)
func (e *EndpointError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// call is one RoundTrip: what inspection found, the current attempt's pick,
// and, once a response arrived, the body wrapper that reports the outcome
// when the body ends. One allocation holds it all, and the peek buffer too
// when the peek must outlive inspection (see newCall and peekBuf): on the
// loopback call each allocation costs more than most of the work, since it
// is cold memory to zero and the garbage collector's share is paid per
// object and per byte.
//
// Concurrency: every field but the atomics is written before the response
// is returned to the caller and only read afterwards. Read runs on one
// goroutine at a time (io.Reader's contract) and alone touches the SSE line
// state; Close may run concurrently with Read, so what finish reads of the
// stream (events, firstNs, lastNs, the response ID, a 503 body's start) is
// atomic, or written only before the first event counts (fromNs,
// enteredNs), and ends makes the outcome report happen once.
type call struct {
	t    *Transport
	info Info

	// The first attempt's request and URL, kept here to save allocations
	// (see outgoing). out is a copy of the caller's request from the start:
	// its context is the call's.
	out    http.Request
	outURL url.URL
	pick   balancer.Pick
	start  int64 // attempt start, unix ns on the transport's clock

	rc io.ReadCloser // the response body
	// left is what the body has still to deliver of the length its header
	// announced (leftUnknown when it announced none, or 0, and leftBegun
	// once such a body delivered a byte): see Read and noByte.
	left int64
	// What the status line and headers said: the Outcome's Err (endFailed:
	// a StatusError of status), Overloaded and RetryAfter.
	// overload is 0 unless the answer was an overload signal, and then the
	// server's hint (retry-after-ms, else Retry-After: see retryAfter)
	// plus 1 (so that a hint of 0, none, is still seen).
	// Negative, it is minus the time to the response headers of a call
	// whose latency is measured there (see headersLatency). One field
	// rather than three keeps call in the 640-byte size class.
	overload time.Duration
	status   int32
	ends     atomic.Uint32 // endClosing | endReported | endResent | endFailed | endNotServed
	sse      *sseState     // set for a server-sent event stream
}

// sseState follows a server-sent event stream. Only streams pay for it:
// kept out of call, it keeps call in a smaller size class.
//
// It also carries the search for a /v1/responses answer's ID (see
// ResponseMemory), which any such answer needs, streamed or not; counting
// tells whether the body is a stream whose events are counted.
type sseState struct {
	line     [16]byte // start of the current line: enough for "data: [DONE]\r"
	end      [16]byte // end of the current line: the last len(end) bytes, right-aligned
	lineLen  int      // bytes in the current line so far (may exceed len(line))
	counting bool     // the body is an SSE stream
	// The current event (the lines up to a blank one): counted already (a
	// data line was seen), or named by its event field as one that carries
	// no token; errEvent, that it is of type "error", whose data lines
	// report an error whatever they hold (the Messages API's);
	// failedEvent, that it is the Responses API's response.failed, whose
	// data lines are read for the failed response's error (errScan.resp).
	counted, notToken, errEvent, failedEv bool
	// A data line that is an error object ({"error": ...}, as vLLM and
	// SGLang report a failure after the stream started) is read for its
	// code as it streams by (inErr), by errScan, allocated at the first
	// such line; errCode is the last code read.
	errScan *errScan
	inErr   bool
	errCode atomic.Int32
	events  atomic.Int64
	firstNs atomic.Int64 // unix ns of the first data event
	lastNs  atomic.Int64 // unix ns of the latest data event
	// The reader's time blocked in Read since the first data event (see
	// readerPaced): in all, and up to the latest data event. readNs is
	// when the current Read returned (0 until read from the clock).
	waitNs   int64
	waitLast atomic.Int64
	readNs   int64
	// Before the first data event (see readerLate): the time from which
	// the reader's time away from the stream counts (the headers', moved
	// on by each wait in Read since), and when the latest Read began; once
	// the event counts, that Read is the one that delivered it. Read
	// writes them only before, and finish reads them only after.
	fromNs, enteredNs int64
	id                *idCapture // a /v1/responses answer's ID, when remembered
	// An NDJSON stream (Ollama's): each line is an event, and one with
	// "done": true carries no token; doneAt is how much of that member
	// the current line has shown (see matchDone), done that it has, and
	// depth, inStr and esc where the line's JSON is (nesting, in a string,
	// after a backslash in one), so that only the line's own member counts.
	ndjson, done bool
	doneAt       uint8
	depth        uint8
	inStr, esc   bool
	// The current line ends in a CR that ended the last Read: a CRLF's,
	// or a bare CR that ended the line (see scan).
	crEnd bool
	// Where the current line is in an OpenAI-style chunk's choices (chSeek
	// to chDone, see choices), and the start of the first choice's delta
	// object, kept to be read at its end: chLen bytes of chBuf.
	// roleTok, that a token's delta gave the role (TGI's do).
	chPh    uint8
	chLen   uint8
	chBuf   [48]byte
	roleTok bool
	// In a usage chunk (chEmpty): how much of usageKey the line has
	// shown (usAt, then usInNum in its number, usOff when done, usGot
	// when done with the count in usVal), and the number's value so far;
	// outTokens is the server's count of the output tokens: the stream's
	// last usage chunk's completion_tokens, or what tk read (0: none
	// read), stored when the event that holds it ends (endLine). See usage.
	usAt      uint8
	usVal     uint32
	outTokens atomic.Int32
	// In the event that ends a Messages or Responses API stream, or a
	// line of an NDJSON stream: where the line's JSON is for the member
	// that carries the server's count of the output tokens (see tokens).
	tk   tokenScan
	shed *shedBody // a 503's body, when it had no Retry-After nor retry-after-ms
	// The current event's JSON is open at the end of a data line: the
	// event's next data lines go on with it (see opens).
	cont     bool
	contPh   uint8 // what the current line is, once its start shows (contData, ...)
	contLead bool  // the line's value has shown only white space so far
	errAt    uint8 // how much of errKey the open event's JSON has shown (seekErr)
}

// read follows the body's bytes p, which a Read that began at enteredNs
// returned (0 when not measured: not an SSE stream).
func (c *sseState) read(p []byte, clock balancer.Clock, enteredNs int64) {
	if c.id != nil {
		c.id.feed(p)
	}
	if c.shed != nil {
		c.shed.feed(p)
	}
	if c.counting {
		c.readNs = 0
		if c.events.Load() > 0 {
			c.readNs = clock.Now().UnixNano()
			c.waitNs += max(c.readNs-enteredNs, 0)
			c.scan(p, clock)
			return
		}
		c.enteredNs = enteredNs
		c.scan(p, clock) // reads the time it returned if an event counts
		if c.events.Load() == 0 {
			// Still none: the reader's wait in this Read (a line that
			// came in pieces, an event with no token) is no time away.
			c.fromNs += max(clock.Now().UnixNano()-enteredNs, 0)
		}
	}
}

// readerPaced reports whether the reader, not the endpoint, set the pace
// of the data events from the first to the last (see package pace).
func (c *sseState) readerPaced() bool {
	return pace.ReaderPaced(c.waitLast.Load(), c.lastNs.Load()-c.firstNs.Load())
}

// readerLate reports whether the reader came for the first data event so
// late after the headers that it may have been waiting, its time unknown
// (see package pace). startNs is when the attempt began.
func (c *sseState) readerLate(startNs int64) bool {
	first := c.firstNs.Load()
	return pace.ReaderLate(c.enteredNs-c.fromNs, first-c.enteredNs, first-startNs)
}

// awaitedFirst reports whether a stream that has had no token yet ended
// in a Read that began at enteredNs (0: not measured) and waited for its
// first token: the reader was not away for the time the stream has been
// out (pace.ReaderLate, as if the token came now), or the Read waited long
// enough to see it come. A stream whose reader gave up so has had nothing
// of its answer (inferlb.Outcome.Unanswered): vLLM sends a stream's
// headers at once, before its first token, also when its engine hangs.
// startNs is when the attempt began. Called from Read, which alone writes
// fromNs before the first token.
func (c *sseState) awaitedFirst(startNs, enteredNs int64, clock balancer.Clock) bool {
	if !c.counting || enteredNs == 0 || c.events.Load() != 0 {
		return false
	}
	now := clock.Now().UnixNano()
	return !pace.ReaderLate(enteredNs-c.fromNs, now-enteredNs, now-startNs)
}

// newCall allocates the state of one call. When size > 0 (the peek of a
// body of known length needs size bytes), a buffer of at least that many
// bytes shares the allocation if one of the sizes below fits: one object
// fewer per call for the small requests where the transport's cost shows.
// Each size (named for the whole) fills a size class of the allocator exactly
// (objects with pointers above 512 bytes carry an 8-byte header).
func newCall(size int) (*call, []byte) {
	switch {
	case size <= 0:
	case size <= len(callBuf896{}.buf):
		v := new(callBuf896)
		return &v.c, v.buf[:0]
	case size <= len(callBuf1280{}.buf):
		v := new(callBuf1280)
		return &v.c, v.buf[:0]
	case size <= len(callBuf2048{}.buf):
		v := new(callBuf2048)
		return &v.c, v.buf[:0]
	case size <= len(callBuf4096{}.buf):
		v := new(callBuf4096)
		return &v.c, v.buf[:0]
	case size <= len(callBuf8192{}.buf):
		v := new(callBuf8192)
		return &v.c, v.buf[:0]
	}
	return new(call), nil
}

const callHeader = 8 + unsafe.Sizeof(call{})

type (
	callBuf896 struct {
		c   call
		buf [896 - callHeader]byte
	}
	callBuf1280 struct {
		c   call
		buf [1280 - callHeader]byte
	}
	callBuf2048 struct {
		c   call
		buf [2048 - callHeader]byte
	}
	callBuf4096 struct {
		c   call
		buf [4096 - callHeader]byte
	}
	callBuf8192 struct {
		c   call
		buf [8192 - callHeader]byte
	}
)

// fail reports an attempt that got no response.
func (c *call) fail(err error, failedOver bool) {
	o := inferlb.Outcome{Err: err}
	ce := c.out.Context().Err()
	if ce != nil {
		o.Err = ce // the caller's own doing, whatever the transport made of it
	}
	// The caller gave up on the call (its context, or Request.Cancel)
	// while the endpoint had sent nothing back: a wait the balancer may
	// read as a lower bound on the endpoint's latency. Not on the ends
	// that blame no one, where the wait was not the endpoint's.
	o.Unanswered = (ce == context.Canceled || ce == nil && err == errLegacyCanceled) && !blamesNobody(err)
	f := c.t.cfg.onResult
	if f != nil {
		o.Latency = c.pick.Elapsed() // as Done would measure it (see balancer.MonotonicClock)
	}
	c.pick.Done(o) // with Latency 0 the balancer measures it from the pick
	if f != nil {
		f(Result{Endpoint: c.pick.ID(), Request: c.info.Request, Outcome: o, FailedOver: failedOver, Resent: c.ends.Load()&endResent != 0})
	}
}

// blamesNobody reports whether err is one of the attempt ends this
// transport reports as canceled to blame no endpoint, whose wait says
// nothing about the endpoint: the caller's body failing, a panic in Base
// or in reading an answer's body, a request net/http refused or one never
// sent, an Addr HTTP cannot use, an idle connection the server closed, a
// refusal (not served, too long) whose retry the caller's code broke off
// (the endpoint had answered).
func blamesNobody(err error) bool {
	switch err {
	case errBodyFailed, errBasePanicked, errBodyPanicked, errMalformed, errNotSent, errUnusableAddr, errIdleConnClosed,
		errNotServed, errTooLong:
		return true
	}
	return false
}

// respond classifies the response and wraps its body so the outcome is
// reported when the body ends, not now: a stream's work has barely begun
// when its headers arrive.
func (c *call) respond(resp *http.Response) (*http.Response, error) {
	c.status = int32(resp.StatusCode)
	h := resp.Header
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests, code == statusOverloaded:
		d, _ := retryAfter(h, c.t.cfg.clock)
		c.overload = d + 1
	case code == http.StatusServiceUnavailable:
		// 503 with Retry-After (or retry-after-ms) is "busy, come back
		// later"; without either, it is as likely a broken or starting
		// server, which is a failure.
		if d, ok := retryAfter(h, c.t.cfg.clock); ok {
			c.overload = d + 1
		} else {
			c.ends.Or(endFailed)
		}
	case code >= 500, code == http.StatusFailedDependency:
		// 424 is TGI's and TEI's answer when inference fails (a shard's
		// CUDA error, a shard gone; TEI's backend error): the endpoint's
		// failure, not the request's (they answer a bad request 422 or
		// 413).
		c.ends.Or(endFailed)
	case clientError(code):
		c.ends.Or(endClientError)
	}
	if v := h[loadHeader]; len(v) > 0 {
		// A partly readable report (err wraps telemetry.ErrPartial) still
		// carries good fields, and the Store counts the fields it lost
		// (Partial); an unreadable one carries none, and is published
		// all the same so that the Store counts it (DroppedEmpty):
		// malformed telemetry is ignored and counted.
		s, err := loadheader.Parse(v[0])
		if !s.Empty() {
			s.Time = c.t.cfg.clock.Now() // parsers leave it zero
			if err != nil {
				c.t.b.Telemetry().CountPartial()
			}
		}
		c.t.b.Publish(c.pick.ID(), s)
	}
	if resp.Body == nil || resp.Body == http.NoBody || bodiless(c.out.Method, resp.StatusCode) || knownEmpty(resp) {
		// Nothing to wait for; an upgraded connection is not an inference call.
		c.finish(nil)
		return resp, nil
	}
	ct := ""
	if v := h["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	const eventStream, ndjson = "text/event-stream", "application/x-ndjson"
	// A body the server compressed (the caller set Accept-Encoding
	// itself, so Base left it as it came) is not read: its bytes are not
	// the events'. Read, a stream compressed in stored blocks (gzip's
	// for small flushes at its fastest levels) showed some of its events
	// and error objects between block headers, miscounting the tokens.
	switch {
	case (len(ct) >= len(eventStream) && strings.EqualFold(ct[:len(eventStream)], eventStream) || c.info.Stream && !hasJSON(ct)) && !encoded(h):
		// The headers' time: a first token the caller comes for late
		// after it may have been waiting (see readerLate).
		c.sse = &sseState{counting: true, fromNs: c.stamps().Now().UnixNano()}
	case len(ct) >= len(ndjson) && strings.EqualFold(ct[:len(ndjson)], ndjson) && !encoded(h):
		// Ollama's stream: a JSON object a line (see sseState.ndjson).
		c.sse = &sseState{counting: true, ndjson: true, fromNs: c.stamps().Now().UnixNano()}
	}
	if c.t.cfg.chains != nil && c.info.AffinityKey != 0 && resp.StatusCode/100 == 2 && isResponses(c.out.URL.Path) {
		if c.sse == nil {
			c.sse = new(sseState)
		}
		c.sse.id = new(idCapture)
	}
	if c.sse == nil && c.overload == 0 && headersLatency(c.info.Service) {
		c.overload = -max(c.pick.Elapsed(), 1) // no forward step of the clock (see balancer.MonotonicClock)
		if d := c.t.cfg.dials; d != nil && resp.Request != nil && d.since(resp.Request.URL, c.start) {
			// A connection to the endpoint was set up while the call was
			// out: its latency may include the setup (see dialMarks).
			c.ends.Or(endDialed)
		}
	}
	if resp.StatusCode == http.StatusServiceUnavailable && c.overload <= 0 {
		c.watchShed() // its body may say the server shed the call
	}
	c.rc = resp.Body
	c.left = leftUnknown
	if resp.ContentLength > 0 {
		// 0 is left unknown: a Response made by hand (a mock, a
		// middleware) often has a body and a ContentLength never set
		// (one known to be 0 ended above: knownEmpty).
		c.left = resp.ContentLength
	}
	resp.Body = c
	return resp, nil
}

// encoded reports whether a response's body comes with a content coding
// (gzip, br, zstd, ...): a Content-Encoding other than identity.
func encoded(h http.Header) bool {
	for _, v := range h["Content-Encoding"] {
		for v != "" {
			var e string
			e, v, _ = strings.Cut(v, ",")
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return true
			}
		}
	}
	return false
}

// bodiless reports whether a response to a request of method with status
// code has no body, whatever Base made its Body: the answer to a HEAD, a
// 204 or 304, an upgrade (101). net/http's HTTP/1 transport gives these
// http.NoBody, but its HTTP/2 transport an empty body of its own, and a
// caller that does not close the body of a HEAD or a 204 (net/http holds
// nothing open for it) would leave the call in flight on its endpoint for
// good.
func bodiless(method string, code int) bool {
	return method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified ||
		code == http.StatusSwitchingProtocols
}

// knownEmpty reports whether resp's body is known to be empty: its
// ContentLength is 0 and either a Content-Length header says so or it came
// over HTTP/2, whose transport in net/http sets ContentLength to -1 unless
// that header or the stream's end with the headers gave it. net/http's
// HTTP/1 transport gives such an answer http.NoBody, but its HTTP/2
// transport an empty body of its own, and a Base that wraps bodies (a
// tracing middleware) a wrapper; a caller that takes the status and leaves
// the empty body alone (net/http holds nothing open for it) would leave the
// call in flight on its endpoint for good. A ContentLength of 0 alone says
// nothing: a Response made by hand (a mock, a middleware) often has a body
// and a ContentLength never set.
func knownEmpty(resp *http.Response) bool {
	if resp.ContentLength != 0 {
		return false
	}
	if resp.ProtoMajor == 2 {
		return true
	}
	cl := resp.Header["Content-Length"]
	if len(cl) != 1 {
		return false
	}
	n, err := strconv.ParseUint(strings.Trim(cl[0], " \t"), 10, 63)
	return err == nil && n == 0
}

// headersLatency reports whether the latency a service's endpoints are
// scored on is measured to the response headers rather than to the end of
// the body: embeddings and rerankers, priced on peak-EWMA latency, which
// jumps to a slow answer at once. Their servers send the headers once the
// answer is computed; the time the body then takes is the pace at which
// the caller reads it, which a slow reader (a client the caller forwards
// the answer to) would otherwise make the endpoint's: one 6 KB answer read
// 64 bytes a second made an endpoint that answered in 20 ms look 96 s
// slow. Linkerd's peak-EWMA balancer measures to the headers too. The
// call stays in flight until the body ends, and Result reports the whole
// call. Streams, and generation calls (whose price ignores latency), are
// left as they were. An answer given up on before its first byte (see
// noByte) is priced at its wait, as one given up on before its headers.
func headersLatency(s inferlb.Service) bool {
	return s == inferlb.ServiceEmbedding || s == inferlb.ServiceRerank
}

// statusOverloaded is 529, Anthropic's "overloaded" answer, which
// gateways in front of model servers give too: an overload, as 429 is.
const statusOverloaded = 529

// retryAfter reads the overload answer's hint as the official OpenAI
// SDKs do: retry-after-ms first (milliseconds, possibly fractional: Azure
// OpenAI's and other gateways'), else Retry-After (delay-seconds, which
// may have a fraction, as the SDKs read it: see delaySeconds; or an HTTP
// date). The SDK waits the milliseconds and retries; cooled down for
// the rounded-up Retry-After, or for the default cooldown, the endpoint
// would be out far longer than the server asked. A retry-after-ms that is
// no number (strconv.ParseFloat's syntax, as openai-go reads it), negative,
// NaN or infinite is ignored for Retry-After; one past float64's range is
// a very long hint. ok reports that either header is present, even if
// unparsable (then the balancer's default cooldown applies). Called for
// overload answers only: other answers never look the headers up.
func retryAfter(h http.Header, clock balancer.Clock) (d time.Duration, ok bool) {
	if v := h["Retry-After-Ms"]; len(v) > 0 {
		if d, valid := retryAfterMs(v[0]); valid {
			return d, true
		}
		ok = true
	}
	v := h["Retry-After"]
	if len(v) == 0 {
		return 0, ok
	}
	s := strings.TrimSpace(v[0])
	if d, valid := delaySeconds(s); valid {
		return d, true
	}
	if t, err := http.ParseTime(s); err == nil {
		// Capped as well: a date 292 years ahead saturates Sub at the largest
		// Duration, which the +1 of call.overload would wrap negative,
		// reading an overload as none.
		return min(max(t.Sub(clock.Now()), 0), maxHint), true
	}
	return 0, true
}

// maxHint caps a server's hint (the balancer caps far lower).
const maxHint = 24 * time.Hour

// retryAfterMs reads a retry-after-ms value; valid is false for one that
// openai-go skips for Retry-After. It converts as openai-go does (the
// float's milliseconds times a millisecond, truncated), capped at maxHint.
func retryAfterMs(v string) (d time.Duration, valid bool) {
	ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	switch {
	case err == nil && ms >= 0 && !math.IsInf(ms, 1): // NaN is not >= 0
		return time.Duration(min(ms, float64(maxHint/time.Millisecond)) * float64(time.Millisecond)), true
	case errors.Is(err, strconv.ErrRange) && math.IsInf(ms, 1):
		return maxHint, true // digits past float64's range: a very long hint
	}
	return 0, false
}

// delaySeconds reads a Retry-After of seconds: RFC 9110's delay-seconds
// (digits), with an optional sign, as strconv.ParseInt reads it, and with
// an optional fraction ("1.5", ".5", "2."), which gateways send and the
// OpenAI SDKs read (openai-go with strconv.ParseFloat, the Python one with
// float). The fraction counts to the nanosecond, truncated beyond; a
// negative number is 0, and any number is capped at maxHint, however many
// digits it has. Other syntax (an exponent, hex, a digit separator, "inf",
// trailing text) is not a number of seconds: valid is false.
func delaySeconds(s string) (d time.Duration, valid bool) {
	i := 0
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	whole := s[start:i]
	frac := ""
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		frac = s[start:i]
	}
	if i != len(s) || whole == "" && frac == "" {
		return 0, false
	}
	if neg {
		return 0, true
	}
	var secs int64
	for _, c := range whole {
		if secs = secs*10 + int64(c-'0'); secs > int64(maxHint/time.Second) {
			return maxHint, true // and so is any longer run of digits
		}
	}
	d = time.Duration(secs) * time.Second
	unit := time.Second
	for j := 0; j < len(frac) && j < 9; j++ {
		unit /= 10
		d += time.Duration(frac[j]-'0') * unit
	}
	return min(d, maxHint), true
}

// call.left of a body whose length its headers did not announce: before
// and after its first byte.
//
// noByte: an answer that is no stream (a JSON body) whose caller's context
// ended a Read before the body's first byte had nothing of the answer,
// when the headers announced no length: a gateway, or a server, that
// flushes the headers at once, before the answer exists, sends them also
// when the engine behind it hangs, and they say no more than a stream's
// headers do before its first token. It is read as a stream given up on
// before its first token is (endAwaited): a cancel is Unanswered, a
// deadline the endpoint's failure, not ErrDeadlineMidStream. A body whose
// headers announced its length had its answer when they came (a server
// knows the length once it has the answer), and keeps reading as begun.
// Only the bodies of unknown length pay for it, a plain store in each Read
// that returns bytes; a Read that returned any byte before tells net/http's buffered
// bytes from none, since it hands over what it buffered before the
// context's error.
const (
	leftUnknown = -1
	leftBegun   = -2
)

// Bits of call.ends. One word for both keeps call in its size class.
const (
	endClosing     = 1 << iota // Close has begun
	endReported                // the outcome was reported (finish)
	endResent                  // sent again after an idle close (Result.Resent)
	endFailed                  // the status is the endpoint's failure (StatusError)
	endNotServed               // the endpoint does not serve the call's model (see notServed)
	endClientError             // the status says the call was bad or not allowed (see clientError)
	endAwaited                 // the caller gave up in a Read that waited for a stream's first token (see awaitedFirst), or before an answer's first byte (see noByte)
	endDialed                  // a connection to the endpoint was set up while a latency-scored call was out (see dialMarks)
)

// clientError reports whether an HTTP status says the call was bad or not
// allowed, which inferlb.Outcome.ClientError reports: 4xx but 408 (the
// server's own timeout, an answer like any other), 424 (TGI's and TEI's
// failed inference, the endpoint's failure) and 429 (an overload answer).
// A 404 that names the call's model and a refusal as too long for the
// context window are read before it (see notServed, tooLong).
func clientError(code int) bool {
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout &&
		code != http.StatusFailedDependency && code != http.StatusTooManyRequests
}

// stamps is the clock a stream's events are timed on: the attempt's start
// (its pick's) plus the pick's Elapsed, so that a forward step of the
// wall clock is no time between two stamps, as it is none in a call's
// wait (see balancer.MonotonicClock); a step back shortens as it did.
// Read from the wall clock, a step of an hour before a stream's first
// token made its TTFT an hour, and the endpoint's TTFT EWMA with it; one
// between its tokens, its decode speed. Without a step, or with a Clock
// that is no MonotonicClock, it reads what the Balancer's clock reads: as
// many reads, and no allocation (a *call converted).
type stamps call

func (c *call) stamps() balancer.Clock { return (*stamps)(c) }

func (s *stamps) Now() time.Time {
	c := (*call)(s)
	return time.Unix(0, c.start+int64(c.pick.Elapsed()))
}

// errBodyPanicked is the Outcome.Err of a call whose response body, as
// Base returned it, panicked in Read or Close (a mock's, a middleware's).
// As with a Base that panics (errBasePanicked), the panic goes on, the
// call is finished on the way out so that the endpoint is not one call
// busier for good, and no endpoint is blamed: it wraps context.Canceled.
var errBodyPanicked = fmt.Errorf("inferlb: httpbalancer: the response body panicked: %w", context.Canceled)

// Read implements io.Reader for the response body.
func (c *call) Read(p []byte) (int, error) {
	returned := false
	defer func() { // open-coded: a few ns a Read
		if !returned {
			c.finish(errBodyPanicked)
		}
	}()
	s := c.sse
	var entered int64
	if s != nil && s.counting {
		entered = c.stamps().Now().UnixNano() // see readerLate, readerPaced
	}
	n, err := c.rc.Read(p)
	if s != nil && n > 0 {
		s.read(p[:n], c.stamps(), entered)
	}
	returned = true
	if c.left >= 0 {
		// The body has delivered all it announced: the call is over, as
		// at EOF. net/http hands over io.EOF with an HTTP/1.1 body's last
		// bytes, but over HTTP/2 the EOF waits for one more Read, which a
		// JSON decoder (it stops at the closing brace) never makes: the
		// call would stay in flight on its endpoint until the caller's
		// Close, after its own work on the answer.
		if err == nil {
			if c.left -= int64(n); c.left <= 0 {
				c.finish(nil)
			}
		}
	} else if n > 0 {
		c.left = leftBegun // see noByte
	}
	if err != nil {
		switch {
		case err == io.EOF:
			if s != nil && s.crEnd {
				s.endCR(c.stamps()) // no LF can follow the CR
			}
			c.finish(nil)
		case c.ends.Load()&endClosing != 0:
			// The caller closed the body under this Read (a stream
			// stopped from another goroutine): the Close ends the call,
			// whichever of the two reports first. The error is the
			// caller's doing, not the endpoint's, and goes back as it is.
			c.finish(c.out.Context().Err())
		case err == context.Canceled || err == context.DeadlineExceeded || c.out.Context().Err() != nil || legacyCanceled(&c.out):
			// The context's end, as net/http's body returns it (or its
			// cause, when the caller gave one: WithCancelCause): no
			// endpoint broke, and callers compare it with ==
			// (httputil.ReverseProxy tells a client gone by it).
			if s != nil && s.counting {
				if s.awaitedFirst(c.start, entered, c.stamps()) {
					c.ends.Or(endAwaited)
				}
			} else if c.left == leftUnknown {
				c.ends.Or(endAwaited) // no byte of an answer that is no stream (see noByte)
			}
			c.finish(err)
		default:
			c.finish(err)
			err = &EndpointError{Endpoint: c.pick.ID(), Err: err, body: true}
		}
	}
	return n, err
}

// Close implements io.Closer. Closing before EOF is how a client that has
// what it needs (a JSON decoder, a stream consumer that is done) ends the
// call; it says nothing bad about the endpoint unless the context ended.
func (c *call) Close() error {
	c.ends.Or(endClosing) // before the Close that may fail a blocked Read
	returned := false
	defer func() {
		if !returned {
			c.finish(errBodyPanicked)
		}
	}()
	err := c.rc.Close()
	returned = true
	c.finish(c.out.Context().Err())
	return err
}

// scan counts SSE events with data (except the "[DONE]" terminator) as
// they stream by: one per generated chunk on OpenAI-compatible servers, so
// the count approximates output tokens and the first one is time to first
// token. An event counts once however many data lines it has, when its
// first one with data ends (an empty "data:" line carries no chunk), or,
// when that line leaves a JSON object open, at the event's end, its JSON
// read over all its data lines (see opens). Typed events that carry no token do not count: "error"
// and "ping", and the lifecycle events around the token deltas of the
// Responses API (response.created, response.in_progress, ...; only
// response.*.delta counts) and of the Anthropic Messages API that vLLM also
// serves (message_start, content_block_start, ...; only content_block_delta
// counts). vLLM sends response.created before the prompt is even scheduled,
// so counting it would make time to first token the time to the headers.
// Other event types count. The event field precedes the data in every
// server's events.
//
// Nor do the chunks of the OpenAI-style APIs that carry no token (see
// choices): the usage chunk that ends a stream asked for
// stream_options.include_usage, whose "choices" is [] (vLLM, SGLang,
// llama.cpp, OpenAI), the chat stream's opening role chunk, whose delta
// holds the role and no text ({"role":"assistant","content":""}), and the
// finish chunk whose delta is empty ("delta":{} with the finish_reason:
// OpenAI's, which its usage.completion_tokens does not count; SGLang's,
// sent after the last token's chunk; llama.cpp's). Counted, they made the
// output tokens up to three too many and the time between tokens the span
// over N+2 gaps instead of N-1. Time to first token is stamped at
// the first token's chunk, not at the role chunk: vLLM (and SGLang,
// llama.cpp) send the role chunk in the same step as the first token, so
// the two are read together and nothing is lost, while a server or a proxy
// that sent it as the stream opens would make time to first token the time
// to the headers, as response.created did; and time between tokens, timed
// from the first counted event, must start at a token. A chunk whose delta
// has no role and empty text (vLLM's last, {"content":""} at finish_reason:
// the end of generation's token, whose text is empty and which vLLM's
// usage.completion_tokens counts; text held back, a partial UTF-8
// character or a stop string being matched) is a step of generation and
// counts. The usage chunk's usage.completion_tokens, the server's own
// count, is read (see usage) and reported as the output tokens in place of
// the count of events; the events still time the first token and the gaps.
// So is the count that ends a Messages or Responses API stream, or an
// Ollama stream (see tokens).
//
// A line ends at a LF, a CRLF or a bare CR (WHATWG's EventSource allows
// all three; an NDJSON line ends at a LF). A CR stays in its line, which
// is read as a CRLF line is; a CR that ends a Read ends its line only
// when the next Read shows no LF after it (crEnd).
func (c *sseState) scan(p []byte, clock balancer.Clock) {
	if c.crEnd && len(p) > 0 {
		c.crEnd = false
		if p[0] != '\n' {
			c.endAny(clock) // a bare CR ended it; a LF ends it below
		}
	}
	if c.cont {
		p = c.scanOpen(p, clock) // an event whose JSON is open
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if j := bytes.IndexByte(seg, '\r'); j >= 0 && j < len(seg)-1 && !c.ndjson {
			seg, i = seg[:j+1], j // a bare CR ends the line
		}
		before := c.lineLen
		if c.lineLen < len(c.line) {
			copy(c.line[c.lineLen:], seg)
		}
		c.lineLen += len(seg)
		switch {
		case c.inErr:
			c.errScan.feed(seg)
		case before < len(c.line) && c.lineLen >= len(c.line) && errorValue(c.line[:], c.errEvent || c.failedEv) >= 0:
			// Rare (an error event): the line is read for its code.
			c.startErr()
			c.errScan.feed(seg[len(c.line)-before:])
		}
		if c.chPh < chDone && !c.counted && !c.notToken && !c.ndjson {
			c.choices(seg, before)
		} else if c.chPh == chEmpty && c.usAt < usOff {
			c.usage(seg)
		}
		c.keepEnd(seg)
		if c.ndjson {
			c.matchDone(seg)
		}
		if c.tk.kind != tkNone || c.ndjson {
			c.tokens(seg)
		}
		if i < 0 {
			c.crEnd = seg[len(seg)-1] == '\r' && !c.ndjson
			return
		}
		p = p[i+1:]
		if c.endLine(clock) {
			p = c.scanOpen(p, clock) // the event's JSON goes on
		}
	}
}

// endCR ends the current line, whose CR ended the stream (see crEnd).
//
//go:noinline
func (c *sseState) endCR(clock balancer.Clock) {
	c.crEnd = false
	c.endAny(clock)
}

// endLine ends the current line of an event that is not open (see
// opens); true when the line opens it.
func (c *sseState) endLine(clock balancer.Clock) (open bool) {
	if c.lineLen >= len("data:{") && !endsObject(&c.end) && c.line[0] == 'd' && !c.counted && !c.ndjson && c.opens() {
		return true // the event's JSON goes on in its next data line
	}
	chunk := c.chPh
	if c.usAt == usGot {
		c.outTokens.Store(int32(c.usVal)) // the usage chunk's count (see usage)
	}
	c.chPh, c.chLen, c.usAt, c.usVal = chSeek, 0, 0, 0
	var tk tokenScan
	if c.tk.kind != tkNone || c.ndjson { // tokens followed the line
		tk, c.tk = c.tk, tokenScan{kind: c.tk.kind}
		if tk.found && !c.ndjson {
			c.outTokens.Store(int32(tk.got)) // its output_tokens (see tokens)
		}
	}
	n := min(c.lineLen, len(c.line))
	line := c.line[:n]
	whole := c.lineLen <= len(c.line)
	lineLen := c.lineLen
	c.lineLen = 0
	if c.ndjson {
		done := c.done
		c.done, c.doneAt, c.depth, c.inStr, c.esc = false, 0, 0, false, false
		if bytes.HasPrefix(line, []byte(`{"error"`)) {
			// Ollama's report of a failure after the stream started (a
			// runner that crashed): it carries no code, and the request
			// was checked before the stream began, so it is the
			// endpoint's, as a 5xx error event is on SSE.
			c.errCode.Store(http.StatusInternalServerError)
			return
		}
		if done && tk.found {
			c.outTokens.Store(int32(tk.got)) // its eval_count (see tokens)
		}
		if lineLen == 0 || lineLen == 1 && line[0] == '\r' || done {
			return // a blank line or the last object: no token
		}
		c.count(clock)
		return
	}
	if c.inErr || whole && errorValue(line, c.errEvent || c.failedEv) >= 0 {
		code := 0
		switch {
		case c.inErr && c.failedEv:
			code, c.inErr = c.errScan.failedCode(), false
		case c.inErr:
			code, c.inErr = c.errScan.code(), false
		case c.failedEv:
			code = failedLineCode(line) // short, but read alike
		default:
			code = errorCode(line, c.errEvent) // short, but read alike
		}
		if code > 0 {
			c.errCode.Store(int32(code))
		}
		return // no token
	}
	if lineLen == 0 || lineLen == 1 && line[0] == '\r' {
		c.counted, c.notToken, c.errEvent, c.failedEv = false, false, false, false // a blank line ends the event
		c.tk.kind = tkNone
		return
	}
	if typ, ok := bytes.CutPrefix(line, []byte("event:")); ok {
		typ = bytes.TrimPrefix(typ, []byte(" "))
		c.notToken = notToken(typ, whole, c.end[len(c.end)-min(lineLen, len(c.end)):])
		switch c.tk.kind = tkNone; {
		case eventIs(line, lineLen, c.end[:], "message_delta"):
			c.tk.kind = tkMessages
		case eventIs(line, lineLen, c.end[:], "response.completed"), eventIs(line, lineLen, c.end[:], "response.incomplete"):
			c.tk.kind = tkResponses
		}
		c.errEvent = whole && string(bytes.TrimSuffix(typ, []byte("\r"))) == "error"
		if c.failedEv = failedEvent(line, lineLen, c.end[:]); c.failedEv {
			// The Responses API's end of a response that failed after
			// its stream began: the endpoint's failure, unless the
			// failed response's error, on the data line to come, says
			// otherwise (errScan.failedCode).
			c.errCode.Store(http.StatusInternalServerError)
		}
		return
	}
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || c.counted || c.notToken {
		return
	}
	if whole {
		v = bytes.TrimSuffix(bytes.TrimPrefix(v, []byte(" ")), []byte("\r"))
		if len(v) == 0 || string(v) == "[DONE]" {
			return // no chunk: the event counts at a data line that has one
		}
	}
	c.counted = true
	if chunk == chEmpty || chunk == chRole || chunk == chNoDelta {
		return // a chunk with no token: the event is read, not counted
	}
	c.count(clock)
	return false
}

// count counts a token event that ends in the current Read.
func (c *sseState) count(clock balancer.Clock) {
	if c.readNs == 0 {
		c.readNs = clock.Now().UnixNano() // once a Read
	}
	if c.events.Add(1) == 1 {
		c.firstNs.Store(c.readNs)
	}
	c.waitLast.Store(c.waitNs)
	c.lastNs.Store(c.readNs)
}

// Where a line is in an OpenAI-style chunk's choices (sseState.chPh).
// chEmpty, chRole and chNoDelta, reached, say the chunk carries no token.
const (
	chSeek    = iota // looking for the line's first '[', the choices' own
	chOpen           // after "choices":[
	chChoice         // in the first choice, looking for its delta's '{'
	chDelta          // in the delta object, keeping its bytes (chBuf)
	chDone           // the line is a token's, or not a chunk: not read further
	chEmpty          // "choices":[]: the usage chunk of include_usage
	chRole           // the stream's opening role chunk (see roleOnly)
	chNoDelta        // "delta":{}: the finish chunk of OpenAI, SGLang, llama.cpp
)

// choices follows seg, the next bytes of a line whose first before bytes
// came earlier, for the OpenAI-style chunks that carry no token (see
// scan): the usage chunk, whose choices are empty, the role chunk that
// opens the stream, whose delta holds the role and no text, and the finish
// chunk whose delta is empty ({}). It reads only
// the line's first '[' and what follows it up to the first choice's delta:
// in every server's chunks the keys before "choices" (id, object,
// created, model, or none) hold strings and numbers, so the first '[' is
// the choices' unless a string holds one, and then it is not preceded by
// the key; and a '"' in a string is escaped, so the key's bytes are the
// key. Any JSON white space may stand between a key's colon and its
// value: a space, or the line break of an event whose JSON is over
// several data lines (see opens), broken after the colon. Servers send a choice's role chunk before its first token (vLLM,
// SGLang, llama.cpp and OpenAI each with the first token); with n > 1,
// SGLang sends choice 1's when its first output comes, after choice 0's
// first token. So a role-only delta after the first token is no token
// either, unless the stream's token deltas give the role too (roleTok):
// TGI repeats the role in every delta, and its delta with the role and no
// text may be the end of the generation, a token step. What it does not
// place (another order of keys, a delta longer than chBuf) is a token, as
// every chunk was.
func (c *sseState) choices(seg []byte, before int) {
	for i := 0; i < len(seg); i++ {
		switch c.chPh {
		case chSeek:
			if !c.seekAfter(seg, &i, before, '[', `"choices":`, chOpen) {
				return
			}
		case chOpen:
			switch seg[i] {
			case ' ', '\t', '\r', '\n':
			case ']':
				c.chPh = chEmpty
				c.usage(seg[i+1:])
				return
			case '{':
				c.chPh = chChoice
			default:
				c.chPh = chDone
			}
		case chChoice:
			if !c.seekAfter(seg, &i, before, '{', `"delta":`, chDelta) {
				return
			}
		case chDelta:
			rest := seg[i:]
			j := bytes.IndexByte(rest, '}')
			if j >= 0 {
				rest = rest[:j]
			}
			long := len(rest) > len(c.chBuf)-int(c.chLen) // longer than a delta with no text
			c.chLen += uint8(copy(c.chBuf[c.chLen:], rest))
			if j < 0 && !long {
				return
			}
			c.chPh = chDone
			switch m := c.chBuf[:c.chLen]; {
			case long:
			case skipWS(m, 0) == len(m):
				c.chPh = chNoDelta
				return
			case roleOnly(m) && (c.events.Load() == 0 || !c.roleTok):
				c.chPh = chRole
				return
			}
			// A token's delta: one that gives the role (TGI's, which
			// repeat it in every delta) says the role-only deltas to
			// come are token steps too.
			if m := c.chBuf[:c.chLen]; bytes.HasPrefix(m[skipWS(m, 0):], []byte(`"role"`)) {
				c.roleTok = true
			}
			return
		default:
			return
		}
	}
}

// usageKey is the member of a usage chunk's usage that counts the output
// tokens; usInNum, usOff and usGot are sseState.usAt in its number, after
// it, and after it with its value in usVal.
const (
	usageKey = `"completion_tokens":`
	usInNum  = uint8(len(usageKey) + 1)
	usOff    = usInNum + 1
	usGot    = usOff + 1
)

// usage follows seg, the next bytes of a usage chunk's line (its choices
// are []: the chunk of stream_options.include_usage), for its
// usage.completion_tokens, the server's own count of the output tokens
// (all choices'), which finish reports in place of the count of token
// events: a server may send several tokens in one chunk (SGLang's
// stream_interval, speculative decoding) or none for some (a tool or
// reasoning parser holding text back). Only this chunk is read, once a
// stream, a byte at a time. The key matches as written (no server escapes
// it; an escaped quote in a string does not match), and the value counts
// only as a plain JSON integer below 2^31 followed by a delimiter:
// anything else (null, a fraction, a line cut short) leaves the estimate.
// It is stored when the chunk's event ends (endLine: its data line's end,
// or its blank line when its JSON is over several data lines), as a token
// event counts then: a stream cut inside the usage chunk (the connection
// dropped, or the caller closed the body) ends with no event there, and
// so with no count from it, whatever its reads' sizes, as an Ollama
// stream's cut last line (see tokens). Every server ends its events'
// lines, so a whole stream reads as before.
// No other key ends in "completion_tokens" (completion_tokens_details
// does not match at its quote), and the '"' that starts a mismatch may
// start the key: the key has no other quote before its last.
func (c *sseState) usage(seg []byte) {
	for _, b := range seg {
		switch k := int(c.usAt); {
		case k < len(usageKey):
			switch {
			case b == usageKey[k]:
				c.usAt++
			case b == '"':
				c.usAt = 1
			default:
				c.usAt = 0
			}
		case k == len(usageKey): // after the colon
			switch {
			case b == ' ' || b == '\t' || b == '\r' || b == '\n': // '\n': data lines' join
			case b >= '0' && b <= '9':
				c.usAt, c.usVal = usInNum, uint32(b-'0')
			default:
				c.usAt = usOff
			}
		case k == int(usInNum):
			if b >= '0' && b <= '9' {
				v := uint64(c.usVal)*10 + uint64(b-'0')
				c.usVal = uint32(v)
				if v > 1<<31-1 {
					c.usAt = usOff
				}
				continue
			}
			c.usAt = usOff
			if b == ',' || b == '}' || b == ' ' || b == '\t' || b == '\r' || b == '\n' {
				c.usAt = usGot // stored when the event ends (endLine)
			}
		default:
			return
		}
	}
}

// seekAfter moves *i to the next open byte of seg and sets the phase to
// next when the line's bytes before it are key and JSON white space (none,
// a space, or the line break that joins data lines: see opens), else to
// chDone; false when seg holds no open byte.
func (c *sseState) seekAfter(seg []byte, i *int, before int, open byte, key string, next uint8) bool {
	j := bytes.IndexByte(seg[*i:], open)
	if j < 0 {
		return false
	}
	*i += j
	c.chPh = chDone
	if c.keyBefore(seg, *i, before, key) {
		c.chPh = next
	}
	return true
}

// keyBefore reports whether the bytes of the current line before seg[i]
// are key and then JSON white space, when the line had before bytes
// before seg (whose last ones are in end: see scan, which adds seg to end
// after this). White space longer than end holds does not match.
func (c *sseState) keyBefore(seg []byte, i, before int, key string) bool {
	k := 1 // how far back from seg[i]
	for {
		b, ok := c.byteBack(seg, i, before, k)
		if !ok {
			return false
		}
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			break
		}
		k++
	}
	for j := len(key) - 1; j >= 0; j, k = j-1, k+1 {
		if b, ok := c.byteBack(seg, i, before, k); !ok || b != key[j] {
			return false
		}
	}
	return true
}

// byteBack is the byte of the current line k bytes before seg[i] (see
// keyBefore); false when not kept.
func (c *sseState) byteBack(seg []byte, i, before, k int) (byte, bool) {
	if k <= i {
		return seg[i-k], true
	}
	k -= i // bytes before seg
	if k > before || k > len(c.end) {
		return 0, false
	}
	return c.end[len(c.end)-k], true
}

// roleOnly reports whether m, the members of a delta object (its bytes
// between the braces), give a role and no text: "role" a string, every
// other member null, "" or [] (vLLM's {"role":"assistant","content":""},
// OpenAI's with "refusal":null, llama.cpp's with "content":null). Keys and
// the role are read as written: a server writes no escape in them.
func roleOnly(m []byte) bool {
	role := false
	for i := 0; ; {
		i = skipWS(m, i)
		if i >= len(m) || m[i] != '"' {
			return false
		}
		j := bytes.IndexByte(m[i+1:], '"')
		if j < 0 {
			return false
		}
		key := m[i+1 : i+1+j]
		i = skipWS(m, i+j+2)
		if i >= len(m) || m[i] != ':' {
			return false
		}
		i = skipWS(m, i+1)
		v := m[i:]
		switch {
		case string(key) == "role" && len(v) > 0 && v[0] == '"':
			k := bytes.IndexByte(v[1:], '"')
			if k < 0 || bytes.IndexByte(v[1:k+1], '\\') >= 0 {
				return false
			}
			role, i = true, i+k+2
		case bytes.HasPrefix(v, []byte("null")):
			i += len("null")
		case bytes.HasPrefix(v, []byte(`""`)), bytes.HasPrefix(v, []byte("[]")):
			i += 2
		default:
			return false // text, a tool call, or what is not read
		}
		i = skipWS(m, i)
		if i == len(m) {
			return role
		}
		if m[i] != ',' {
			return false
		}
		i++
	}
}

// skipWS returns the index of the first byte of b from i that is not
// JSON white space.
func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// What tokenScan.kind reads for the server's count of the output tokens:
// nothing, the Messages API's message_delta event's usage.output_tokens,
// the Responses API's response.completed (or response.incomplete) event's
// response.usage.output_tokens, or the eval_count of an NDJSON stream's
// last object (Ollama's).
const (
	tkNone = iota
	tkMessages
	tkResponses
	tkOllama
)

// tokenPaths are the keys, object by object from the line's own, of the
// member tokenScan reads for each kind.
var tokenPaths = [...]struct {
	n    uint8
	keys [3]string
}{
	tkMessages:  {2, [3]string{"usage", "output_tokens"}},
	tkResponses: {3, [3]string{"response", "usage", "output_tokens"}},
	tkOllama:    {1, [3]string{"eval_count"}},
}

// tokenScan is where tokens is in the current line's JSON.
type tokenScan struct {
	kind  uint8 // the current event's kind (tkNone: not read); NDJSON lines are tkOllama
	depth uint8 // objects and arrays open
	path  uint8 // objects of the path open (the line's own not counted)
	keyAt uint8 // how much of the path's next key the current string has matched (keyNo: none)
	ph    uint8 // tkKey, tkColon, tkNum: after the key, after its colon, in its number
	inStr bool
	esc   bool
	found bool   // got is the member's value, stored when the event ends (see tokens)
	val   uint32 // the number's value so far
	got   uint32 // the last value read whole
}

// keyNo is tokenScan.keyAt for a string that is not the key.
const keyNo = 0xff

// Where tokenScan is after a key of its path (tokenScan.ph; 0: elsewhere).
const (
	tkKey   = 1 + iota // after the key's closing quote
	tkColon            // after its colon
	tkNum              // in its number
)

// tokens follows seg, the next bytes of a line, for the server's count of
// the output tokens (see tokenPaths), which finish reports in place of
// the count of token events, as it does a usage chunk's (see usage): the
// data line of a message_delta event (vLLM's and Anthropic's {"type":
// "message_delta", "delta": {...}, "usage": {"output_tokens": N}}, N the
// whole message's), of a response.completed or response.incomplete
// event ({"type": "response.completed", "response": {..., "usage":
// {"output_tokens": N, ...}}}, after the whole output), and the last
// object of an Ollama stream ({..., "done": true, ..., "eval_count": N}).
// The line's JSON is followed as JSON: a member counts only at its place
// (not in the text or a tool call's arguments of the output the response
// carries, not in usage's own objects, such as Anthropic's iterations),
// keys match as written (no server escapes them), and the value counts
// only as a plain JSON integer below 2^31 followed by a delimiter, as a
// usage chunk's does. A line's bytes before its JSON ("data: ") hold no
// quote or bracket, and pass. The count is stored when its event ends
// (endLine), as usage's is: an SSE event at its data line's end (at its
// blank line when its JSON is over several data lines: see opens), an
// Ollama line at its end if its "done" was true, wherever in the line
// the two members stand. A stream cut inside that line has no count,
// whatever its reads' sizes, as an unended line is no event.
func (c *sseState) tokens(seg []byte) {
	t := &c.tk
	kind := t.kind
	if c.ndjson {
		kind = tkOllama
	}
	p := &tokenPaths[kind]
	for i := 0; i < len(seg); i++ {
		b := seg[i]
		if t.inStr {
			switch {
			case !t.esc && t.keyAt == keyNo && b != '"' && b != '\\':
				// Text, most of a line's bytes: on to its next quote or
				// backslash.
				rest := seg[i:]
				j := bytes.IndexByte(rest, '"')
				if j < 0 {
					j = len(rest)
				}
				if k := bytes.IndexByte(rest[:j], '\\'); k >= 0 {
					j = k
				}
				i += j - 1
			case t.esc:
				t.esc = false
			case b == '\\':
				t.esc, t.keyAt = true, keyNo
			case b == '"':
				t.inStr = false
				if t.keyAt == uint8(len(p.keys[t.path])) {
					t.ph = tkKey
				}
			case t.keyAt != keyNo:
				if k := t.keyAt; int(k) < len(p.keys[t.path]) && p.keys[t.path][k] == b {
					t.keyAt++
				} else {
					t.keyAt = keyNo
				}
			}
			continue
		}
		switch t.ph {
		case tkKey:
			if b == ' ' || b == '\t' || b == '\r' || b == '\n' {
				continue
			}
			if t.ph = 0; b == ':' {
				t.ph = tkColon
				continue
			}
		case tkColon:
			if b == ' ' || b == '\t' || b == '\r' || b == '\n' {
				continue
			}
			t.ph = 0
			switch {
			case t.path+1 < p.n:
				if b == '{' {
					t.path++ // the next object of the path opens below
				}
			case b >= '0' && b <= '9':
				t.ph, t.val = tkNum, uint32(b-'0')
				continue
			}
		case tkNum:
			if b >= '0' && b <= '9' {
				v := uint64(t.val)*10 + uint64(b-'0')
				if t.val = uint32(v); v > 1<<31-1 {
					t.ph = 0 // its other digits pass below
				}
				continue
			}
			t.ph = 0
			if b == ',' || b == '}' || b == ' ' || b == '\t' || b == '\r' || b == '\n' {
				t.found, t.got = true, t.val // endLine stores it (see above)
			}
		}
		switch b {
		case '"':
			t.inStr, t.keyAt = true, keyNo
			if t.depth == t.path+1 {
				t.keyAt = 0 // a key of the path's innermost object, or its value
			}
		case '{', '[':
			t.depth = min(t.depth, 254) + 1
		case '}', ']':
			if t.depth > 0 {
				t.depth--
			}
			if t.depth <= t.path {
				t.path = max(t.depth, 1) - 1 // the path's object closed
			}
		}
	}
}

// eventIs reports whether an event line, whose first bytes are in line
// (at most len(sseState.line)), whose length is lineLen and whose last
// bytes are in end (sseState.end), is "event:", an optional space and
// typ, with an optional CR. typ is at most 24 bytes: the line's start
// and its end together cover it (see failedEvent).
func eventIs(line []byte, lineLen int, end []byte, typ string) bool {
	off := len("event:")
	if len(line) > off && line[off] == ' ' {
		off++
	}
	n, tail := lineLen-off, end
	if bytes.HasSuffix(end, []byte("\r")) {
		n, tail = n-1, end[:len(end)-1]
	}
	if n != len(typ) || len(line) < off {
		return false
	}
	head := line[off:min(len(line), off+n)]
	k := min(len(tail), n)
	return string(head) == typ[:len(head)] && string(tail[len(tail)-k:]) == typ[n-k:]
}

// doneKey is the member of Ollama's last stream object, up to its value.
const doneKey = `"done":`

// matchDone follows seg, the next bytes of an NDJSON line, for the line
// object's own member "done": true (spaces allowed before the value). A
// member of a nested object does not count: a tool call's arguments may
// hold one ({"task": "x", "done": true} of a to-do tool), and that chunk,
// whose own "done" is false, is a token event. The key's only repeated
// byte is its opening quote, and a mismatch inside it is text of a string
// (a key or a value such as "do"), so the scan goes on from there as JSON.
func (c *sseState) matchDone(seg []byte) {
	for _, b := range seg {
		if c.done {
			return
		}
		if k := int(c.doneAt); k > 0 {
			switch {
			case k < len(doneKey) && b == doneKey[k]:
				c.doneAt++
				continue
			case k == len(doneKey) && (b == ' ' || b == '\t'):
				continue
			case k == len(doneKey) && b == 't':
				c.done = true
				continue
			}
			// Up to the key's closing quote the bytes were a string's.
			c.doneAt, c.inStr = 0, k < len(doneKey)-1
		}
		switch {
		case c.inStr:
			switch {
			case c.esc:
				c.esc = false
			case b == '\\':
				c.esc = true
			case b == '"':
				c.inStr = false
			}
		case b == '"' && c.depth == 1:
			c.doneAt = 1
		case b == '"':
			c.inStr = true
		case b == '{' || b == '[':
			c.depth = min(c.depth, 254) + 1
		case (b == '}' || b == ']') && c.depth > 0:
			c.depth--
		}
	}
}

// startErr starts reading an error line whose first len(line) bytes are
// in line.
func (c *sseState) startErr() { c.startErrAt(len(c.line)) }

// startErrAt starts reading an error line whose first n bytes, at most
// len(line), are in line.
func (c *sseState) startErrAt(n int) {
	if c.errScan == nil {
		c.errScan = new(errScan)
	} else {
		*c.errScan = errScan{}
	}
	c.inErr = true
	c.errScan.resp = c.failedEv
	c.errScan.feed(c.line[errorValue(c.line[:n], c.errEvent || c.failedEv):n])
}

// notToken reports whether an event type names an event that carries no
// token (see scan). typ is the start of the type (all of it when whole, then
// perhaps with a "\r"); end is the end of the line.
func notToken(typ []byte, whole bool, end []byte) bool {
	if whole {
		typ = bytes.TrimSuffix(typ, []byte("\r"))
		if string(typ) == "error" || string(typ) == "ping" {
			return true
		}
	}
	delta := bytes.HasSuffix(bytes.TrimSuffix(end, []byte("\r")), []byte("delta"))
	switch {
	case bytes.HasPrefix(typ, []byte("message_")):
		return true // message_start, message_delta (usage), message_stop
	case bytes.HasPrefix(typ, []byte("response.")), bytes.HasPrefix(typ, []byte("content_b")):
		return !delta
	}
	return false
}

// failedType is the Responses API's event type for a response that failed.
const failedType = "response.failed"

// failedEvent reports whether an event line, whose first bytes are in line
// (at most len(sseState.line)), whose length is lineLen and whose last
// bytes are in end (sseState.end), is "event:", an optional space and
// failedType, with an optional CR: the line is longer than line holds, so
// its start and its end are matched, which together cover the type.
func failedEvent(line []byte, lineLen int, end []byte) bool {
	off := len("event:")
	if len(line) > off && line[off] == ' ' {
		off++
	}
	n := lineLen - off
	tail := end
	if bytes.HasSuffix(end, []byte("\r")) {
		n, tail = n-1, end[:len(end)-1]
	}
	return n == len(failedType) && len(line)-off <= n && string(line[off:]) == failedType[:len(line)-off] &&
		bytes.HasSuffix(tail, []byte(".failed"))
}

// finish reports the outcome once. err is the body's read error, or the
// context's error for a Close after cancellation; nil is a clean end.
func (c *call) finish(err error) {
	if c.ends.Or(endReported)&endReported != 0 {
		return
	}
	o := inferlb.Outcome{Overloaded: c.overload > 0, RetryAfter: max(c.overload-1, 0)}
	if c.ends.Load()&endNotServed != 0 {
		o.NotServedModel = c.info.Model // the balancer reads it before the rest
	}
	answered := false // a failure the server itself returned
	if c.ends.Load()&endFailed != 0 {
		if c.sse != nil && c.sse.shed != nil && c.shed() {
			o.Overloaded = true // the server shed it (see shedBody)
		} else {
			o.Err, answered = &StatusError{StatusCode: int(c.status)}, true
		}
	}
	headers := -min(c.overload, 0) // time to the headers, or 0
	if err != nil && o.Err == nil && !o.Overloaded {
		o.Err = err
		ce := c.out.Context().Err()
		if ce == nil && legacyCanceled(&c.out) {
			ce = legacyCause(&c.out)
		}
		if ce != nil {
			o.Err = ce
			// A body is read after its headers: an answer that is no
			// stream had begun, unless its caller gave up before its
			// first byte of a length not announced (noByte); a stream,
			// at its first token.
			if errors.Is(ce, context.DeadlineExceeded) && c.begun() {
				o.Err = ErrDeadlineMidStream
			}
			// A stream its reader gave up on while waiting for its first
			// token, and an answer given up on before its first byte
			// (noByte), had nothing of the answer, whatever the headers
			// said.
			o.Unanswered = c.ends.Load()&endAwaited != 0 && (ce == context.Canceled || ce == errLegacyCanceled)
		}
	}
	if c.sse != nil && o.Err == nil && !o.Overloaded {
		// The server failed the call after the stream started: the
		// status line said 200, the error event says what happened. A
		// 5xx there is the endpoint's failure (vLLM and SGLang send one
		// when generation fails); a 429 an overload answer (TGI takes
		// its queue slot after the stream began), without a hint; other
		// 4xx are about the request: client errors.
		switch code := c.sse.errCode.Load(); {
		case code >= 500:
			o.Err, answered = &StatusError{StatusCode: int(code)}, true
		case code == http.StatusTooManyRequests:
			o.Overloaded = true
		case clientError(int(code)):
			o.ClientError = true
		}
	}
	if c.ends.Load()&endClientError != 0 && o.Err == nil && !o.Overloaded && o.NotServedModel == "" {
		// A 401 of a replica with the wrong key, a 404 of one without
		// the route: neither success nor failure, and no latency (see
		// inferlb.Outcome.ClientError). A body that broke, or an
		// overload the body told of, is what it was.
		o.ClientError = true
	}
	if o.Err == nil || answered {
		// The server answered for the model: a failure it returned may be
		// the model's alone on a server that serves others (see
		// inferlb.Outcome.Model); a broken connection is the endpoint's.
		o.Model = c.info.Model
	}
	o.Tenant = c.info.Tenant // a refusal of the tenant's calls only (inferlb.Outcome.Tenant)
	f := c.t.cfg.onResult
	if f != nil {
		// Otherwise Done measures it, as Elapsed does, a clock read
		// fewer per call.
		o.Latency = c.pick.Elapsed()
	}
	var events int64
	var tbt time.Duration
	scored := o
	if s := c.sse; s != nil {
		if events = s.events.Load(); events > 0 {
			// A first token the reader came for late is no measure of the
			// endpoint: time to first token is unknown, and decode speed too.
			late := s.readerLate(c.start)
			if !late {
				o.TTFT = time.Duration(max(s.firstNs.Load()-c.start, 0))
			}
			o.OutputTokens = int(min(events, 1<<31-1))
			if n := s.outTokens.Load(); n > 0 {
				o.OutputTokens = int(n) // the server's count (see usage)
			}
			if events > 1 {
				tbt = time.Duration((s.lastNs.Load() - s.firstNs.Load()) / (events - 1))
			}
			// The balancer learns decode speed from the time to the last
			// token, not to the body's end: a client that stops reading
			// at the last token (at finish_reason) and closes the body
			// later has had all the endpoint did. A stream the reader
			// paced says nothing of the endpoint's speed.
			scored = o
			scored.Latency = time.Duration(max(s.lastNs.Load()-c.start, 1))
			if late || events > 1 && s.readerPaced() {
				scored.OutputTokens = 0
			}
		}
	}
	if headers > 0 && (o.Err == nil || c.ends.Load()&endAwaited == 0) {
		// Not for an answer given up on before its first byte (noByte):
		// its wait, pick to end, is what the balancer reads.
		scored.Latency = headers
		if c.ends.Load()&endDialed != 0 {
			o.Dialed, scored.Dialed = true, true
		}
	}
	c.pick.Done(scored)
	if s := c.sse; s != nil && s.id != nil && o.Err == nil && !o.Overloaded {
		if id := s.id.id(); id != "" {
			c.t.cfg.chains.remember(c.t.cfg.keyer.Session(id), c.info.AffinityKey, c.pick.Serial())
		}
	}
	if f != nil {
		f(Result{
			Endpoint:          c.pick.ID(),
			Request:           c.info.Request,
			Status:            int(c.status),
			Outcome:           o,
			Events:            int(events),
			TimeBetweenTokens: tbt,
			Resent:            c.ends.Load()&endResent != 0,
		})
	}
}

// begun reports whether the answer had begun when the caller's deadline
// ended the call: a stream's first token came, or the body of another
// answer was not given up on before its first byte (see noByte).
func (c *call) begun() bool {
	if s := c.sse; s != nil && s.counting {
		return s.events.Load() > 0
	}
	return c.ends.Load()&endAwaited == 0
}

// isResponses reports whether path is the Responses API's create call
// (".../responses", with any gateway prefix).
func isResponses(path string) bool {
	path = strings.TrimSuffix(path, "/")
	return strings.HasSuffix(path, "/responses") || path == "responses"
}
