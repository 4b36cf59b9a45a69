package httpbalancer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
)

// reqBody is a request body after the bounded peek: the bytes read ahead
// (head) and, when the body was larger than the peek, the caller's body to
// continue from. The bytes forwarded are always exactly the caller's bytes:
// head, then the rest.
//
// Concurrency: immutable after readBody, except that the caller's body is
// handed to exactly one attempt; getBody's closure only reads head.
type reqBody struct {
	orig     io.ReadCloser // the caller's body; nil or http.NoBody when none
	head     []byte        // bytes read ahead
	complete bool          // head is the whole body; orig is drained and closed
	peeked   bool          // head was read (else orig is forwarded untouched)
	callerGB bool          // gb is the caller's GetBody
	readErr  error         // the caller's body failed during the peek
	length   int64         // ContentLength to send with the first attempt
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
// body; closing it closes the caller's body.
type stitched struct {
	io.Reader
	io.Closer
}

// errReader replays the error the caller's body returned during the peek,
// at the same byte offset, so Base sees the body fail as it would have.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

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

// readBody peeks at up to maxPeek bytes of r's body. When the caller gave no
// GetBody (the body may be a pipe fed by another goroutine), the read is
// bounded by the context: cancellation closes the caller's body, which
// unblocks the read, and readBody returns the context's error. On error the
// body is closed.
//
// peek is t.peeks(r); buf, when not nil, is room for the peek that newCall
// found next to the call state (see peekSize).
func (t *Transport) readBody(ctx context.Context, r *http.Request, rb *reqBody, peek bool, buf []byte) error {
	*rb = reqBody{orig: r.Body, length: r.ContentLength, callerGB: r.GetBody != nil, gb: r.GetBody}
	if !peek {
		return nil
	}
	var stop func() bool
	var closed chan struct{}
	if r.GetBody == nil && ctx.Done() != nil {
		closed = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = r.Body.Close()
			close(closed)
		})
	}
	rb.head, rb.complete, rb.readErr = readHead(r.Body, r.ContentLength, t.cfg.maxPeek, buf)
	if stop != nil && !stop() {
		<-closed // the body was closed under the read; let that finish
		return ctx.Err()
	}
	rb.peeked = true
	if rb.complete {
		_ = r.Body.Close()
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
	return nil
}

// peeks reports whether r's body is read ahead.
func (t *Transport) peeks(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && t.cfg.maxPeek >= 0 && wantsPeek(r.Header)
}

// peekSize is the buffer readHead wants for r's body, read ahead when peek
// is set, when its length is known (else 0).
func (t *Transport) peekSize(r *http.Request, peek bool) int {
	if !peek || r.ContentLength <= 0 || r.ContentLength >= int64(t.cfg.maxPeek) {
		return 0
	}
	return int(r.ContentLength) + 1
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
		if len(buf) == cap(buf) {
			if len(buf) >= size {
				return buf, false, nil
			}
			buf = slices.Grow(buf, min(2*cap(buf), size)-len(buf))
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, true, nil
		}
		if err != nil {
			return buf, false, err
		}
	}
}

// first returns the first attempt's body. br, when not nil, is used to
// replay a buffered body without allocating a reader.
func (rb *reqBody) first(br *bytes.Reader) bodyReader {
	switch {
	case !rb.peeked:
		return bodyReader{rb.orig, rb.length}
	case rb.complete && len(rb.head) == 0:
		return bodyReader{http.NoBody, 0}
	case rb.complete && br != nil:
		br.Reset(rb.head)
		return bodyReader{io.NopCloser(br), rb.length}
	case rb.complete:
		return bodyReader{newBytesBody(rb.head), rb.length}
	case rb.readErr != nil:
		return bodyReader{&stitched{io.MultiReader(bytes.NewReader(rb.head), errReader{rb.readErr}), rb.orig}, rb.length}
	default:
		return bodyReader{&stitched{io.MultiReader(bytes.NewReader(rb.head), rb.orig), rb.orig}, rb.length}
	}
}

// replayable reports whether a second attempt can send the body again.
// A body that failed during the peek is not retried: the caller's failure
// is not the endpoint's.
func (rb *reqBody) replayable() bool {
	if rb.readErr != nil {
		return false
	}
	return rb.orig == nil || rb.orig == http.NoBody || rb.complete || rb.callerGB
}

// again returns a fresh body for a retry.
func (rb *reqBody) again() (bodyReader, bool) {
	switch {
	case rb.orig == nil || rb.orig == http.NoBody:
		return bodyReader{rb.orig, rb.length}, true
	case rb.complete:
		return rb.first(nil), true
	case rb.callerGB:
		b, err := rb.gb()
		if err != nil || b == nil {
			return bodyReader{}, false
		}
		return bodyReader{b, rb.length}, true
	}
	return bodyReader{}, false
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }
