package httpbalancer

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb/cache"
)

// scanner is a tolerant, single-pass reader of the few top-level fields of a
// JSON request body that routing needs. It is not a validator: it accepts a
// truncated body (a bounded peek of a larger one) and stops at the first
// thing it does not understand, keeping what it found so far.
//
// It never recurses on input structure (skip counts brackets in a loop), so
// a hostile, deeply nested body cannot exhaust the stack, and every index is
// checked, so no input can make it panic; FuzzInspect holds it to that.
//
// Concurrency: a scanner and the body it fills belong to one Inspect call.
type scanner struct {
	b   []byte
	i   int
	key [32]byte // the last key read, when it had escapes (nextKey)
}

func (s *scanner) ws() {
	if s.i < len(s.b) && s.b[s.i] > ' ' { // compact JSON: the usual case
		return
	}
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
//
// It is called from some thirty places; inlined into each, it made the
// scanner a third larger, and on the loopback call, where the scanner's
// code is cold in the instruction cache every time, that cost more than
// the calls: about 100 ns of the scan's 700 in place, against a few ns
// more in a hot loop.
//
//go:noinline
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

// str reads a string. raw is the text between the quotes; esc reports
// escape sequences (raw is then not the decoded value: unquote gives it).
// Returning only raw keeps the results in fewer registers: it is called a
// dozen times per small body.
// Keys, roles and model names are short: str looks for the closing quote
// (or a backslash) eight bytes at a time, which ends a short string before
// bytes.IndexByte would have finished its setup. Past shortStr bytes it
// hands over to longStr's IndexByte (vectorized): prompt text is most of a
// body and has few quotes.
func (s *scanner) str() (raw []byte, esc, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	b, start := s.b, s.i+1
	j := start
	for ; j+8 <= len(b); j += 8 {
		if m := quoteOrBackslash(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			j += bits.TrailingZeros64(m) >> 3
			goto found
		}
		if j-start >= shortStr {
			return s.longStr(start)
		}
	}
	for ; j < len(b); j++ {
		if c := b[j]; c == '"' || c == '\\' {
			goto found
		}
	}
	return s.longStr(start) // unterminated
found:
	if b[j] != '"' {
		return s.longStr(start) // an escape: count backslashes there
	}
	s.i = j + 1
	return b[start:j], false, true
}

// shortStr is how far str looks eight bytes at a time.
const shortStr = 64

// quoteOrBackslash has the high bit set in the byte of x (little endian)
// that is the first '"' or '\\', and possibly in later ones; 0 if none.
// The classic "has a zero byte" test on x XOR the repeated character: a
// borrow can only mark bytes above a true match, so the lowest mark is exact.
func quoteOrBackslash(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return ((q-ones)&^q | (bs-ones)&^bs) & highs
}

// longStr finishes str for a string that starts at start (after the quote).
func (s *scanner) longStr(start int) (raw []byte, esc, ok bool) {
	for j := start; j <= len(s.b); {
		k := bytes.IndexByte(s.b[j:], '"')
		if k < 0 {
			break
		}
		q := j + k
		bs := 0 // backslashes right before the quote: odd means it is escaped
		for p := q - 1; p >= start && s.b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			raw = s.b[start:q]
			s.i = q + 1
			return raw, bytes.IndexByte(raw, '\\') >= 0, true
		}
		j = q + 1
	}
	s.i = len(s.b)
	return nil, false, false
}

// unquote returns the value of the JSON string whose text between the
// quotes is raw, as encoding/json reads it (raw when it is not valid JSON),
// in one allocation of the value's size: a body can hold a great many short escaped strings, and
// json.Unmarshal costs three allocations and some 170 bytes each.
func unquote(raw []byte, esc bool) string {
	if esc {
		if v, ok := appendUnquoted(make([]byte, 0, len(raw)), raw); ok {
			return unsafe.String(unsafe.SliceData(v), len(v))
		}
	}
	return string(raw)
}

