package httpbalancer

import "bytes"

// Reading the code of an error event. vLLM and SGLang end a failed
// generation with data: {"error": {"object": "error", "message": ...,
// "type": ..., "param": ..., "code": 500}}: the code comes after the
// message, which can be a Python traceback or a validation message of many
// KiB. Keeping the line to read it later would cost memory in proportion to
// the message; errScan reads it as it streams by instead, in a fixed amount
// of state whatever the line's length or nesting, and only lines that start
// an error object pay for it (see sseState.scan).

// errScan finds the status code of an error event: the "code" member of
// the top-level "error" object, or, when that has none that is a status,
// of the top-level object (some servers put it there). Only members of
// those two objects count: a "code" in the message text, or in an object
// nested deeper ("param": {"code": 500}), does not. A repeated key
// overrides, as in encoding/json, and keys are compared decoded, as
// encoding/json reads them, so on a well-formed line errScan agrees with
// decoding the line (FuzzSSEScan holds it to that). A code is an integer
// status (100 to 599); a string, a fraction or null is none.
//
// Like the request body scanner it is tolerant, not a validator: it stops
// at the first byte it cannot place and keeps what it found before. It
// never recurses (nesting it does not read is a counter) and looks at each
// byte a bounded number of times; string contents, most of an error line,
// are skipped with bytes.IndexByte.
//
// Concurrency: an errScan belongs to its sseState (one Read at a time).
type errScan struct {
	depth  int      // nesting inside a value being stepped over (esSkip)
	codes  [2]int16 // the status read for the top-level object and for its error object; 0: none
	n      int16    // the integer being read (esNum), saturating above 999
	ph     uint8
	lvl    uint8 // the object being read: 1, top-level; 2, its "error" object
	key    uint8 // the current member's key: keyOther, keyError or keyCode
	inStr  bool  // in a string that is stepped over
	esc    bool  // the next byte is escaped
	keyLen uint8 // bytes of the key read so far, with its opening quote; len(keyBuf)+1: longer than keyBuf
	// keyBuf is the current key with its quotes: 32 bytes hold "error"
	// with every letter escaped (\u0065...), the longest spelling of a key
	// that matters.
	keyBuf [32]byte
}

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
					m.ph = esDone
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
			switch {
			case m.key == keyCode:
				m.codes[m.lvl-1] = 0
			case m.key == keyError && m.lvl == 1:
				m.codes[1] = 0
			}
			switch {
			case c == '{' && m.key == keyError && m.lvl == 1:
				m.lvl, m.ph = 2, esKey
			case c == '{' || c == '[':
				m.depth, m.ph = 1, esSkip
			case c == '"':
				m.inStr, m.ph = true, esKey // the next member follows the string
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
		return i + 1
	}
	i, ended, esc := skipString(b, i)
	m.esc = esc
	if ended {
		m.inStr = false
	}
	return i
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
	if bytes.IndexByte(key, '\\') >= 0 {
		// Escapes in a key: no server writes them, but encoding/json
		// reads "\u0063ode" as "code", and so does errScan. A key that
		// is not valid JSON stays as written and matches neither.
		var kd [len(m.keyBuf)]byte
		if k, ok := appendUnquoted(kd[:0], key); ok {
			key = k
		}
	}
	switch string(key) {
	case "error":
		return keyError
	case "code":
		return keyCode
	}
	return keyOther
}

// code returns the status the line read so far gives, or 0. A line that
// ends in the code's digits (cut off before its object closes) gives them.
func (m *errScan) code() int {
	codes := m.codes
	if m.ph == esNum && m.n >= 100 && m.n <= 599 {
		codes[m.lvl-1] = m.n
	}
	if codes[1] != 0 {
		return int(codes[1])
	}
	return int(codes[0])
}

// isErrorData reports whether line, the start of a line, is a data line
// holding an error object: "data:", an optional space, then {"error".
func isErrorData(line []byte) bool {
	return errorJSON(line) >= 0
}

// errorJSON returns the offset of the error object in line (see
// isErrorData), or -1 when line does not start one.
func errorJSON(line []byte) int {
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return -1
	}
	off := len("data:")
	if len(v) > 0 && v[0] == ' ' {
		v, off = v[1:], off+1
	}
	if !bytes.HasPrefix(v, []byte(`{"error"`)) {
		return -1
	}
	return off
}

// errorCode returns the status code of a whole error line (see errScan),
// or 0 when it has none.
func errorCode(line []byte) int {
	off := errorJSON(line)
	if off < 0 {
		return 0
	}
	var m errScan
	m.feed(line[off:])
	return m.code()
}
