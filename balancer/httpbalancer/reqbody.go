package httpbalancer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// reqBody is a request body after the bounded peek: the bytes read ahead
// (head) and, when the body was larger than the peek, the caller's body to
// continue from. The bytes forwarded are always exactly the caller's bytes:
// head, then the rest; or, for a body held in memory (inPlace), the
// caller's body itself, of which head is a copy.
//
// Concurrency: one RoundTrip's, on its stack. Immutable after readBody,
// except that release drops a pooled head and the caller's body is handed
// to exactly one attempt; gb's closure only reads head, and is only made
// when head is not pooled.
type reqBody struct {
	orig     io.ReadCloser // the caller's body; nil or http.NoBody when none
	head     []byte        // bytes read ahead
	complete bool          // head is the whole body (orig is drained and closed unless inPlace)
	peeked   bool          // head was read (else orig is forwarded untouched)
	inPlace  bool          // head was copied from orig without reading it: orig goes first
	pooled   *peekBuf      // head's buffer, to return to peekBufs once inspected
	callerGB bool          // gb is the caller's GetBody
	// reopened: orig is a fresh copy of the whole body from the caller's
	// GetBody (see reopen), sent from its start; also is the caller's body,
	// closed when orig is.
	reopened bool
	also     io.Closer
	length   int64 // ContentLength to send with the first attempt
	// size is the body's length when the peek knows it (the body was read
	// whole, or is in memory), else -1.
	size int64
	// gb is the outgoing GetBody, built once: Base uses it to resend on a
	// fresh connection when a reused one was closed under it.
	gb func() (io.ReadCloser, error)
}

// bodyReader is one attempt's body and its ContentLength.
type bodyReader struct {
	rc     io.ReadCloser
	length int64
}

func closeBody(b bodyReader) {
	if b.rc != nil {
		_ = b.rc.Close()
	}
}

// newBytesBody replays head. It must stay io.NopCloser over *bytes.Reader:
// net/http recognizes that pair as in memory and writes headers and body in
// one flush; an unknown reader type costs a separate flush of the headers,
// which measured 30 us per call on loopback.
func newBytesBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

// stitched forwards the head read ahead and then the rest of the caller's
// body; closing it closes the caller's body. It notes whether the caller's
// body failed while Base read it, so that a send that broke on the
// caller's own body is not blamed on the endpoint.
//
// Concurrency: Base reads it from one goroutine at a time, possibly not
// RoundTrip's; failed is read by RoundTrip after Base returns.
type stitched struct {
	head   bytes.Reader
	orig   io.ReadCloser
	also   io.Closer   // closed after orig when not nil (see reopen)
	failed atomic.Bool // the caller's body returned an error other than EOF
	// How many bytes of the caller's body were read past the head, and
	// whether its end was: enough to tell a body longer or shorter than
	// the ContentLength it was sent with (see wrongLength).
	read atomic.Int64
	eof  atomic.Bool
}

func (s *stitched) Read(p []byte) (int, error) {
	if s.head.Len() > 0 {
		return s.head.Read(p)
	}
	n, err := s.orig.Read(p)
	s.read.Add(int64(n))
	switch {
	case err == io.EOF:
		s.eof.Store(true)
	case err != nil:
		s.failed.Store(true)
	}
	return n, err
}

// wrongLength reports whether body, sent with ContentLength length, is
// known to be longer or shorter than that: a request net/http refuses
// ("http: ContentLength=... with Body length ..."), on every endpoint
// alike. It runs only after Base failed.
func (rb *reqBody) wrongLength(body bodyReader, length int64) bool {
	if length <= 0 {
		return false // unknown, or none: sent as it comes
	}
	if s, ok := body.rc.(*stitched); ok {
		n := int64(s.head.Size()) + s.read.Load()
		return n > length || s.eof.Load() && n != length
	}
	// Any other body is the bytes the peek measured: the head, the
	// caller's body in memory, or a GetBody copy of it.
	return rb.size >= 0 && rb.size != length
}

func (s *stitched) Close() error {
	err := s.orig.Close()
	if s.also != nil {
		_ = s.also.Close()
	}
	return err
}

// errBodyFailed is the Outcome.Err of an attempt that failed because the
// caller's body did while it was being sent. It wraps context.Canceled,
// which the balancer reads as saying nothing about the endpoint's health:
// a gateway whose clients drop their uploads must not trip the breakers of
// healthy backends.
var errBodyFailed = fmt.Errorf("inferlb: the request body failed while it was sent: %w", context.Canceled)