// appendUnquoted appends to dst the value of the JSON string whose text
// between the quotes is raw, as encoding/json decodes it: invalid UTF-8 and
// unpaired surrogates become U+FFFD. ok is false where encoding/json
// rejects the string (a control character, an unknown or short escape);
// dst then holds part of the value.
func appendUnquoted(dst, raw []byte) (_ []byte, ok bool) {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			if i+1 >= len(raw) {
				return dst, false
			}
			switch e := raw[i+1]; e {
			case '"', '\\', '/':
				dst = append(dst, e)
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(raw[i+2:])
				if r < 0 {
					return dst, false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; otherwise this half is
					// U+FFFD and what follows is read on its own.
					if i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if p := utf16.DecodeRune(r, hex4(raw[i+2:])); p != utf8.RuneError {
							r, i = p, i+6
						} else {
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default:
				return dst, false
			}
			i += 2
		case c < ' ' || c == '"':
			return dst, false
		case c < utf8.RuneSelf:
			j := i + 1
			for j < len(raw) && raw[j] >= ' ' && raw[j] < utf8.RuneSelf && raw[j] != '\\' && raw[j] != '"' {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
		default:
			r, n := utf8.DecodeRune(raw[i:])
			dst = utf8.AppendRune(dst, r)
			i += n
		}
	}
	return dst, true
}

// hex4 reads the four hex digits of a \u escape at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// escSaved is how many bytes longer raw, the text between the quotes of a
// JSON string, is than the UTF-8 of its value: what its escapes take
// beyond what they stand for. Prompt text is counted by its value
// (count): a client that escapes non-ASCII (Python's json.dumps, and so
// requests, LangChain and the openai package over httpx before 0.28) writes
// a CJK character as six bytes, \u4f60, which would count twice its three
// bytes of UTF-8 and twice its tokens. It reads escapes as appendUnquoted
// does (\n, \" and the like: one byte; \uXXXX: the UTF-8 of its code
// point, a surrogate pair four bytes, an unpaired half U+FFFD's three)
// without decoding into a buffer, jumping from backslash to backslash. An
// escape the end of raw cuts (a peek that ends in it) counts as written.
func escSaved(raw []byte) int {
	saved := 0
	for i := 0; i < len(raw); {
		if raw[i] != '\\' { // runs of escapes (escaped CJK text) skip the search
			k := bytes.IndexByte(raw[i:], '\\')
			if k < 0 {
				break
			}
			i += k
		}
		if i+1 >= len(raw) {
			break
		}
		if raw[i+1] != 'u' {
			saved++ // \n, \", \\ ...: one byte (an unknown escape: the server rejects it)
			i += 2
			continue
		}
		r := hex4(raw[i+2:])
		if r < 0 {
			saved++ // not an escape JSON knows, or cut: as two bytes
			i += 2
			continue
		}
		i += 6
		switch {
		case r < utf8.RuneSelf:
			saved += 5
		case r < 0x800:
			saved += 4
		case !utf16.IsSurrogate(r):
			saved += 3
		case i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' &&
			utf16.DecodeRune(r, hex4(raw[i+2:])) != utf8.RuneError:
			saved += 12 - 4 // a pair: one rune beyond U+FFFF
			i += 6
		default:
			saved += 3 // an unpaired half: U+FFFD
		}
	}
	return saved
}

// count adds a prompt string, whose text between the quotes is raw, to
// the prompt text: by the UTF-8 length of its value (see escSaved).
func (out *body) count(raw []byte, esc bool) {
	if esc {
		out.countEscaped(raw)
		return
	}
	out.chars += len(raw)
}

// countEscaped is count's path for a string with escapes, kept out of line
// so that count, on the path of every string, inlines.
//
//go:noinline
func (out *body) countEscaped(raw []byte) {
	d := escSaved(raw)
	out.chars += len(raw) - d
	out.saved += d
}

// countCut notes the prompt text the peek ends in (raw runs to the end of
// the peek), which is not counted in chars (the body's size estimates what
// lies past the peek) but whose escapes, like those of what is counted,
// tell how much shorter than the body the text past the peek is (see
// idScaled).
func (out *body) countCut(raw []byte) {
	d := escSaved(raw)
	out.saved += d
	out.cut += len(raw) - d
}

// view is unquote for text that does not outlive the parse: an unescaped
// string aliases the body instead of being copied.
func view(raw []byte, esc bool) string {
	if esc {
		return unquote(raw, esc)
	}
	return alias(raw)
}

// alias returns b as a string without copying. The caller guarantees that
// b is not modified while the string is in use: here, the body being
// parsed, which Inspect must not modify and must not retain.
func alias(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// models holds recently seen model names, so that the string Info keeps
// for the model (which outlives the call: Result.Request, the balancer's
// model groups) is shared by the calls naming the same model rather than
// allocated per call. A fleet serves a handful of models; a slot that two
// alternate between, or a stream of made-up names, costs one allocation more
// per miss than no cache, and the table holds at most len(models) names of
// at most maxInternModel bytes.
var models [64]atomic.Pointer[string]

const maxInternModel = 256

// internModel is unquote for the model name, from the cache when it is there.
func internModel(raw []byte, esc bool) string {
	if esc || len(raw) > maxInternModel {
		return unquote(raw, esc)
	}
	h := uint32(2166136261) // FNV-1a
	for _, c := range raw {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &models[h%uint32(len(models))]
	if p := slot.Load(); p != nil && *p == string(raw) {
		return *p
	}
	m := string(raw)
	slot.Store(&m)
	return m
}

func isDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r', ':':
		return true
	}
	return false
}

// skip steps over one value of any shape. It reports false when the body
// ends inside the value or is malformed in a way that loses track of it.
func (s *scanner) skip() bool {
	s.ws()
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			if _, _, ok := s.str(); !ok {
				return false
			}
			if depth == 0 {
				return true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return false
			}
			if depth == 0 {
				s.i++
				return true
			}
		default:
			if depth == 0 { // a scalar: true, false, null or a number
				start := s.i
				for s.i < len(s.b) && !isDelim(s.b[s.i]) {
					s.i++
				}
				return s.i > start && s.i < len(s.b)
			}
		}
		s.i++
	}
	return false
}

// scalar reads a bare literal or number and returns its text.
func (s *scanner) scalar() ([]byte, bool) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && !isDelim(s.b[s.i]) {
		if c := s.b[s.i]; c == '"' || c == '{' || c == '[' {
			return nil, false
		}
		s.i++
	}
	return s.b[start:s.i], s.i > start && s.i < len(s.b)
}

// integer reads a non-negative integer that fits an int32 (token counts),
// also written as a JSON number with a fraction or exponent whose value is
// whole (32.0, 1e3: see wholeNumber), or as a string of its digits ("512",
// see intString); anything else (fractions, negative or huge values) reads
// as absent. The bound keeps a hostile max_tokens from overflowing the
// in-flight token sum.
func (s *scanner) integer() (int, bool) {
	if s.peek() == '"' {
		raw, esc, ok := s.str()
		return intString(view(raw, esc)), ok
	}
	if c := s.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, s.skip()
	}
	lit, ok := s.scalar()
	if !ok {
		return 0, false
	}
	n := int64(0) // an int of 32 bits wraps before the bound
	for _, c := range lit {
		if c < '0' || c > '9' {
			return wholeNumber(lit), true
		}
		n = n*10 + int64(c-'0')
		if n > 1<<31-1 {
			return 0, true
		}
	}
	return int(n), true
}

// intString reads v, the value of a JSON string, as a count in
// 0..2^31-1 the way vLLM and SGLang read it, else 0. They validate their
// requests with pydantic, which in its (default) lax mode takes a string
// for an integer field (a bound read from an environment variable or a
// config file, passed on unconverted) and the server honours it. What
// pydantic-core's str_as_int takes, and so this: the digits of an
// integer, between Unicode white space, after one '+', with leading zeros,
// with single underscores between digits ("1_000"), with a fraction of
// zeros ("512.0", "512.00"); not "512.", ".5", "_1", "1_", "1__0", "1e3",
// "0x10", nor non-ASCII digits. Negative values read as 0.
func intString(v string) int {
	if n, ok := plainCount(v); ok {
		return n
	}
	// pydantic-core's clean_int_str, for what is not a plain integer.
	s := strings.TrimFunc(v, unicode.IsSpace) // Rust's str::trim: White_Space
	if r, ok := strings.CutPrefix(s, "+"); ok {
		s = r
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0 // and a sign left: '-' (negative, or "+-"), "++"
	}
	// Leading zeros, and underscores among them, up to the first other
	// digit; before a '.', one zero (or underscore) is kept.
	if s[0] == '0' {
		i := 1
		for i < len(s) && (s[i] == '0' || s[i] == '_') {
			i++
		}
		switch {
		case i == len(s):
			s = s[i-1:]
		case s[i] == '.':
			s = s[i-1:]
		case s[i] >= '1' && s[i] <= '9' || s[i] == '-':
			s = s[i:]
		default:
			return 0
		}
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if frac := s[i+1:]; frac != "" && strings.Trim(frac, "0") == "" {
			s = s[:i]
		}
	}
	if strings.Contains(s, "_") && s[0] != '_' && s[len(s)-1] != '_' && !strings.Contains(s, "__") {
		s = strings.ReplaceAll(s, "_", "")
	}
	n, _ := plainCount(s)
	return n
}

// plainCount reads s as a JSON integer ("0", or digits without a leading
// zero; a '-' makes it negative, read as 0) in 0..2^31-1.
func plainCount(s string) (int, bool) {
	if s == "" || s[0] == '0' && len(s) > 1 {
		return 0, false
	}
	if s[0] == '-' {
		if len(s) == 1 || s[1] == '-' {
			return 0, false
		}
		_, ok := plainCount(s[1:])
		return 0, ok // negative: no count
	}
	n := int64(0) // an int of 32 bits wraps before the bound
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n = n*10 + int64(c-'0'); n > 1<<31-1 {
			return 0, true // a count too large to weigh
		}
	}
	return int(n), true
}

// wholeNumber reads lit, a JSON number that is not a plain run of digits,
// as a count when its value is whole and in 0..2^31-1, else 0. vLLM and
// SGLang validate their requests with pydantic, which takes 32.0 or 1e3 for
// an integer field (and refuses 32.5): Python's json.dumps writes a bound
// computed as a float (budget / 2) so, and the server honours it.
func wholeNumber(lit []byte) int {
	if !jsonNumber(lit) {
		return 0
	}
	v, err := strconv.ParseFloat(alias(lit), 64)
	if err != nil || v < 0 || v > 1<<31-1 || v != math.Trunc(v) {
		return 0
	}
	return int(v)
}

// jsonNumber reports whether lit is a number as JSON writes it (RFC 8259:
// no leading zeros, digits on both sides of the point), so that what
// strconv.ParseFloat takes besides (hex, "Inf", underscores) reads as absent.
func jsonNumber(lit []byte) bool {
	i := 0
	if i < len(lit) && lit[i] == '-' {
		i++
	}
	if i < len(lit) && lit[i] == '0' {
		i++
	} else if j := digits(lit, i); j > i {
		i = j
	} else {
		return false
	}
	if i < len(lit) && lit[i] == '.' {
		if i = digits(lit, i+1); lit[i-1] == '.' {
			return false
		}
	}
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			i++
		}
		if j := digits(lit, i); j > i {
			i = j
		} else {
			return false
		}
	}
	return i == len(lit)
}

// digits returns the index past the run of decimal digits of b at i.
func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// Objects and arrays are read with these two steps in a loop rather than
// with a callback per member: a call through a closure per key costs more
// than the key itself on a small body.
const (
	member = iota // a member follows (for objects, its key and colon are read)
	closed        // the closing bracket was read: the whole value was read
	broken        // the value ends badly (truncated or malformed)
)

// nextKey reads the next key of the object whose '{' was read, and its
// colon. first is true right after the '{'. One peek decides between the
// separator, the end and a break; the colon of compact JSON is checked in
// place. A key spelled with escapes ("mod\u0065l") is decoded, as
// encoding/json reads it, into the scanner's key buffer: the key is valid
// until the next call.
func (s *scanner) nextKey(first bool) (key []byte, st int) {
	switch c := s.peek(); {
	case c == '}':
		s.i++
		return nil, closed
	case first:
	case c == ',':
		s.i++
	default:
		return nil, broken
	}
	key, esc, ok := s.str()
	if !ok {
		return nil, broken
	}
	if esc {
		key = s.unquoteKey(key)
	}
	if s.i < len(s.b) && s.b[s.i] == ':' {
		s.i++
	} else if !s.eat(':') {
		return nil, broken
	}
	return key, member
}

// maxKey is the length of the longest key the scanner looks for
// ("max_completion_tokens"). A \u escape is 6 bytes of one character at
// least, so an escaped key longer than 6*maxKey is none of them.
const maxKey = len("max_completion_tokens")

// unquoteKey decodes an escaped key into s.key, without allocating unless
// its value is longer than any key looked for. A key too long to be one of
// them, or not valid JSON, comes back as raw, which (with its backslash)
// matches none.
func (s *scanner) unquoteKey(raw []byte) []byte {
	if len(raw) > 6*maxKey {
		return raw
	}
	if k, ok := appendUnquoted(s.key[:0], raw); ok {
		return k
	}
	return raw
}

// nextElem steps to the next element of the array whose '[' was read.
// first is true right after the '['.
func (s *scanner) nextElem(first bool) int {
	switch c := s.peek(); {
	case c == ']':
		s.i++
		return closed
	case first:
		return member
	case c == ',':
		s.i++
		return member
	}
	return broken
}

// body is what the OpenAI inspector reads from a request body.
type body struct {
	model     string
	stream    bool
	maxTokens int    // the largest of bounds
	n         int    // choices asked for ("n"), each up to maxTokens; 0 if absent or not a count
	chars     int    // bytes of prompt text seen (message contents, prompt, input, tools), of its UTF-8 value (see count)
	cacheKey  string // may alias the body, like the fields below
	cacheSalt string // vLLM's cache_salt: requests with different salts share no cache

	// bounds is the output bound each member that gives one gave, by
	// boundKey: a repeated key's last value replaces the earlier ones, as
	// Python's json (vLLM, SGLang) and encoding/json read the body.
	bounds [nBounds]int

	// prompts is the size of a batch: the most prompts one prompt, text or
	// input_ids member holds (1 for a string, the strings or token-ID
	// lists of a list; 0 for a flat list of IDs, one prompt, or of message
	// items, none), each generated for up to n × maxTokens. listed is what
	// the last prompt value read held (see promptValue).
	prompts, listed int

	// The longest single input of a pooling call, in bytes as chars counts
	// them, is what a pooling server bounds by its window (see
	// Info.LongestInput): query the longest of a rerank's or score call's
	// query side (query, queries, text_1, data_1), input that of any other
	// prompt or input value, inputs the most elements one value of either
	// held.
	// longest is the largest element of the last prompt value read (the
	// value itself when it is one string or one list of token IDs).
	query, input, inputs, longest int

	// sized: readTail read the whole body, which held textSize bytes
	// outside data URLs and "data" members' strings (the size the prompt
	// estimate starts from).
	sized    bool
	textSize int64

	prevResponse string // previous_response_id; may alias the body
	conversation string // the Responses API's conversation ID; may alias the body

	// keyed is set when the fields below should be collected (LLM calls).
	// Their strings alias the body being parsed (see view) unless the text
	// has escapes or several parts: they must not outlive the Inspect call
	// that parsed it, and do not (they go to the Keyer and no further).
	keyed  bool
	system string // /v1/responses instructions
	// The chat messages (or responses input items), complete ones only:
	// the first nmsg are in msgs, any more in more. A fixed array rather
	// than a slice of it, so that body holds no pointer into itself and
	// can live on Inspect's stack.
	msgs    [4]cache.Message
	nmsg    int
	more    []cache.Message
	prompt  string // completions prompt, or responses input given as a string
	hasText bool   // prompt is set
	// promptFrom is the code of the top-level key (see promptKey) whose
	// value set prompt, or ids; 0 for none.
	promptFrom uint8
	// images is a hash of the strings of the body's "images" list
	// (Ollama's /api/generate: base64 photos beside the prompt), of what
	// the peek holds of them; 0 when there is none.
	images uint64
	// A prompt given as token IDs is keyed on its first list of them,
	// rendered into ids (see tokenIDs) while idState is idsCollecting.
	ids     []byte
	idState uint8
	parts   []byte // scratch for joining content parts
	single  []byte // the current message's text while it is one unescaped piece
	nparts  int    // pieces of text in the current message

	// idCount is the token IDs seen (a token each, in chars as
	// charsPerToken bytes) and idBytes the bytes of the lists of them:
	// how a body larger than the peek is estimated past it (see idScaled).
	idCount, idBytes int

	// saved is the bytes that escapes took in the prompt text seen beyond
	// its value (see escSaved), the string or value the peek ends in
	// included, and cut the value's bytes of that one: how much smaller
	// than the bytes sent the text past the peek is taken to be (idScaled).
	saved, cut int

	// Keyer.Chat reads messages only through the first user message (what
	// every later turn repeats), and no further than MaxKeyChars of their
	// rendering (content, role and 16 bytes of lengths each), so the texts
	// of later ones are counted, not copied: keyDone. rendered is the
	// rendering's size so far.
	keyDone  bool
	rendered int
	collect  bool // the current message's text is collected

	depth int // the Keyer's depth (0: cache.DefaultDepth), for token-ID prompts
}

var utf8BOM = []byte("\xef\xbb\xbf")

// parseBody reads the fields of interest from an OpenAI-compatible request
// body (chat completions, completions, responses, embeddings, rerank; TGI's
// "inputs" too). It never fails: what it cannot read stays zero.
func parseBody(b []byte, keyed bool, out *body) {
	out.keyed = keyed
	// A UTF-8 byte order mark: Python servers read such a body as JSON
	// (json.loads detects it), so it is read past.
	b = bytes.TrimPrefix(b, utf8BOM)
	s := &scanner{b: b}
	if s.peek() != '{' {
		return
	}
	s.i++
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member || !s.field(key, out) {
			return
		}
	}
}

// field reads the value of one top-level key. It reports false when the
// body cannot be read further.
func (s *scanner) field(key []byte, out *body) bool {
	switch string(key) {
	// A repeated key overrides, as in encoding/json; a value of the
	// wrong type clears the field rather than ending the scan.
	case "model":
		out.model = ""
		if s.peek() != '"' {
			return s.skip()
		}
		raw, esc, ok := s.str()
		if ok {
			out.model = internModel(raw, esc)
		}
		return ok
	case "messages":
		return s.messages(out)
	case "stream":
		// vLLM and SGLang validate with pydantic, which in its lax mode
		// takes the strings "true", "yes", "1", ... and the numbers 1 and
		// 1.0 for true (see laxTrue): such a call streams.
		out.stream = false
		switch c := s.peek(); {
		case c == '"':
			raw, esc, ok := s.str()
			out.stream = ok && laxTrue(view(raw, esc))
			return ok
		case c == 't' || c == 'f' || c == '-' || c >= '0' && c <= '9':
			lit, ok := s.scalar()
			out.stream = ok && (string(lit) == "true" || wholeNumber(lit) == 1)
			return ok
		}
		return s.skip()
	case "max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens":
		n, ok := s.integer()
		out.setBound(boundKey(key), n)
		return ok
	case "n":
		var ok bool
		out.n, ok = s.integer()
		return ok
	case "parameters", "sampling_params":
		// TGI: {"inputs": ..., "parameters": {"max_new_tokens": n}};
		// SGLang: {"text": ..., "sampling_params": {"max_new_tokens": m, "n": k}},
		// or a list of such objects, one per prompt of a batch.
		return s.parameters(out, boundKey(key))
	case "prompt", "text", "input_ids":
		// The completions API's prompt; text and input_ids: SGLang's
		// generate (the Responses API's text, an object, is stepped
		// over). A list of strings or of token-ID lists is a batch: a
		// completion per prompt. The largest batch counts, a bound.
		code := out.promptKey(key)
		ok := s.promptValue(out)
		out.promptKeyed(code)
		out.prompts = max(out.prompts, out.listed)
		out.input, out.inputs = max(out.input, out.longest), max(out.inputs, out.listed)
		return ok
	case "query", "queries", "text_1", "data_1":
		// A rerank's query, and the first side of vLLM's score API
		// (/score, /v1/score: text_1, queries or data_1, a string or a
		// list), each paired with each document (below).
		ok := s.promptValue(out)
		out.query, out.inputs = max(out.query, out.longest), max(out.inputs, out.listed)
		return ok
	case "input", "inputs", "text_input", "documents", "texts", "text_2", "data_2":
		// text_input: Triton's generate extension, as TensorRT-LLM serves
		// it. documents, texts (TEI's rerank), text_2 and data_2: a
		// rerank's documents, and the other side of vLLM's score API,
		// read as a rerank's documents are. None is a batch of
		// generations: the lists of embeddings and rerank calls have no
		// output, and /v1/responses input items are one conversation.
		code := out.promptKey(key)
		ok := s.promptValue(out)
		out.promptKeyed(code)
		out.input, out.inputs = max(out.input, out.longest), max(out.inputs, out.listed)
		return ok
	case "tools", "functions":
		// Tool definitions are rendered into the prompt: counted as sent.
		return s.counted(out)
	case "images":
		return s.promptImages(out)
	case "instructions", "system":
		// instructions: the Responses API's system message; system: the
		// Messages API's, a string or a list of text blocks.
		return s.system(out)
	// The IDs below go to Keyer.Session only, so views of the body do.
	case "prompt_cache_key":
		return s.stringView(&out.cacheKey)
	case "cache_salt":
		return s.stringView(&out.cacheSalt)
	case "conversation": // "conv_1" or {"id": "conv_1"}
		return s.conversation(out)
	case "previous_response_id":
		return s.stringView(&out.prevResponse)
	}
	return s.skip()
}

// promptKeys are the top-level keys whose value can be the prompt keyed on
// (see promptKey).
var promptKeys = [...]string{"prompt", "text", "input_ids", "input", "inputs", "text_input"}

// promptKey returns key's code among promptKeys (0 for none) and, when the
// prompt keyed on so far came from the same key, forgets it: the last of a
// repeated key is the prompt, as Python's json (vLLM, SGLang) and
// encoding/json read the body.
func (out *body) promptKey(key []byte) uint8 {
	code := uint8(0)
	for i, k := range promptKeys {
		if string(key) == k {
			code = uint8(i + 1)
			break
		}
	}
	if code != 0 && code == out.promptFrom {
		out.prompt, out.hasText, out.promptFrom = "", false, 0
		out.idState, out.ids = 0, out.ids[:0]
	}
	return code
}

// promptKeyed notes that the value of the key of the given code (see
// promptKey) was read: the prompt keyed on, or the token-ID list looked
// at for one, came from it unless it came from an earlier key.
func (out *body) promptKeyed(code uint8) {
	if out.promptFrom == 0 && (out.hasText || out.idState != 0) {
		out.promptFrom = code
	}
}

// counted steps over a value, counting its bytes as prompt text (a
// string's by its value: see escSaved).
func (s *scanner) counted(out *body) bool {
	s.ws()
	start := s.i
	ok := s.skip()
	if ok {
		// Its strings by their values: an escape only appears in one.
		d := escSaved(s.b[start:s.i])
		out.chars += s.i - start - d
		out.saved += d
	} else {
		out.countCut(s.b[start:])
	}
	return ok
}

// system reads a system prompt given apart from the messages: a string or
// a list of text blocks, read as a message's content is. A value with no
// text is no system prompt: a repeated key replaces an earlier one, as the
// server reads it, and as readTail does.
func (s *scanner) system(out *body) bool {
	out.system = ""
	out.parts, out.single, out.nparts = out.parts[:0], nil, 0
	out.collect = out.keyed
	ok := s.content(out)
	if ok && out.collect && out.nparts > 0 {
		if out.nparts == 1 && out.single != nil {
			out.system = alias(out.single) // one unescaped string: no copy
		} else {
			out.system = string(out.parts)
		}
	}
	out.collect = false
	return ok
}

// parameters reads TGI's parameters or SGLang's sampling_params object
// (its key's bound is b: see boundKey) for max_new_tokens and n, or
// SGLang's list of such objects (see parameterList). The value replaces
// what an earlier member of its key gave.
func (s *scanner) parameters(out *body, b int) bool {
	out.setBound(b, 0)
	switch s.peek() {
	case '{':
	case '[':
		return s.parameterList(out, b)
	default:
		return s.skip() // not an object: nothing to read, but step over it
	}
	return s.parameterObject(out, b)
}

// parameterObject reads one parameters object, whose '{' is next.
func (s *scanner) parameterObject(out *body, b int) bool {
	s.i++
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member {
			return st == closed
		}
		var ok bool
		switch string(key) {
		case "max_new_tokens":
			var n int
			n, ok = s.integer()
			out.setBound(b, n)
		case "n":
			out.n, ok = s.integer()
		default:
			ok = s.skip()
		}
		if !ok {
			return false
		}
	}
}

// parameterList reads SGLang's sampling_params given as a list, one object
// per prompt of a batch: the output bound is the largest max_new_tokens,
// and n the largest n, of those that give one (each of a batch's prompts
// is generated for up to that many tokens and choices). An object without
// n leaves n as it was, as the single object does. Only objects are read
// (parameters does not come back here), so no body makes the scan recurse.
func (s *scanner) parameterList(out *body, b int) bool {
	s.i++ // the '['
	saved, most := out.n, -1
	bound := 0
	ok := false
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			ok = st == closed
			break
		}
		out.n = -1 // an element without n leaves it so
		out.setBound(b, 0)
		if s.peek() == '{' {
			ok = s.parameterObject(out, b)
		} else {
			ok = s.skip()
		}
		most = max(most, out.n)
		bound = max(bound, out.bounds[b])
		if !ok {
			break
		}
	}
	out.n = saved
	if most >= 0 {
		out.n = most
	}
	out.setBound(b, bound)
	return ok
}

// The members that give an output bound (body.bounds), by boundKey.
const (
	boundMaxTokens = iota
	boundMaxCompletionTokens
	boundMaxOutputTokens
	boundMaxNewTokens
	boundParameters     // TGI's parameters.max_new_tokens
	boundSamplingParams // SGLang's sampling_params.max_new_tokens
	nBounds
)

// boundKey returns the index in body.bounds of a top-level key that gives
// an output bound.
func boundKey(key []byte) int {
	switch string(key) {
	case "max_tokens":
		return boundMaxTokens
	case "max_completion_tokens":
		return boundMaxCompletionTokens
	case "max_output_tokens":
		return boundMaxOutputTokens
	case "max_new_tokens":
		return boundMaxNewTokens
	case "parameters":
		return boundParameters
	}
	return boundSamplingParams
}

// setBound notes n as the bound member b gives, replacing what an earlier
// member of its key gave, and the output bound as the largest of them.
func (out *body) setBound(b, n int) {
	out.bounds[b] = n
	out.maxTokens = 0
	for _, v := range out.bounds {
		out.maxTokens = max(out.maxTokens, v)
	}
}

// laxTrue reports whether v, a JSON string's value, is one that pydantic's
// lax mode reads as true for a bool field (pydantic-core's str_as_bool):
// "1", or "t", "y", "on", "yes" or "true" in any ASCII case, with no white
// space around. Any other string is false or fails validation.
func laxTrue(v string) bool {
	if v == "1" {
		return true
	}
	for _, t := range [...]string{"t", "y", "on", "yes", "true"} {
		if len(v) == len(t) && lowerIs(v, t) {
			return true
		}
	}
	return false
}

// lowerIs reports whether v, of t's length, is t (lower case) in any ASCII
// case: Unicode folding would take "ſ" for "s", which pydantic does not.
func lowerIs(v, t string) bool {
	for i := range len(t) {
		c := v[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != t[i] {
			return false
		}
	}
	return true
}

// stringView reads a string value into *dst as a view of the body (see
// view); a value of another type clears *dst and is stepped over.
func (s *scanner) stringView(dst *string) bool {
	*dst = ""
	if s.peek() != '"' {
		return s.skip()
	}
	raw, esc, ok := s.str()
	if ok {
		*dst = view(raw, esc)
	}
	return ok
}

// conversation reads the Responses API's conversation: its ID as a string,
// or an object whose "id" is.
func (s *scanner) conversation(out *body) bool {
	if s.peek() != '{' {
		return s.stringView(&out.conversation)
	}
	out.conversation = ""
	s.i++
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member {
			return st == closed
		}
		var ok bool
		if string(key) == "id" {
			ok = s.stringView(&out.conversation)
		} else {
			ok = s.skip()
		}
		if !ok {
			return false
		}
	}
}

// promptValue reads a prompt or input: a string, a list of strings or token
// IDs, or (for /v1/responses) a list of message items. It sets out.listed
// to the prompts the value holds: 1 for a string, the strings and lists of
// a list (a flat list of token IDs, one prompt, counts 0, as do message
// items), as far as the body goes.
func (s *scanner) promptValue(out *body) bool {
	out.listed, out.longest = 0, 0
	before := out.chars
	switch s.peek() {
	case '"':
		out.listed = 1
		ok := s.promptString(out)
		out.longest = out.chars - before
		return ok
	case '[':
		start := s.i
		s.i++
		c := s.peek()
		out.startIDs(c)
		ok := s.promptList(out)
		out.endIDs() // also when the peek cut the list: it keys on what it holds
		out.idListEnded(c, s.i-start)
		if c == '-' || c >= '0' && c <= '9' {
			out.longest = out.chars - before // a flat list of token IDs: one input
		}
		return ok
	}
	return s.skip()
}

// promptList reads the elements of a prompt list whose '[' was read,
// noting the largest in out.longest.
func (s *scanner) promptList(out *body) bool {
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			return st == closed
		}
		before := out.chars
		ok := s.promptElem(out)
		out.longest = max(out.longest, out.chars-before)
		if !ok {
			return false
		}
	}
}

// idsCollecting and idsDone are body.idState's values after idsNone (0).
const (
	idsCollecting = 1 + iota
	idsDone
)

// idsTag starts the rendering of a token-ID prompt: such a prompt shares no
// cache with a text prompt that happens to read the same. Each ID follows
// as 4 bytes (little endian), so the key's Depth characters cover about
// Depth/4 IDs: the tokens a text key of Depth characters covers, at
// charsPerToken, however many digits the vocabulary's IDs take.
const idsTag = "\x00token_ids\x00"

// idListEnded notes a prompt list of n bytes whose first element started
// with c: a list of token IDs, when that is a digit or a sign.
func (out *body) idListEnded(c byte, n int) {
	if c == '-' || c >= '0' && c <= '9' {
		out.idBytes += n
	}
}

// startIDs begins collecting a list of token IDs, whose first element
// starts with c, as the prompt to key on: the first such list (the prompt
// itself, or the first of a batch of them), when no text prompt came first.
func (out *body) startIDs(c byte) {
	if out.keyed && !out.hasText && out.idState == 0 && (c == '-' || c >= '0' && c <= '9') {
		out.idState = idsCollecting
		out.ids = append(out.ids[:0], idsTag...)
	}
}

// endIDs ends the list being collected, if any: its rendering is the
// prompt to key on.
func (out *body) endIDs() {
	if out.idState != idsCollecting {
		return
	}
	out.idState = idsDone
	if len(out.ids) > len(idsTag) && !out.hasText {
		out.prompt, out.hasText = string(out.ids), true
	}
}

// tokenID reads one element of a prompt list that is not a string, list or
// object: a token ID, one token. While a list is collected, an ID (a plain
// decimal integer that fits 32 bits) is rendered (see idsTag), up to the
// key's depth; anything else ends the collection with no key, as the
// server rejects such a prompt.
func (s *scanner) tokenID(out *body) bool {
	out.chars += charsPerToken // a token ID is one token
	out.idCount++
	if out.idState != idsCollecting {
		return s.skip()
	}
	lit, ok := s.scalar()
	if !ok {
		return false
	}
	id, isID := tokenIDValue(lit)
	if !isID {
		out.idState, out.ids = idsDone, out.ids[:0]
		return true
	}
	if len(out.ids)-len(idsTag) < keyDepth(out) {
		out.ids = binary.LittleEndian.AppendUint32(out.ids, id)
	}
	return true
}

// tokenIDValue reads lit as JSON writes a token ID: a plain non-negative
// integer that fits 32 bits (no vocabulary comes near).
func tokenIDValue(lit []byte) (uint32, bool) {
	if len(lit) == 0 || len(lit) > 10 || len(lit) > 1 && lit[0] == '0' {
		return 0, false
	}
	var v uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return uint32(v), v <= 1<<32-1
}

// keyDepth is how much of a token-ID prompt's rendering the key reads.
func keyDepth(out *body) int {
	if out.depth > 0 {
		return out.depth
	}
	return cache.DefaultDepth
}

// promptString reads a prompt string, counted as prompt text, into the
// key's prompt unless one is set: a batch of prompts keys on its first,
// which is where a shared prefix would be. One the peek cuts keys on what
// the peek holds of it (cutPrompt).
func (s *scanner) promptString(out *body) bool {
	start := s.i + 1
	raw, esc, ok := s.str()
	if !ok {
		out.countCut(s.b[start:])
		out.cutPrompt(s.b[start:])
		return false
	}
	out.count(raw, esc)
	if out.keyed && !out.hasText {
		out.prompt, out.hasText = view(raw, esc), true
	}
	return true
}

// promptElem reads one element of a prompt or input list, counting in
// out.listed the elements that are prompts of their own.
func (s *scanner) promptElem(out *body) bool {
	switch s.peek() {
	case '"':
		out.listed++
		return s.promptString(out)
	case '{':
		return s.message(out)
	case '[': // a batch of token-ID lists
		out.listed++
		start := s.i
		s.i++
		c := s.peek()
		out.startIDs(c)
		ok := s.idList(out)
		out.endIDs()
		out.idListEnded(c, s.i-start)
		return ok
	}
	return s.tokenID(out)
}

// idList reads the elements of a token-ID list whose '[' was read.
func (s *scanner) idList(out *body) bool {
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			return st == closed
		}
		if !s.tokenID(out) {
			return false
		}
	}
}

func (s *scanner) messages(out *body) bool {
	if s.peek() != '[' {
		return s.skip()
	}
	// A repeated "messages" replaces the earlier list, as in encoding/json.
	out.nmsg, out.more, out.keyDone, out.rendered = 0, out.more[:0], false, 0
	s.i++
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			return st == closed
		}
		if !s.message(out) {
			return false
		}
	}
}

// message reads one chat message or responses input item:
// {"role": ..., "content": "text" | [{"type": "text", "text": ...}, ...]}.
func (s *scanner) message(out *body) bool {
	if s.peek() != '{' {
		return s.skip()
	}
	s.i++
	var role string
	var texts textKeys
	out.parts, out.single, out.nparts = out.parts[:0], nil, 0
	out.collect = out.keyed && !out.keyDone
	ok := false
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member {
			ok = st == closed
			break
		}
		switch {
		case string(key) == "role":
			// Only a collected message's role is read: an unusual one
			// is decoded and copied.
			raw, esc, ok2 := s.str()
			if ok2 {
				if out.collect {
					role = internRole(raw, esc)
				}
				ok = true
			} else {
				ok = s.skip()
			}
		case string(key) == "content" || string(key) == "text" ||
			string(key) == "output" || string(key) == "arguments":
			// output and arguments: the Responses API's function call
			// items (tool results, tool calls), keyed on what they carry.
			texts.enter(out, key)
			ok = s.content(out)
		case string(key) == "tool_calls": // an assistant's, counted as sent
			ok = s.counted(out)
		case string(key) == "images": // Ollama's /api/chat: base64 strings
			ok = s.images(out)
		default:
			ok = s.skip()
		}
		if !ok {
			break
		}
	}
	// A message the peek ends in counts with the text it holds: the first
	// turns of a body larger than the peek key it, not the turns before.
	if out.collect && (ok || s.i >= len(s.b) && out.nparts > 0) {
		var content string
		if out.nparts == 1 && out.single != nil {
			content = alias(out.single) // one unescaped string: no copy
		} else {
			content = string(out.parts) // parts is reused by the next message
		}
		out.addMessage(cache.Message{Role: role, Content: content})
		out.rendered += len(content) + len(role) + 16
		out.keyDone = role == "user" || out.rendered >= cache.MaxKeyChars
	}
	out.collect = false
	return ok
}

func (out *body) addMessage(m cache.Message) {
	if out.nmsg < len(out.msgs) {
		out.msgs[out.nmsg] = m
		out.nmsg++
		return
	}
	out.more = append(out.more, m)
}

// messageCount is the number of messages collected.
func (out *body) messageCount() int { return out.nmsg + len(out.more) }

// content reads a message's content, appending its text to out.parts.
func (s *scanner) content(out *body) bool {
	switch s.peek() {
	case '"':
		return s.text(out)
	case '[':
		s.i++
		for first := true; ; first = false {
			if st := s.nextElem(first); st != member {
				return st == closed
			}
			if !s.contentPart(out, false) {
				return false
			}
		}
	}
	return s.skip()
}

// toolResult reads a Messages API tool_result block's content: a string or
// a list of blocks, read as a message's content is but one level deep (a
// tool_result inside it is stepped over), so no body makes the scan recurse.
func (s *scanner) toolResult(out *body) bool {
	if s.peek() != '[' {
		return s.content(out)
	}
	s.i++
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			return st == closed
		}
		if !s.contentPart(out, true) {
			return false
		}
	}
}

// contentPart reads one element of a content list: {"type": ..., "text": ...},
// or a string, a text part. nested is set in a tool_result's content.
func (s *scanner) contentPart(out *body, nested bool) bool {
	switch s.peek() {
	case '{':
	case '"':
		// A plain string, which vLLM takes as a text part (a client
		// such as LangChain passes one through).
		return s.text(out)
	default:
		return s.skip()
	}
	s.i++
	var texts textKeys
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member {
			return st == closed
		}
		var ok bool
		switch {
		case string(key) == "text":
			texts.enter(out, key)
			ok = s.text(out)
		case string(key) == "image_url" || string(key) == "source" || string(key) == "input_audio" ||
			string(key) == "audio_url" || string(key) == "video_url":
			// source: the Messages API's image (or document) block;
			// input_audio: {"data": base64}; audio_url, video_url:
			// vLLM's, {"url": ...} as image_url.
			texts.enter(out, key)
			ok = s.image(out)
		case string(key) == "content" && !nested:
			texts.enter(out, key)
			ok = s.toolResult(out) // a Messages API tool_result's
		case string(key) == "input": // a Messages API tool_use's, counted as sent
			ok = s.counted(out)
		default:
			ok = s.skip()
		}
		if !ok {
			return false
		}
	}
}

// text reads a string of a message's text; a value of another type is
// stepped over. A string the peek ends in adds what the peek holds of it
// (addCut).
func (s *scanner) text(out *body) bool {
	if s.peek() != '"' {
		return s.skip()
	}
	start := s.i + 1
	raw, esc, ok := s.str()
	switch {
	case ok:
		out.count(raw, esc)
		if out.collect {
			out.addPart(raw, esc)
		}
	default:
		out.countCut(s.b[start:])
		if out.collect {
			out.addCut(s.b[start:])
		}
	}
	return ok
}

// addCut adds the part of a string that the peek holds when the peek ends
// inside it (raw runs to the end of the peek), at most MaxKeyChars, which
// is all a key reads. A first turn longer than the peek (a pasted
// document, a photo as a data URL) is then keyed on its start, a document
// as it is whole, and the turns of one conversation alike, as their bodies
// agree up to the cut. An escape the peek cuts in two is left out.
func (out *body) addCut(raw []byte) {
	out.addPart(cutString(raw))
}

// cutString returns what a key reads of a string the peek ends in (raw
// runs to the end of the peek): at most MaxKeyChars bytes, less an escape
// the peek cut in two, and whether that has escapes.
func cutString(raw []byte) (_ []byte, esc bool) {
	raw = raw[:min(len(raw), cache.MaxKeyChars)]
	esc = bytes.IndexByte(raw, '\\') >= 0
	if esc {
		i := bytes.LastIndexByte(raw, '\\')
		j := i // the run of backslashes that ends at i starts at j
		for j > 0 && raw[j-1] == '\\' {
			j--
		}
		if (i-j)%2 == 0 && (i+1 == len(raw) || raw[i+1] == 'u' && len(raw)-i < 6) {
			raw = raw[:i] // raw[i] opens an escape that the peek cut
		}
	}
	return raw, esc
}

// cutPrompt keys on a prompt string the peek ends in (raw runs to the end
// of the peek) with what the peek holds of it, as a message the peek ends
// in counts with its text (addCut): a prompt or input longer than the peek
// (a pasted document) keys on its first Depth characters, as whole. An
// empty cut says nothing of the prompt and keys nothing.
func (out *body) cutPrompt(raw []byte) {
	if !out.keyed || out.hasText {
		return
	}
	if raw, esc := cutString(raw); len(raw) > 0 {
		out.prompt, out.hasText = view(raw, esc), true
	}
}

// image reads an image part's image_url, a URL string (Responses API) or
// {"url": ...} (Chat Completions), or a Messages API block's source
// ({"type": "base64", "data": ...} or {"type": "url", "url": ...}), or
// likewise a recording's or a video's, and adds a marker of it to the
// message's text: the same question about two images is two prompts, which the
// server's prefix cache keeps apart too. The marker is a hash of the URL as
// written, so a data URL of megabytes costs its hashing, not a copy.
func (s *scanner) image(out *body) bool {
	if s.peek() != '{' {
		return s.imageURL(out)
	}
	s.i++
	for first := true; ; first = false {
		key, st := s.nextKey(first)
		if st != member {
			return st == closed
		}
		var ok bool
		if string(key) == "url" || string(key) == "data" {
			// Only a string: an object here is stepped over, not read as
			// an image_url again, which would recurse once per level of
			// {"url":{"url":...}} in a hostile body. data: a Messages API
			// source's base64, marked as a data URL is.
			ok = s.imageURL(out)
		} else {
			ok = s.skip()
		}
		if !ok {
			return false
		}
	}
}

// promptImages reads the body's images (Ollama's /api/generate: a list of
// base64 strings beside the prompt) into out.images, a hash of them, when
// the body is keyed: the same prompt about two photos is two prompts. The
// strings are not prompt text.
func (s *scanner) promptImages(out *body) bool {
	out.images = 0
	if !out.keyed || s.peek() != '[' {
		return s.skip()
	}
	var d xxhash.Digest
	d.Reset()
	n := 0
	s.i++
	ok := false
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			ok = st == closed
			break
		}
		if s.peek() != '"' {
			if ok = s.skip(); !ok {
				break
			}
			continue
		}
		start := s.i + 1
		raw, _, ok2 := s.str()
		if !ok2 {
			raw = s.b[start:] // the peek ends in it: what it holds
		}
		_, _ = d.Write(raw)
		_, _ = d.Write([]byte{0})
		n++
		if ok = ok2; !ok {
			break
		}
	}
	if n > 0 {
		out.images = d.Sum64() | 1
	}
	return ok
}

// images reads an Ollama message's images, a list of base64 strings, and
// marks each as an image part is (imageURL): the same question about two
// photos is two prompts.
func (s *scanner) images(out *body) bool {
	if s.peek() != '[' {
		return s.skip()
	}
	s.i++
	for first := true; ; first = false {
		if st := s.nextElem(first); st != member {
			return st == closed
		}
		if !s.imageURL(out) {
			return false
		}
	}
}

// imageURL reads an image's URL string and marks it; a value of another
// type is stepped over.
func (s *scanner) imageURL(out *body) bool {
	if s.peek() != '"' {
		return s.skip()
	}
	start := s.i + 1
	raw, _, ok := s.str()
	switch {
	case !out.collect:
	case ok:
		out.addImage(raw)
	default: // the peek ends in the URL: a marker of what it holds
		out.addImage(s.b[start:])
	}
	return ok
}

// addImage adds the marker "<image %016x>" of url's hash, written into
// parts (nextPart): a marker of its own per image cost an allocation each,
// and a body of empty images (3 bytes each) 8 bytes of text per byte.
func (out *body) addImage(url []byte) {
	h := xxhash.Sum64(url)
	if !out.nextPart() {
		return
	}
	const digits = "0123456789abcdef"
	out.parts = append(out.parts, "<image "...)
	for s := 60; s >= 0; s -= 4 {
		out.parts = append(out.parts, digits[h>>s&0xf])
	}
	out.parts = append(out.parts, '>')
}

// textKeys tracks the keys of one object, a message or a content part,
// whose values add to the message's text, so that a repeated one replaces
// what the object added rather than adding to it: the server reads the
// last value of a repeated key (Python's json, as encoding/json).
type textKeys struct {
	seen         uint8 // the keys read, a bit each (textKeyBit)
	plen, nparts int   // the message's text before the first of them
	single       []byte
}

// enter is called before the value of key is read.
func (t *textKeys) enter(out *body, key []byte) {
	bit := textKeyBit(key)
	switch {
	case t.seen&bit != 0:
		// A repeated key: the object's text so far is dropped (with that
		// of its other keys, which no real body has besides).
		out.parts, out.single, out.nparts = out.parts[:t.plen], t.single, t.nparts
	case t.seen == 0:
		t.plen, t.single, t.nparts = len(out.parts), out.single, out.nparts
	}
	t.seen |= bit
}

// textKeyBit is key's bit in textKeys.seen.
func textKeyBit(key []byte) uint8 {
	switch string(key) {
	case "content":
		return 1
	case "text":
		return 2
	case "output", "source":
		return 4
	case "arguments", "input_audio":
		return 8
	case "image_url":
		return 16
	case "audio_url":
		return 32
	}
	return 64 // video_url
}

// addPart collects one piece of a message's text.
func (out *body) addPart(raw []byte, esc bool) {
	if out.nparts == 0 && !esc {
		out.nparts = 1
		out.single = raw
		return
	}
	if out.nextPart() {
		out.parts = appendText(out.parts, raw, esc)
	}
}

// nextPart counts one more piece of a message's text and readies parts
// for it; false means parts holds cache.MaxKeyChars already and the piece
// is left out. A key reads at most that much of a message (Keyer.Chat),
// and the message's length counts only to that much (keyDone), so the
// key is the one the whole text gives; the text of a hostile body's
// parts (hundreds of thousands of images or one-byte texts) no longer
// grows with them.
func (out *body) nextPart() bool {
	out.nparts++
	if out.nparts == 2 && out.single != nil {
		out.parts = append(out.parts, out.single...)
		out.single = nil
	}
	if len(out.parts) >= cache.MaxKeyChars {
		return false
	}
	if out.nparts > 1 {
		// Parts are joined with "\n", as servers render them, also
		// after an empty one.
		out.parts = append(out.parts, '\n')
	}
	return true
}

// internRole returns the usual chat roles without allocating.
func internRole(raw []byte, esc bool) string {
	switch string(raw) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "developer":
		return "developer"
	case "tool":
		return "tool"
	}
	return unquote(raw, esc)
}

func appendText(dst, raw []byte, esc bool) []byte {
	if esc {
		// The value is at most as long as raw but for invalid UTF-8: one
		// growth, not one per doubling.
		v, ok := appendUnquoted(slices.Grow(dst, len(raw)), raw)
		if ok {
			return v
		}
		// Not valid JSON: the text as written, as unquote gives it.
		dst = v[:len(dst)]
	}
	return append(dst, raw...)
}
