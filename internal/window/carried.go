package window

import (
	"bufio"
	"errors"
	"io"
)

// A server that refuses a call for an invalid field often copies the
// field's value into its answer: vLLM's and FastAPI's validation errors
// (a 400 listing the value as 'input'), TGI's (a 422 quoting it). A value
// that reads as a window refusal ("max_tokens": "This model's maximum
// context length is 10 tokens. ...") makes that answer one, and every
// endpoint that copies it would be remembered with the caller's window:
// a client could push a model's calls off the replicas of its choice.
// Carried reads a request's body for such text, so that the adapters
// believe a refusal only of a call that carries none.

// carriedChunk is how much decoded text Carried hands Refusal at once,
// and carriedOverlap how much of it is read again with the next chunk:
// more than the longest answer the adapters read for a refusal (2 KiB),
// so that a refusal's text split between two chunks is in one of them.
const (
	carriedChunk   = 32 << 10
	carriedOverlap = 4 << 10
)

// errTooLong is Carried's reason for a body longer than its limit.
var errTooLong = errors.New("window: body longer than the limit")

// Carried reports whether the body r, a request's, holds text Refusal
// reads as a refusal once JSON's string escapes (\n, \", \u0041 and the
// rest) are undone: text a server copying the request into its error
// could answer with. whole says r was read to its end within limit
// bytes; when it was not (longer, or its read failed), carried is false
// and nothing is known. It reads r; the caller closes it.
func Carried(r io.Reader, limit int64) (carried, whole bool) {
	br := bufio.NewReaderSize(io.LimitReader(r, limit+1), 16<<10)
	buf := make([]byte, 0, carriedOverlap+carriedChunk)
	var n int64 // bytes read from r
	fresh := 0  // bytes of buf Refusal has not seen
	for {
		c, err := br.ReadByte()
		if err != nil {
			if err != io.EOF || n > limit {
				return false, false
			}
			return fresh > 0 && refuses(buf), true
		}
		n++
		if n > limit {
			return false, false
		}
		if c == '\\' {
			c, n = unescape(br, n)
		}
		buf = append(buf, c)
		fresh++
		if len(buf) == cap(buf) {
			if refuses(buf) {
				return true, true
			}
			buf = buf[:copy(buf, buf[len(buf)-carriedOverlap:])]
			fresh = 0
		}
	}
}

// refuses reports whether Refusal reads text as a refusal.
func refuses(text []byte) bool {
	w, _, _, _ := Refusal(text)
	return w > 0
}

// unescape reads the rest of a JSON escape whose backslash was just read
// (n bytes read so far) and returns the byte it stands for: the
// character for a simple escape or a \u escape of an ASCII character, 0x80
// for any other \u escape (no refusal's text holds one). A backslash that
// starts no escape stands for itself.
func unescape(br *bufio.Reader, n int64) (byte, int64) {
	c, err := br.ReadByte()
	if err != nil {
		return '\\', n
	}
	n++
	switch c {
	case 'n':
		return '\n', n
	case 't':
		return '\t', n
	case 'r':
		return '\r', n
	case 'b':
		return '\b', n
	case 'f':
		return '\f', n
	case 'u':
		h, err := br.Peek(4)
		if err != nil {
			return 0x80, n
		}
		v := 0
		for _, d := range h {
			switch {
			case d >= '0' && d <= '9':
				v = v<<4 | int(d-'0')
			case d|0x20 >= 'a' && d|0x20 <= 'f':
				v = v<<4 | int(d|0x20-'a'+10)
			default:
				return 0x80, n // not an escape after all: its bytes are read as they are
			}
		}
		_, _ = br.Discard(4)
		n += 4
		if v < 0x80 {
			return byte(v), n
		}
		return 0x80, n
	}
	return c, n // \" \\ \/ and anything else: the character itself
}