// wantsPeek reports whether a body is worth reading ahead: JSON or untyped.
// A multipart upload or binary payload is streamed through untouched.
func wantsPeek(h http.Header) bool {
	ct := h["Content-Type"]
	return len(ct) == 0 || ct[0] == "application/json" || hasJSON(ct[0])
}

// hasJSON reports whether s contains "json" in any case, without the copy
// strings.ToLower makes of a string with capitals.
func hasJSON(s string) bool {
	for i := 0; i+4 <= len(s); i++ {
		if s[i]|0x20 == 'j' && s[i+1]|0x20 == 's' && s[i+2]|0x20 == 'o' && s[i+3]|0x20 == 'n' {
			return true
		}
	}
	return false
}

// readBody peeks at up to maxPeek bytes of r's body: a copy for a body held
// in memory (see copyHead), else a read. The read is bounded by the
// context (the body may be a pipe fed by another goroutine): cancellation
// closes the caller's body, which unblocks the read, and readBody returns
// the context's cause (context.Cause: its error, or the caller's reason). When the caller's body fails, readBody returns its
// error: nothing is sent, and no endpoint is blamed for it. On error the
// body is closed.
//
// p is the plan from planPeek; buf, when not nil, is room for the peek that
// newCall found next to the call state.
func (t *Transport) readBody(ctx context.Context, r *http.Request, rb *reqBody, p peekPlan, buf []byte) error {
	*rb = reqBody{orig: r.Body, length: r.ContentLength, callerGB: r.GetBody != nil, gb: r.GetBody, size: -1}
	if !p.peek {
		return nil
	}
	if p.mem.ok() {
		t.copyHead(r, rb, p, buf)
		return nil
	}
	var stop func() bool
	var closed chan struct{}
	if ctx.Done() != nil {
		closed = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = r.Body.Close()
			close(closed)
		})
	}
	var err error
	rb.head, rb.complete, err = readHead(r.Body, r.ContentLength, t.cfg.maxPeek, buf)
	if stop != nil && !stop() {
		<-closed                  // the body was closed under the read; let that finish
		return context.Cause(ctx) // the caller's reason, as net/http returns it
	}
	if err != nil {
		_ = r.Body.Close()
		return fmt.Errorf("inferlb: reading the request body: %w", err)
	}
	rb.peeked = true
	if rb.complete {
		_ = r.Body.Close()
		rb.size = int64(len(rb.head))
		rb.completed(r)
	}
	return nil
}

// completed sets up the replays of a body that is all in head.
func (rb *reqBody) completed(r *http.Request) {
	switch head := rb.head; {
	case r.GetBody != nil:
		// The caller's replays the same bytes; keeping it saves a closure.
	case len(head) > 0:
		rb.gb = func() (io.ReadCloser, error) { return newBytesBody(head), nil }
	default:
		rb.gb = noBody
	}
	if r.ContentLength <= 0 && len(r.TransferEncoding) == 0 {
		// Unknown length (0 with a body means unknown to net/http), now
		// known: send it, so the backend needs no chunked decoding.
		rb.length = int64(len(rb.head))
	}
}

// copyHead is the peek of a body held in memory (see memBody): it copies
// the first bytes without reading the body, which then goes to the first
// attempt exactly as the caller made it. No replay reader is needed, and
// none allocated, unless the call fails over.
func (t *Transport) copyHead(r *http.Request, rb *reqBody, p peekPlan, buf []byte) {
	n := p.mem.n
	size := int(min(n, int64(t.cfg.maxPeek)+1)) // one more, as readHead reads
	if p.pool {
		rb.pooled = peekBufs.Get().(*peekBuf)
		buf = rb.pooled[:]
	} else if cap(buf) < size {
		buf = make([]byte, size)
	}
	rb.head = buf[:p.mem.copyTo(buf[:size])]
	rb.complete = n <= int64(t.cfg.maxPeek)
	rb.peeked, rb.inPlace = true, true
	rb.size = n
	if rb.complete {
		rb.completed(r)
	}
}

// peekPlan is what RoundTrip decides about the peek before allocating: to
// read ahead or not, how big a buffer, and whether the body is in memory.
type peekPlan struct {
	peek bool
	pool bool // the peek goes to a buffer from peekBufs
	size int  // buffer wanted with the call state; 0 for none or not known
	mem  memBody
}

