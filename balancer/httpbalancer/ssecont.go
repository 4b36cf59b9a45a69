package httpbalancer

import (
	"bytes"

	"github.com/inferlb/inferlb/balancer"
)

// An event's JSON over several data lines. The SSE framing (WHATWG HTML,
// "Interpreting an event stream") makes an event's data its data lines
// joined with "\n", and SSE libraries frame data that holds line breaks
// so (sse-starlette, axum, and every server that writes indented JSON
// through them): the JSON of one chunk comes over several lines, and
// openai-python's, openai-go's and Anthropic's SDK decoders join them
// back. Read a line at a time, such an event was counted as a token at
// its first line ("data: {"), and the role, finish and usage chunks with
// it, while the usage chunk's completion_tokens, message_delta's and
// response.completed's output_tokens, split from the line that opened the
// object, were never read.
//
// So a data line whose value opens a JSON object and does not end it
// (its last byte other than white space is not '}') leaves the event open
// (cont): the scanners' state (choices, usage, tokens, errScan) is kept,
// and each of the event's next data lines goes on to them from its value,
// as the joined data would: a "\n" for the join (white space in JSON, a
// number's end), the line's "data:" and optional space, and its leading
// white space, skipped (a line break of JSON is never inside a string, so
// a line starts outside one). Other lines (comments, other fields) do not
// reach them. The event is read at its end, its blank line, as the SSE
// framing dispatches it: a token, timed then, unless its chunk carries
// none. Nothing is kept but that fixed state, however long the event.
// A one-line event, the common case, pays a look at its line's last byte.

// What the current line of an open event is (sseState.contPh).
const (
	contUndecided = iota // its first bytes do not show it yet
	contData             // a data line: its value goes on to the scanners
	contOther            // a comment or another field
)

// endsObject reports whether the line whose last bytes end holds ends
// with '}' (or "}\r"): a one-line event's JSON, the common case.
func endsObject(end *[16]byte) bool {
	e := end[len(end)-1]
	if e == '\r' {
		e = end[len(end)-2]
	}
	return e == '}'
}

// opens reports whether the data line that just ended, of an event not
// yet counted, opens a JSON object and leaves it open, and then keeps the
// event open (cont) for its next data lines.
//
//go:noinline
func (c *sseState) opens() bool {
	n := min(c.lineLen, len(c.line))
	off := dataValue(c.line[:n])
	if off < 0 || c.lineLen <= off || c.line[off] != '{' {
		return false
	}
	k := min(c.lineLen-off, len(c.end))
	if e := bytes.TrimRight(c.end[len(c.end)-k:], " \t\r"); len(e) > 0 && e[len(e)-1] == '}' {
		return false
	}
	if !c.inErr && c.lineLen < len(c.line) && errorValue(c.line[:n], c.errEvent || c.failedEv) >= 0 {
		c.startErrAt(n) // scan starts one once a line fills c.line
	}
	c.errAt = 0
	if !c.inErr && c.lineLen <= len(c.line) && skipWS(c.line[:n], off+1) == n {
		// The value is "{" alone, as an indented error object's first
		// line is ({\n  "error": {...}\n}): its first key, on the next
		// data line, may make it one (seekErr).
		c.errAt = 1
	}
	c.cont, c.contPh, c.lineLen = true, contUndecided, 0
	return true
}

// scanOpen is scan for the lines of an event whose JSON is open, from p
// on; it returns the bytes after the event's end (none when p ends first).
func (c *sseState) scanOpen(p []byte, clock balancer.Clock) []byte {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if j := bytes.IndexByte(seg, '\r'); j >= 0 && j < len(seg)-1 {
			seg, i = seg[:j+1], j // a bare CR ends the line
		}
		c.contLine(seg)
		if i < 0 {
			c.crEnd = seg[len(seg)-1] == '\r'
			return nil
		}
		p = p[i+1:]
		if !c.goesOn(clock) {
			c.endLine(clock) // the line that ends the event
			return p
		}
	}
	return p
}

// endAny ends the current line, of an open event or not.
func (c *sseState) endAny(clock balancer.Clock) {
	if !c.cont || !c.goesOn(clock) {
		c.endLine(clock)
	}
}

// contLine follows seg, the next bytes of a line of an open event.
func (c *sseState) contLine(seg []byte) {
	before := c.lineLen
	if before < len(c.line) {
		copy(c.line[before:], seg)
	}
	c.lineLen += len(seg)
	switch c.contPh {
	case contData:
		c.contFeed(seg)
	case contOther:
	case contUndecided:
		if c.lineLen < len("data: ") {
			return // a short line is read at its end (goesOn)
		}
		off := dataValue(c.line[:min(c.lineLen, len(c.line))])
		if off < 0 {
			c.contPh = contOther
			return
		}
		c.contPh, c.contLead = contData, true
		if off < before {
			c.contFeed(c.line[off:before])
			off = before
		}
		c.contFeed(seg[off-before:])
	}
}

// lf is the byte that joins an event's data lines.
var lf = []byte{'\n'}

// contFeed gives the scanners b, the next bytes of a data line's value in
// an open event.
func (c *sseState) contFeed(b []byte) {
	if c.contLead {
		b = b[skipWS(b, 0):]
		if len(b) == 0 {
			return
		}
		c.contLead = false
		c.follow(lf)
	}
	c.follow(b)
}

// follow gives the scanners b, the next bytes of an open event's JSON;
// the bytes before b in end, as scan keeps them for a line.
func (c *sseState) follow(b []byte) {
	if c.inErr {
		c.errScan.feed(b)
	} else if c.errAt > 0 {
		c.seekErr(b)
	}
	if c.chPh < chDone && !c.notToken {
		c.choices(b, len(c.end))
	} else if c.chPh == chEmpty && c.usAt < usOff {
		c.usage(b)
	}
	c.keepEnd(b)
	if c.tk.kind != tkNone {
		c.tokens(b)
	}
}

// errKey is how an error object opens ({"error", see errorJSON); with
// the event's JSON open at "{", sseState.errAt is how much of it the
// joined data lines have shown.
const errKey = `{"error"`

// seekErr follows b, the next bytes of an open event whose JSON so far is
// "{" and white space, for the error object's first key: matched, the
// event is read as an error line is (inErr), from its "{" on.
func (c *sseState) seekErr(b []byte) {
	for i, x := range b {
		k := int(c.errAt)
		switch {
		case k == 1 && (x == ' ' || x == '\t' || x == '\r' || x == '\n'):
			continue
		case x != errKey[k]:
			c.errAt = 0
			return
		}
		if c.errAt++; int(c.errAt) == len(errKey) {
			c.errAt = 0
			if c.errScan == nil {
				c.errScan = new(errScan)
			} else {
				*c.errScan = errScan{}
			}
			c.inErr = true
			c.errScan.resp = c.failedEv
			c.errScan.feed([]byte(errKey))
			c.errScan.feed(b[i+1:])
			return
		}
	}
}

// goesOn reports whether the line that just ended leaves its open event
// open: every line but the blank one that ends the event, which is then
// read as a one-line event is at its data line's end (counted or not,
// its error's code kept), before endLine ends it.
func (c *sseState) goesOn(clock balancer.Clock) bool {
	blank := c.lineLen == 0 || c.lineLen == 1 && c.line[0] == '\r'
	c.contPh, c.contLead = contUndecided, false
	if !blank {
		c.lineLen = 0
		return true
	}
	c.cont, c.errAt = false, 0
	chunk := c.chPh
	switch {
	case c.inErr:
		code := 0
		if c.failedEv {
			code = c.errScan.failedCode()
		} else {
			code = c.errScan.code()
		}
		if c.inErr = false; code > 0 {
			c.errCode.Store(int32(code))
		}
	case c.counted || c.notToken:
	case chunk == chEmpty || chunk == chRole || chunk == chNoDelta:
		c.counted = true // a chunk with no token
	default:
		c.counted = true
		c.count(clock)
	}
	return false
}

// keepEnd keeps the last bytes of the line, of which b are the next, in
// end.
func (c *sseState) keepEnd(b []byte) {
	if len(b) >= len(c.end) {
		copy(c.end[:], b[len(b)-len(c.end):])
	} else {
		n := copy(c.end[:], c.end[len(b):])
		copy(c.end[n:], b)
	}
}
