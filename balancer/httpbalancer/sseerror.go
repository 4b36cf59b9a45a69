package httpbalancer

import (
	"bytes"
	"net/http"
	"sync/atomic"

	"github.com/inferlb/inferlb/internal/shed"
)

// Reading the code of an error event. vLLM and SGLang end a failed
// generation with data: {"error": {"object": "error", "message": ...,
// "type": ..., "param": ..., "code": 500}}: the code comes after the
// message, which can be a Python traceback or a validation message of many
// KiB. Keeping the line to read it later would cost memory in proportion to
// the message; errScan reads it as it streams by instead, in a fixed amount
// of state whatever the line's length or nesting, and only lines that start
// an error object pay for it (see sseState.scan).
//
// TGI sends no code. Its native streams (/generate_stream) end a failure
// with data: {"error": "Model is overloaded", "error_type": "overloaded"};
// its OpenAI-compatible ones with data: {"error": {"message": "Model is
// overloaded", "http_status_code": 422}}, 422 whatever went wrong. TGI
// checks the request, and takes a slot in its queue, only after the stream
// began, so an overloaded or failing TGI answers 200 streams that end at
// once: read as successes, they made the busiest replica look the fastest.
// Its error type, else its message, whose first words are TGI's fixed
// text for each kind of error, says which it is (see kindStatus and
// textStatus).
//
// SGLang sheds load (--max-queued-requests) with a 503 error event on a
// 200 stream, "The request queue is full.": its text makes it an overload
// answer, not a failure (see textStatus).

// errScan finds the status code of an error event: the "code" member of
// the top-level "error" object, or, when that has none that is a status,
// of the top-level object (some servers put it there). Only members of
// those two objects count: a "code" in the message text, or in an object
// nested deeper ("param": {"code": 500}), does not. A repeated key
// overrides, as in encoding/json, and keys are compared decoded, as
// encoding/json reads them, so on a well-formed line errScan agrees with
// decoding the line (FuzzSSEScan holds it to that). A code is an integer
// status (100 to 599); a string, a fraction or null is none. Without one,
// the kind of error gives the status: TGI's top-level "error_type", else
// the error object's "type" (the Messages API's), else a string "code" of
// the error object, else of the top-level object (the Responses API's
// error event and failed response: see codeStatus), else the error's text
// (the error object's "message", or the error itself when it is a
// string). A text that says the server shed the call makes a 5xx code a
// 429.
//
// Like the request body scanner it is tolerant, not a validator: it stops
// at the first byte it cannot place and keeps what it found before. It
// never recurses (nesting it does not read is a counter) and looks at each
// byte a bounded number of times; string contents, most of an error line,
// are skipped with bytes.IndexByte.
//
// Concurrency: an errScan belongs to its sseState (one Read at a time).
type errScan struct {
	// resp: the line is a Responses API response.failed event's data,
	// {"type": "response.failed", "response": {..., "error": {"code":
	// ..., "message": ...}}}: only its "response" object is read, as if
	// it were the top-level object (inResp once it is entered), and it
	// ends the reading. See failedCode.
	resp, inResp bool
	// named: the error object has a string "code" that is not empty
	// (a failed response's error names what went wrong).
	named  bool
	depth  int      // nesting inside a value being stepped over (esSkip)
	codes  [2]int16 // the status read for the top-level object and for its error object; 0: none
	n      int16    // the integer being read (esNum), saturating above 999
	ph     uint8
	lvl    uint8 // the object being read: 1, top-level; 2, its "error" object
	key    uint8 // the current member's key: keyOther, keyError or keyCode
	inStr  bool  // in a string that is stepped over
	esc    bool  // the next byte is escaped
	keyLen uint8 // bytes of the key read so far, with its opening quote; len(keyBuf)+1: longer than keyBuf
	// keyBuf is the current key with its quotes: 64 bytes hold
	// "error_type" with every letter escaped (\u0065...), the longest
	// spelling of a key that matters.
	keyBuf [64]byte
	// The status TGI's top-level error_type, the error object's kind
	// (its "type") and the error's text say (kindStatus, textStatus); the
	// error_type wins over the kind.
	typeCode, kindCode, textCode int16
	// The status a string "code" names (codeStatus), of the top-level
	// object and of its error object, as codes.
	strCodes [2]int16
	// A string value being kept (capture: capType, capText, capKind or capCode;
	// capNone when not), its first valLen bytes as written in val: enough for
	// the longest text textStatus reads with every byte escaped.
	capture uint8
	valLen  uint16
	val     [maxText * 6]byte
}

// What a kept string value is (errScan.capture).
const (
	capNone = iota
	capType // the top-level "error_type"
	capText // the error's text
	capKind // the error object's "type"
	capCode // a string "code" of the object being read (m.lvl)
)

// Where errScan is, in the object it reads (lvl).
const (
	esStart  = iota // before the top-level '{'
	esKey           // before a key, a ',' or the '}'
	esInKey         // in a key
	esColon         // after a key
	esValue         // after the colon
	esNum           // in the integer value of "code"
	esScalar        // in another number or literal
	esSkip          // in an object or array value that is stepped over
	esDone          // the top-level object ended, or the line is malformed
)

// The keys that matter.
const (
	keyOther = iota
	keyError
	keyCode
	keyErrorType // TGI's
	keyMessage
	keyType     // the error object's kind (the Messages API's)
	keyResponse // a response.failed event's response (resp)
)

// feed scans b, the next bytes of the line from its '{'.
func (m *errScan) feed(b []byte) {
	for i := 0; i < len(b); {
		if m.inStr {
			i = m.skipStr(b, i)
			continue
		}
		c := b[i]
		switch m.ph {
		case esStart:
			switch c {
			case ' ', '\t', '\r', '\n':
			case '{':
				m.lvl, m.ph = 1, esKey
			default:
				m.ph = esDone
			}
		case esKey:
			switch c {
			case ' ', '\t', '\r', '\n', ',':
			case '"':
				m.keyBuf[0], m.keyLen, m.ph = '"', 1, esInKey
			case '}':
				if m.lvl == 2 {
					m.lvl = 1 // the error object ended: back to the top level
				} else {
					m.ph = esDone // also the end of a failed response (resp)
				}
			default:
				m.ph = esDone
			}
		case esInKey:
			if int(m.keyLen) < len(m.keyBuf) {
				m.keyBuf[m.keyLen] = c
			}
			if int(m.keyLen) <= len(m.keyBuf) {
				m.keyLen++
			}
			switch {
			case m.esc:
				m.esc = false
			case c == '\\':
				m.esc = true
			case c == '"':
				m.key, m.ph = m.keyKind(), esColon
			}
		case esColon:
			switch c {
			case ' ', '\t', '\r', '\n':
			case ':':
				m.ph = esValue
			default:
				m.ph = esDone
			}
		case esValue:
			if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
				break
			}
			// The member's value replaces what an earlier one with its key
			// said.
			keepAs := uint8(capNone)
			if m.key == keyResponse && c == '{' {
				// A failed response: it alone is read (see resp).
				*m = errScan{resp: true, inResp: true, lvl: 1, ph: esKey}
				break
			}
			switch {
			case m.key == keyCode:
				m.codes[m.lvl-1], m.strCodes[m.lvl-1], keepAs = 0, 0, capCode
				if m.lvl == 2 {
					m.named = false
				}
			case m.key == keyError && m.lvl == 1:
				m.codes[1], m.strCodes[1], m.kindCode, m.textCode, keepAs = 0, 0, 0, 0, capText
				m.named = false
			case m.key == keyErrorType && m.lvl == 1:
				m.typeCode, keepAs = 0, capType
			case m.key == keyMessage && m.lvl == 2:
				m.textCode, keepAs = 0, capText
			case m.key == keyType && m.lvl == 2:
				m.kindCode, keepAs = 0, capKind
			}
			switch {
			case c == '{' && m.key == keyError && m.lvl == 1:
				m.lvl, m.ph = 2, esKey
			case c == '{' || c == '[':
				m.depth, m.ph = 1, esSkip
			case c == '"':
				m.inStr, m.ph = true, esKey // the next member follows the string
				m.capture, m.valLen = keepAs, 0
			case c >= '1' && c <= '9' && m.key == keyCode:
				m.n, m.ph = int16(c-'0'), esNum
			case c == ',' || c == '}' || c == ']' || c == ':':
				m.ph = esDone
			default:
				m.ph = esScalar
			}
		case esNum:
			switch {
			case c >= '0' && c <= '9':
				if m.n <= 999 {
					m.n = m.n*10 + int16(c-'0')
				}
			case isDelim(c):
				m.endNum()
				continue // the delimiter is read again, as esKey
			default:
				m.ph = esScalar // a fraction or an exponent: not a status
			}
		case esScalar:
			if isDelim(c) {
				m.ph = esKey
				continue // the delimiter is read again, as esKey
			}
		case esSkip:
			switch c {
			case '"':
				m.inStr = true
			case '{', '[':
				m.depth++
			case '}', ']':
				if m.depth--; m.depth == 0 {
					m.ph = esKey
				}
			}
		default: // esDone
			return
		}
		i++
	}
}