// peekBuf holds the peek of a small in-memory body whose caller gave
// GetBody. Nothing needs those bytes once inspection is over: the first
// attempt sends the caller's body, replays come from GetBody, and
// inspectors must not retain the body. So the buffer goes back to
// peekBufs right after Inspect, and the next call finds it warm in the
// cache, where a fresh one would be cold memory to zero.
type peekBuf [4096]byte

var peekBufs = sync.Pool{New: func() any { return new(peekBuf) }}

// release returns a pooled peek buffer; head must not be used after.
func (rb *reqBody) release() {
	if rb.pooled != nil {
		peekBufs.Put(rb.pooled)
		rb.pooled, rb.head = nil, nil
	}
}

func (t *Transport) planPeek(r *http.Request) peekPlan {
	p := peekPlan{peek: t.peeks(r)}
	if !p.peek {
		return p
	}
	if p.mem = inMemory(r.Body); p.mem.ok() {
		p.size = int(min(p.mem.n, int64(t.cfg.maxPeek)+1))
		if r.GetBody != nil && p.size <= len(peekBuf{}) {
			p.pool, p.size = true, 0
		}
		return p
	}
	if r.ContentLength > 0 && r.ContentLength < int64(t.cfg.maxPeek) {
		p.size = int(r.ContentLength) + 1 // +1 to see EOF, see readHead
	}
	return p
}

// memBody is the reader inside an io.NopCloser over a *bytes.Reader,
// *strings.Reader or *bytes.Buffer: the body http.NewRequest makes of those
// (net/http itself looks inside io.NopCloser the same way to tell in-memory
// bodies). Its unread bytes can be copied without reading it.
type memBody struct {
	br *bytes.Reader
	sr *strings.Reader
	bb *bytes.Buffer
	n  int64 // unread bytes
}

var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(struct{ io.Reader }{}))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(struct {
		io.Reader
		io.WriterTo
	}{}))
)

func inMemory(body io.ReadCloser) memBody {
	if t := reflect.TypeOf(body); t != nopCloserWriterToType && t != nopCloserType {
		return memBody{}
	}
	switch v := reflect.ValueOf(body).Field(0).Interface().(type) {
	case *bytes.Reader:
		return memBody{br: v, n: int64(v.Len())}
	case *strings.Reader:
		return memBody{sr: v, n: int64(v.Len())}
	case *bytes.Buffer:
		return memBody{bb: v, n: int64(v.Len())}
	}
	return memBody{}
}

func (m *memBody) ok() bool { return m.br != nil || m.sr != nil || m.bb != nil }

// copyTo copies the first len(dst) unread bytes into dst, leaving the
// reader where it was, and returns how many it copied.
func (m *memBody) copyTo(dst []byte) int { return m.readAt(dst, 0) }

// readAt copies the unread bytes from off (0 is the first unread byte) into
// dst, leaving the reader where it was, and returns how many it copied.
func (m *memBody) readAt(dst []byte, off int64) int {
	if off < 0 || off >= m.n {
		return 0
	}
	switch {
	case m.br != nil:
		n, _ := m.br.ReadAt(dst, m.br.Size()-m.n+off)
		return n
	case m.sr != nil:
		n, _ := m.sr.ReadAt(dst, m.sr.Size()-m.n+off)
		return n
	case m.bb != nil:
		return copy(dst, m.bb.Bytes()[off:])
	}
	return 0
}

// begins reports whether m could hold a body of the given length (0 or
// less: unknown) that starts with head.
func (m *memBody) begins(head []byte, length int64) bool {
	if length > 0 && m.n != length || m.n < int64(len(head)) {
		return false
	}
	var chunk [4096]byte
	for off := 0; off < len(head); {
		n := m.readAt(chunk[:min(len(chunk), len(head)-off)], int64(off))
		if n == 0 || !bytes.Equal(chunk[:n], head[off:off+n]) {
			return false
		}
		off += n
	}
	return true
}

// peeks reports whether r's body is read ahead.
func (t *Transport) peeks(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && t.cfg.maxPeek >= 0 && wantsPeek(r.Header)
}

// readHead reads up to limit+1 bytes (one more than the limit tells "larger
// than the limit" from "exactly the limit"). complete means EOF was reached.
// It reads into buf when buf has room for a body of contentLength.
func readHead(body io.Reader, contentLength int64, limit int, buf []byte) (head []byte, complete bool, err error) {
	size := limit + 1
	if contentLength > 0 && contentLength < int64(limit) {
		size = int(contentLength) + 1 // +1 to see EOF without a second buffer
	}
	if n := min(size, 32<<10); cap(buf) >= n {
		buf = buf[:0:n] // read no further than a buffer of its own would
	} else {
		buf = make([]byte, 0, n)
	}
	for {
		if len(buf) >= size {
			return buf, false, nil
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(2*cap(buf), size)-len(buf))
		}
		// Never past size: Grow may round the capacity up.
		n, err := body.Read(buf[len(buf):min(cap(buf), size)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, true, nil
		}
		if err != nil {
			return buf, false, err
		}
	}
}

// reopen is for a body larger than the peek that was read ahead (not held
// in memory) and that the caller can replay: it takes a fresh copy of the
// whole body from the caller's GetBody, which the first attempt then sends
// from its start instead of the bytes read ahead and the rest. The copy is
// usually in memory (an SDK's marshalled request), so the inspector can
// read past the peek without reading it (readTail): the model, stream flag
// and output bound that openai-go writes after the messages. A GetBody may
// rewind the very reader the caller's body reads from (openai-go's does
// for a *bytes.Reader body), so the caller's body is not read again, and is
// closed only when the copy is. It returns the copy, or nil when GetBody
// fails or gives other bytes than the body (the body then goes as it
// would have).
//
// GetBody must give a copy of Body, as net/http already assumes when it
// resends a body; a caller that replaced Body after http.NewRequest (a
// middleware rewriting the request) may have left the old GetBody. A copy
// in memory whose length is not the body's or whose start is not what the
// peek read is such a stale one, and is not sent: it cannot be the body's
// own reader rewound. (One that differs only past the peek, at the same
// length, cannot be told apart without reading the whole body.)
func (rb *reqBody) reopen(getBody func() (io.ReadCloser, error)) io.ReadCloser {
	rc, err := getBody()
	if err != nil || rc == nil {
		return nil
	}
	if m := inMemory(rc); m.ok() && !m.begins(rb.head, rb.length) {
		_ = rc.Close()
		return nil
	}
	rb.also, rb.orig, rb.reopened = rb.orig, rc, true
	return rc
}

// first returns the first attempt's body.
func (rb *reqBody) first() bodyReader {
	switch {
	case rb.reopened:
		return bodyReader{&stitched{orig: rb.orig, also: rb.also}, rb.length}
	case !rb.peeked || rb.inPlace:
		return bodyReader{rb.orig, rb.length}
	case rb.complete && len(rb.head) == 0:
		return bodyReader{http.NoBody, 0}
	case rb.complete:
		return bodyReader{newBytesBody(rb.head), rb.length}
	default:
		s := &stitched{orig: rb.orig}
		s.head.Reset(rb.head)
		return bodyReader{s, rb.length}
	}
}

// replayable reports whether a second attempt can send the body again.
func (rb *reqBody) replayable() bool {
	return rb.orig == nil || rb.orig == http.NoBody || rb.complete || rb.callerGB
}

// again returns a fresh body for a retry.
func (rb *reqBody) again() (bodyReader, bool) {
	// An in-memory body with GetBody is replayed by GetBody: its peek's
	// buffer may be back in its pool.
	fromHead := rb.complete && !(rb.inPlace && rb.callerGB)
	switch {
	case rb.orig == nil || rb.orig == http.NoBody:
		return bodyReader{rb.orig, rb.length}, true
	case fromHead && len(rb.head) == 0:
		return bodyReader{http.NoBody, 0}, true
	case fromHead:
		return bodyReader{newBytesBody(rb.head), rb.length}, true
	case rb.callerGB:
		b, err := rb.gb()
		if err != nil || b == nil {
			return bodyReader{}, false
		}
		if m := inMemory(b); m.ok() {
			// A copy in memory of another length or start than the
			// body's comes from a GetBody left over from before Body
			// was replaced (see reopen): it is not the call's body.
			if !m.begins(rb.head, rb.length) {
				_ = b.Close()
				return bodyReader{}, false
			}
			return bodyReader{b, rb.length}, true
		}
		// Counted as it is sent, as the first attempt's body is: a copy
		// that fails, or is not of the body's length, is the caller's
		// doing, and the endpoint it went to is not blamed for it.
		return bodyReader{&stitched{orig: b}, rb.length}, true
	}
	return bodyReader{}, false
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }
