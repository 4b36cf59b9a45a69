package window

import (
	"bufio"
	"bytes"
	"io"
	"unicode/utf8"
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

// carriedChunk is how much decoded text Carried searches at once, and
// carriedOverlap how much of it is searched again with the next chunk:
// more than the longest of windowTexts and the digit after it, so that
// such text split between two chunks is in one of them. carriedRoom is
// room past a chunk for the bytes of one decoded escape.
const (
	carriedChunk   = 32 << 10
	carriedOverlap = 4 << 10
	carriedRoom    = utf8.UTFMax
)

// windowTexts are, in lower case, the texts by which Refusal knows a
// refusal (when) and that it reads the window after (after, numberAfter's
// text): a text it reads as a refusal holds one pair's when and its after
// with a digit right after it. Carried looks for them everywhere in a
// body, not as Refusal does: Refusal reads the number after the first of
// a text's "maximum context length is " alone, and a body that holds one
// without a number ("... is unknown", in the prompt) before one with
// ("... is 10", in the field a server copies) reads as no refusal, though
// the copy of that field does. TestCarriedEveryRefusal holds this list to
// Refusal's.
var windowTexts = [...]struct{ when, after string }{
	{"maximum context length is ", "maximum context length is "},
	{"longer than the model's context length (", "longer than the model's context length ("},
	{"maximum context length of ", "maximum context length of "},
	{"`inputs` tokens + `max_new_tokens` must be <= ", "`max_new_tokens` must be <= "},
	{"`inputs` must have less than ", "`inputs` must have less than "},
	{"decoder prompt (length ", "longer than the maximum model length of "},
	{"exceeds the available context size", "available context size ("},
	{"exceeds the available context size", `"n_ctx":`},
	{"exceed_context_size_error", "available context size ("},
	{"exceed_context_size_error", `"n_ctx":`},
	{"prompt length (", "exceeds maximum sequence length ("},
	{"prompt length (", "exceeds maximum input length ("},
}

// Carried reports whether the body r, a request's, holds text Refusal
// could read as a refusal once JSON's string escapes (\n, \", \u0041 and
// the rest) are undone: text a server copying the request, or any field
// of it, into its error could answer with. That is one of windowTexts'
// when and its after followed by a digit, anywhere in the body and in
// any case (Refusal's: Unicode's, in which U+0130, escaped or not, is an
// i). whole says r was read to its end within limit bytes; when it was
// not (longer, or its read failed), carried is false and nothing is
// known. It reads r; the caller closes it.
func Carried(r io.Reader, limit int64) (carried, whole bool) {
	br := bufio.NewReaderSize(io.LimitReader(r, limit+1), 16<<10)
	buf := make([]byte, 0, carriedOverlap+carriedChunk+carriedRoom)
	var found windowFound
	var n int64 // bytes read from r
	fresh := 0  // bytes of buf not searched yet
	for {
		c, err := br.ReadByte()
		if err != nil {
			if err != io.EOF || n > limit {
				return false, false
			}
			return fresh > 0 && found.search(buf), true
		}
		n++
		if n > limit {
			return false, false
		}
		if c == '\\' {
			var ch rune
			ch, n = unescape(br, n)
			buf = utf8.AppendRune(buf, ch)
		} else {
			buf = append(buf, c)
		}
		fresh++
		if len(buf) >= carriedOverlap+carriedChunk {
			if found.search(buf) {
				return true, true
			}
			buf = buf[:copy(buf, buf[len(buf)-carriedOverlap:])]
			fresh = 0
		}
	}
}

// windowFound is what Carried has found of windowTexts so far, a bit for
// each pair: its when (when), its after with a digit after it (after).
type windowFound struct{ when, after uint32 }

// search adds what text holds of windowTexts to f and reports whether
// f then holds both halves of a pair.
func (f *windowFound) search(text []byte) bool {
	lower := bytes.ToLower(text)
	for i, w := range windowTexts {
		bit := uint32(1) << i
		if f.when&bit == 0 && bytes.Contains(lower, []byte(w.when)) {
			f.when |= bit
		}
		if f.after&bit == 0 && numberFollows(lower, w.after) {
			f.after |= bit
		}
		if f.when&f.after&bit != 0 {
			return true
		}
	}
	return false
}

// numberFollows reports whether any s in b has a digit right after it.
func numberFollows(b []byte, s string) bool {
	for {
		i := bytes.Index(b, []byte(s))
		if i < 0 {
			return false
		}
		b = b[i+len(s):]
		if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
			return true
		}
	}
}

// unescape reads the rest of a JSON escape whose backslash was just read
// (n bytes read so far) and returns the character it stands for: for a \u
// escape, the UTF-16 code unit as a rune (a surrogate's half stands for
// itself, which no refusal's text holds, nor lowers to one). A backslash
// that starts no escape stands for itself.
func unescape(br *bufio.Reader, n int64) (rune, int64) {
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
			return utf8.RuneError, n
		}
		v := rune(0)
		for _, d := range h {
			switch {
			case d >= '0' && d <= '9':
				v = v<<4 | rune(d-'0')
			case d|0x20 >= 'a' && d|0x20 <= 'f':
				v = v<<4 | rune(d|0x20-'a'+10)
			default:
				return utf8.RuneError, n // not an escape after all: its bytes are read as they are
			}
		}
		_, _ = br.Discard(4)
		return v, n + 4
	}
	return rune(c), n // \" \\ \/ and anything else: the character itself
}