// skipStr steps over string contents from b[i] (see skipString) and returns
// where to go on: past the closing quote, or len(b).
func (m *errScan) skipStr(b []byte, i int) int {
	if m.esc {
		m.esc = false
		m.keep(b[i : i+1])
		return i + 1
	}
	next, ended, esc := skipString(b, i)
	m.esc = esc
	if ended {
		m.keep(b[i : next-1]) // not the closing quote
		m.inStr = false
		m.endCapture()
	} else {
		m.keep(b[i:next])
	}
	return next
}

// keep adds p, the next bytes of a string value, to the value kept, if one
// is, up to what val holds.
func (m *errScan) keep(p []byte) {
	if m.capture != capNone && int(m.valLen) < len(m.val) {
		m.valLen += uint16(copy(m.val[m.valLen:], p))
	}
}

// endCapture reads the kept value, whose closing quote was just read.
func (m *errScan) endCapture() {
	switch m.capture {
	case capType:
		m.typeCode = kindStatus(m.val[:m.valLen], int(m.valLen) == len(m.val))
	case capText:
		m.textCode = textStatus(m.val[:m.valLen])
	case capKind:
		m.kindCode = kindStatus(m.val[:m.valLen], int(m.valLen) == len(m.val))
	case capCode:
		m.strCodes[m.lvl-1] = codeStatus(m.val[:m.valLen], int(m.valLen) == len(m.val))
		if m.lvl == 2 {
			m.named = m.valLen > 0
		}
	}
	m.capture = capNone
}

// endNum notes the integer just read as the code of the object being read
// when it is a status.
func (m *errScan) endNum() {
	if m.n >= 100 && m.n <= 599 {
		m.codes[m.lvl-1] = m.n
	}
	m.ph = esKey
}

// keyKind names the key just read (in keyBuf, with its quotes).
func (m *errScan) keyKind() uint8 {
	if int(m.keyLen) > len(m.keyBuf) {
		return keyOther
	}
	quoted := m.keyBuf[:m.keyLen]
	key := quoted[1 : len(quoted)-1]
	outside := m.resp && !m.inResp // in a failed response's envelope
	if bytes.IndexByte(key, '\\') >= 0 {
		// Escapes in a key: no server writes them, but encoding/json
		// reads "\u0063ode" as "code", and so does errScan. A key that
		// is not valid JSON stays as written and matches neither.
		var kd [len(m.keyBuf)]byte
		if k, ok := appendUnquoted(kd[:0], key); ok {
			key = k
		}
	}
	if outside {
		if string(key) == "response" {
			return keyResponse
		}
		return keyOther
	}
	switch string(key) {
	case "error":
		return keyError
	case "code":
		return keyCode
	case "error_type":
		return keyErrorType
	case "message":
		return keyMessage
	case "type":
		return keyType
	}
	return keyOther
}

// code returns the status the line read so far gives, or 0. A line that
// ends in the code's digits (cut off before its object closes) gives them.
// A text that says the server shed the call (see textStatus) makes a 5xx
// code, or none, an overload answer (429): SGLang sheds with code 503.
func (m *errScan) code() int {
	codes := m.codes
	if m.ph == esNum && m.n >= 100 && m.n <= 599 {
		codes[m.lvl-1] = m.n
	}
	code := codes[1]
	if code == 0 {
		code = codes[0]
	}
	switch {
	case code >= 500 && m.textCode == http.StatusTooManyRequests:
		return http.StatusTooManyRequests
	case code != 0:
		return int(code)
	case m.typeCode != 0:
		return int(m.typeCode)
	case m.kindCode != 0:
		return int(m.kindCode)
	case m.strCodes[1] != 0:
		return int(m.strCodes[1])
	case m.strCodes[0] != 0:
		return int(m.strCodes[0])
	}
	return int(m.textCode)
}

// failedCode is the status a Responses API response.failed event's data
// gives (resp): code's, when its response's error says one (server_error
// 500, rate_limit_exceeded 429, or an integer code); else 400, the
// request's, when the error names another code (invalid_prompt, the image
// errors, context_length_exceeded from other servers); else 500: a
// response that failed and says neither is the endpoint's failure.
func (m *errScan) failedCode() int {
	if c := m.code(); c != 0 {
		return c
	}
	if m.named {
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// failedLineCode is failedCode of a whole data line (see errorCode).
func failedLineCode(line []byte) int {
	off := dataValue(line)
	if off < 0 {
		return 0
	}
	m := errScan{resp: true}
	m.feed(line[off:])
	return m.failedCode()
}

// codeStatus is the status an error code given as a string names: the
// OpenAI Responses API's (its error event's "code", and a failed
// response's error's): server_error 500, rate_limit_exceeded 429. Its
// other codes (invalid_prompt, the image errors, ...) are the request's:
// 0. raw is the value as written; cut when val was full.
func codeStatus(raw []byte, cut bool) int16 {
	v, ok := decodedWhole(raw, cut)
	if !ok {
		return 0
	}
	switch string(v) {
	case "server_error":
		return http.StatusInternalServerError
	case "rate_limit_exceeded":
		return http.StatusTooManyRequests
	}
	return 0
}

// maxText is the length of the longest text textStatus reads.
const maxText = 52

// kindStatus is the status a kind of error names: TGI's error_type (its
// InferError kinds, router/src/infer/mod.rs) and the Messages API's kinds
// (the "type" of its error event's error, which vLLM and SGLang send too).
// overloaded, overloaded_error and rate_limit_error: 429. A failed, cut or
// garbled generation (TGI answers a failed one 424, meaning the same),
// api_error, and internal_error (vLLM's and SGLang's for an exception
// while streaming): 500. Other kinds (TGI's validation, the Messages API's
// invalid_request_error, ...) are the request's, and the OpenAI-style
// kinds (BadRequestError, ...) come with a code, which wins: 0. The two
// vocabularies share no name. raw is the value as written; cut when val
// was full, so it is longer than any kind.
func kindStatus(raw []byte, cut bool) int16 {
	v, ok := decodedWhole(raw, cut)
	if !ok {
		return 0
	}
	switch string(v) {
	case "overloaded", "overloaded_error", "rate_limit_error":
		return http.StatusTooManyRequests
	case "generation", "incomplete_generation", "incomplete_generation_stream", "stream_serialization_error",
		"api_error", "internal_error":
		return http.StatusInternalServerError
	}
	return 0
}

// decodedWhole decodes a kept string value that is read whole (a kind,
// compared with ==); cut, it was longer than val, and longer than any
// kind: not ok.
func decodedWhole(raw []byte, cut bool) ([]byte, bool) {
	if cut {
		return nil, false
	}
	var d [maxText * 6]byte
	return decoded(d[:0], raw)
}

// Texts an error starts with that say what happened (textStatus).
var (
	// The server shed the call: TGI's "Model is overloaded" (InferError's
	// text), and SGLang's two for --max-queued-requests (scheduler.py,
	// _abort_on_queued_limit; code 503).
	shedTexts = [...][]byte{
		[]byte("Model is overloaded"),
		[]byte(shed.SGLangQueueFull),
		[]byte(shed.SGLangDisplaced),
	}
	// The generation failed: TGI's texts for a failed, cut or garbled one.
	failedTexts = [...][]byte{
		[]byte("Request failed during generation"),
		[]byte("Incomplete generation"),
		[]byte("Stream event serialization error"),
	}
)

// textStatus is the status an error's text says by how it starts: 429 for
// a text that says the server shed the call, 500 for one of TGI's that
// says the generation failed (on its OpenAI-compatible routes TGI gives
// every error a 422), 0 for any other. raw is the start of the text as
// written.
func textStatus(raw []byte) int16 {
	var d [maxText * 6]byte
	v, _ := decoded(d[:0], raw) // a cut escape ends what is read
	for _, t := range shedTexts {
		if bytes.HasPrefix(v, t) {
			return http.StatusTooManyRequests
		}
	}
	for _, t := range failedTexts {
		if bytes.HasPrefix(v, t) {
			return http.StatusInternalServerError
		}
	}
	return 0
}

// decoded decodes raw, string contents as written, into dst (see
// appendUnquoted); raw without an escape is returned as it is.
func decoded(dst, raw []byte) ([]byte, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true
	}
	return appendUnquoted(dst, raw)
}

// errorJSON returns the offset of the error object in line, the start of
// a line, when it is a data line holding one ("data:", an optional space,
// then {"error"), or -1 when line does not start one.
func errorJSON(line []byte) int {
	off := dataValue(line)
	if off < 0 || !bytes.HasPrefix(line[off:], []byte(`{"error"`)) {
		return -1
	}
	return off
}

// dataValue returns the offset of a data line's value in line, the start
// of the line: past "data:" and an optional space; -1 when line is not a
// data line.
func dataValue(line []byte) int {
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return -1
	}
	if len(v) > 0 && v[0] == ' ' {
		return len("data: ")
	}
	return len("data:")
}

// errorValue returns the offset of the error a line reports (see
// sseState.scan): an error object's on any data line, and any data line's
// value in an event of type "error" (typed); -1 when the line reports none.
func errorValue(line []byte, typed bool) int {
	if typed {
		return dataValue(line)
	}
	return errorJSON(line)
}

// errorCode returns the status code of a whole error line (see errScan),
// or 0 when it has none. typed: the line is in an event of type "error".
func errorCode(line []byte, typed bool) int {
	off := errorValue(line, typed)
	if off < 0 {
		return 0
	}
	var m errScan
	m.feed(line[off:])
	return m.code()
}

// shedBody keeps the start of a 503's body, which says whether the server
// shed the call: Triton, SGLang and Ollama answer a request their queue
// has no room for with 503, no Retry-After (nor retry-after-ms) and a
// body that says so (the texts and where each comes from: package
// internal/shed). Such answers
// are overloads, not failures: counted as failures, a busy server tripped
// its breaker after five and was ejected. Only a body the caller reads
// tells (every client reads an error's body to report it); one closed
// unread leaves the 503 a failure. The gRPC policy reads the same texts
// in an UNAVAILABLE, and a stream's error event SGLang's (textStatus).
//
// Concurrency: a shedBody belongs to its sseState (one Read at a time);
// finish reads it, from a Close that may run while a Read feeds it (net/http
// allows Close from another goroutine), so n is atomic: feed publishes the
// bytes it wrote by storing n after them, and shed reads only the bytes
// below the n it loads.
//
// The text comes after whatever the server puts before it: a Triton
// ensemble writes "in ensemble 'name', [request id: id] " for each
// ensemble level, with names up to a model repository's and IDs the
// caller's (a UUID), so a 128-byte head missed it behind a long name;
// 512 bytes holds a few levels and is still read only on such a 503.
type shedBody struct {
	head [512]byte
	n    atomic.Int32
}

// watchShed keeps the start of a 503's body, which has no Retry-After nor
// retry-after-ms (see shedBody). Out of line, as shed is: only such
// answers run them, and the calls that succeed run through less code.
//
//go:noinline
func (c *call) watchShed() {
	if c.sse == nil {
		c.sse = new(sseState)
	}
	c.sse.shed = new(shedBody)
}

// shed reports whether the 503 body read so far says the server shed
// the call.
//
//go:noinline
func (c *call) shed() bool { return c.sse.shed.shed() }

func (s *shedBody) feed(p []byte) {
	n := int(s.n.Load())
	s.n.Store(int32(n + copy(s.head[n:], p)))
}

// shed reports whether the body read so far says the call was shed.
func (s *shedBody) shed() bool { return shed.InBytes(s.head[:s.n.Load()]) }
