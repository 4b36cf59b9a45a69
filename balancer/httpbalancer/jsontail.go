package httpbalancer

import (
	"bytes"
	"slices"
)

// Reading past the peek. The OpenAI SDKs write a chat request's "messages"
// before its "model" (openai-go's struct order, openai-python's argument
// order), and "stream", "max_completion_tokens" and "prompt_cache_key" after
// both (and fields the SDKs do not know, such as vLLM's "cache_salt", after
// everything, as extra fields). A request larger than the peek, such as one carrying an image as a
// data URL or a long document, would then be routed without its model: in a
// fleet serving several models, to an endpoint that may not serve it.
//
// Those bodies are nearly always held in memory (http.NewRequest over a
// bytes.Reader, strings.Reader or bytes.Buffer, as both SDKs make them), so
// the rest can be read without taking it from the caller or buffering it:
// readTail steps over the body's top-level structure in small chunks copied
// with ReadAt, notes where each top-level member of interest starts and ends,
// and parses just those members. Strings, which are nearly all of such a
// body, are skipped with bytes.IndexByte, so the cost is about that of a
// memory copy of the body. Nothing it reads is retained.

// tailKeys are the top-level members read from the rest of a body: the
// facts parseBody reads outside the prompt. The prompt text itself is not:
// the affinity key covers what the peek holds. The system prompt given apart
// from the messages is, as it opens the key: the Anthropic SDKs write a
// Messages API body's "system" after its "messages", and openai-python a
// Responses API body's "instructions" after its "input" (their arguments'
// alphabetical order), so a conversation whose later turns outgrow the
// peek would lose it from its key and move off its cache. But the size of a batch
// (the prompts of a list given as prompt, text or input_ids) is counted
// as the scan steps over it (topScan.prompts): the output bound is per
// prompt, and a batch is what most often outgrows the peek.
var tailKeys = [...]string{
	"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens",
	"max_new_tokens", "parameters", "prompt_cache_key", "conversation", "previous_response_id", "n",
	"sampling_params", "cache_salt", "system", "instructions",
}

// maxTailKey is the length of the longest of tailKeys.
const maxTailKey = len("max_completion_tokens")

// maxTailValue bounds the size of one member read from the rest of a body.
// A larger one is not read: its field keeps what the peek read of it (a
// TGI grammar can take "parameters" past the bound; no other member comes
// near it). A system prompt (system, instructions) is read up to the size of
// the peek instead (topScan.systemMax): a coding agent's runs to tens of
// KB, and one that a smaller body of the conversation held whole in its
// peek must count in the key of a larger one too.
const maxTailValue = 16 << 10

// tailFields is the fields of body each of tailKeys sets, a bit each:
// TGI's parameters and SGLang's sampling_params set the output bound and
// the choices.
var tailFields = [len(tailKeys)]uint16{fModel, fStream, fMaxTokens, fMaxTokens, fMaxTokens, fMaxTokens, fMaxTokens | fN,
	fCacheKey, fConversation, fPrevResponse, fN, fMaxTokens | fN, fCacheSalt, fSystem, fSystem}

const (
	fModel = 1 << iota
	fStream
	fMaxTokens
	fCacheKey
	fConversation
	fPrevResponse
	fN
	fCacheSalt
	fSystem
)

// tailChunk is how much of the body readTail copies at a time.
const tailChunk = 4096

// Where topScan is, at the top level of the body's object.
const (
	tsStart  = iota // before the '{'
	tsKey           // before a key, a ',' or the '}'
	tsInKey         // in a key's string
	tsColon         // after a key
	tsValue         // after the colon
	tsScalar        // in a number or literal
	tsInVal         // in a string, object or array value
	tsDone          // the closing '}' was read
	tsBroken        // not an object, or malformed at the top level
)

// span is a member's bytes in the body: from its key's opening quote to the
// end of its value. hi == 0: not seen; lo < 0: seen with a value too large.
type span struct{ lo, hi int64 }

// topScan walks a JSON object's top level over chunks of the body, noting
// the span of the last occurrence of each of tailKeys (a repeated key
// overrides, as in encoding/json). It never recurses and keeps a fixed
// amount of state whatever the body holds.
type topScan struct {
	m     *memBody
	ph    int
	depth int   // bracket depth; 1 inside the top-level object
	inStr bool  // inside a string
	esc   bool  // the next chunk's first byte is escaped
	keyLo int64 // the current member's key: opening quote
	keyHi int64 // one past its closing quote
	valLo int64 // start of its value
	found [len(tailKeys)]span
	strLo int64 // opening quote of the value string being read
	// inline is the bytes of data URLs (images, audio as base64) in the
	// body's values, and of the strings of "data" members (base64 without
	// a data URL's prefix: input_audio, the Messages API's sources) and of
	// "images" lists (Ollama's base64 photos): most of a multimodal body,
	// none of it prompt text.
	inline int64
	lastLo int64 // the last string in a value: opening quote
	lastHi int64 // one past its closing quote
	data   bool  // a "data" key and its colon were read: its value is next
	inData bool  // the string being read is a "data" member's value
	images bool  // an "images" key and its colon were read: its list is next
	// imagesAt is the depth of the strings of the "images" list being
	// read, or 0.
	imagesAt int
	// The current member's value is a list (list) with elems strings and
	// lists among its elements so far, or a string (elems 1); prompts is
	// the most elems of a prompt, text or input_ids member, as parseBody
	// counts body.prompts.
	list    bool
	elems   int
	prompts int
	// systemMax bounds a system prompt read (see maxTailValue).
	systemMax int64
}

// minInline is the shortest string looked at as a possible data URL or
// "data" member: a shorter one hardly moves a size estimate.
const minInline = 256

// valueStringEnded notes a value string that ended at end (one past its
// closing quote) when it is a data URL or a "data" member's value.
func (t *topScan) valueStringEnded(end int64) {
	t.lastLo, t.lastHi = t.strLo, end
	n := end - t.strLo
	if n < minInline {
		return
	}
	var p [128]byte
	if t.inData || isDataURL(p[:t.m.readAt(p[:min(n, int64(len(p)))], t.strLo+1)]) {
		t.inline += n
	}
}

// colonInValue notes a colon inside a value: when the string before it
// (the key, in valid JSON) is "data", the value that follows is a data
// member's; when it is "images", a list that follows holds base64 photos
// (Ollama's).
func (t *topScan) colonInValue() {
	t.data = t.isKey(t.lastLo, t.lastHi, `"data"`)
	t.images = t.isKey(t.lastLo, t.lastHi, `"images"`)
}

// isKey reports whether the body's bytes from lo to hi are the quoted key.
func (t *topScan) isKey(lo, hi int64, quoted string) bool {
	if hi-lo != int64(len(quoted)) {
		return false
	}
	var k [len(`"images"`)]byte
	return t.m.readAt(k[:len(quoted)], lo) == len(quoted) && string(k[:len(quoted)]) == quoted
}

// isDataURL reports whether s starts as a data URL (RFC 2397):
// "data:", a media type and parameters without spaces, then a comma (an
// encoder that escapes slashes writes "image\/png": still one).
func isDataURL(s []byte) bool {
	rest, ok := bytes.CutPrefix(s, []byte("data:"))
	if !ok {
		return false
	}
	for _, c := range rest {
		switch {
		case c == ',':
			return true
		case c <= ' ' || c >= 0x7f:
			return false
		}
	}
	return false
}

// skipString steps over a string's contents in b from i, which lies inside
// the string, to its closing quote, as a scan of a stream of chunks does: it
// returns where to go on, whether the string ended (next is then just past
// its closing quote) and whether b ended inside an escape (the escaped byte
// opens the next chunk, which the caller skips). It finds the next quote,
// then the escapes before it, so each byte is looked at a bounded number of
// times however many escapes (a document's "\n"s) lie between two quotes.
func skipString(b []byte, i int) (next int, ended, esc bool) {
	q := len(b)
	if k := bytes.IndexByte(b[i:], '"'); k >= 0 {
		q = i + k
	}
	for {
		k := bytes.IndexByte(b[i:q], '\\')
		if k < 0 {
			break
		}
		if i += k + 2; i > q {
			break // the quote, or the end of b, was escaped
		}
	}
	switch {
	case i > len(b):
		return len(b), false, true
	case i > q:
		return i, false, false // an escaped quote: look for the next one
	case q == len(b):
		return q, false, false // no quote in b
	}
	return q + 1, true, false
}

// feed scans b, the body's bytes from off. It reports whether the scan
// wants more.
func (t *topScan) feed(off int64, b []byte) bool {
	i := 0
	if t.esc {
		t.esc, i = false, 1
	}
	for i < len(b) {
		if t.inStr {
			var ended bool
			if i, ended, t.esc = skipString(b, i); ended {
				t.inStr = false
				t.stringEnded(off + int64(i))
			}
			continue
		}
		c := b[i]
		switch t.ph {
		case tsStart:
			switch c {
			case ' ', '\t', '\n', '\r':
			case '{':
				t.depth, t.ph = 1, tsKey
			default:
				t.ph = tsBroken
				return false
			}
		case tsKey:
			switch c {
			case ' ', '\t', '\n', '\r', ',':
			case '"':
				t.keyLo, t.inStr, t.ph = off+int64(i), true, tsInKey
			case '}':
				t.ph = tsDone
				return false
			default:
				t.ph = tsBroken
				return false
			}
		case tsColon:
			switch c {
			case ' ', '\t', '\n', '\r':
			case ':':
				t.ph = tsValue
			default:
				t.ph = tsBroken
				return false
			}
		case tsValue:
			switch c {
			case ' ', '\t', '\n', '\r':
			case '"':
				t.valLo, t.inStr, t.ph = off+int64(i), true, tsInVal
				t.strLo, t.inData = t.valLo, false
				t.list, t.elems = false, 1
			case '{', '[':
				t.valLo, t.depth, t.ph = off+int64(i), 2, tsInVal
				t.list, t.elems = c == '[', 0
				if c == '[' && t.isKey(t.keyLo, t.keyHi, `"images"`) {
					t.imagesAt = 2 // Ollama's /api/generate
				}
			case ',', '}', ']', ':':
				t.ph = tsBroken
				return false
			default:
				t.valLo, t.ph = off+int64(i), tsScalar
				t.list, t.elems = false, 0
			}
		case tsScalar:
			if isDelim(c) {
				t.member(off + int64(i))
				t.ph = tsKey
				continue // the delimiter is read again as tsKey
			}
		case tsInVal:
			switch c {
			case '"':
				t.inStr, t.strLo = true, off+int64(i)
				t.inData = t.data || t.depth == t.imagesAt
				t.data, t.images = false, false
				if t.depth == 2 && t.list {
					t.elems++ // a prompt of a batch, if the key is one
				}
			case ':':
				t.colonInValue()
			case '{', '[':
				if c == '[' && t.depth == 2 && t.list {
					t.elems++ // a list of token IDs
				}
				if c == '[' && t.images {
					t.imagesAt = t.depth + 1 // Ollama's /api/chat
				}
				t.data, t.images = false, false
				t.depth++
			case '}', ']':
				t.data, t.images = false, false // a "data" member's scalar value ended
				t.depth--
				if t.depth < t.imagesAt {
					t.imagesAt = 0
				}
				if t.depth == 1 {
					t.member(off + int64(i) + 1)
					t.ph = tsKey
				}
			}
		}
		i++
	}
	return true
}

// stringEnded is called at end, one past a closing quote.
func (t *topScan) stringEnded(end int64) {
	if t.ph == tsInVal {
		t.valueStringEnded(end)
	}
	switch {
	case t.ph == tsInKey:
		t.keyHi, t.ph = end, tsColon
	case t.ph == tsInVal && t.depth == 1:
		t.member(end)
		t.ph = tsKey
	}
}

// member records the member whose value ends before end, when its key is
// one of tailKeys (decoded when spelled with escapes, as parseBody reads
// keys: six bytes per character at most, as in "\u006d"), and the prompts
// of a batch.
func (t *topScan) member(end int64) {
	n := t.keyHi - t.keyLo
	if n <= 2 || n > 6*int64(maxTailKey)+2 {
		return
	}
	var kb [6*maxTailKey + 2]byte
	quoted := kb[:t.m.readAt(kb[:n], t.keyLo)]
	if len(quoted) < 2 {
		return
	}
	key := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(key, '\\') >= 0 {
		var kd [maxTailKey]byte // keys longer than any of tailKeys may allocate
		if k, ok := appendUnquoted(kd[:0], key); ok {
			key = k
		}
	}
	switch string(key) {
	case "prompt", "text", "input_ids":
		t.prompts = max(t.prompts, t.elems)
		return
	}
	for k, name := range tailKeys {
		if string(key) == name {
			limit := int64(maxTailValue)
			if tailFields[k] == fSystem {
				limit = max(limit, t.systemMax)
			}
			if end-t.valLo <= limit {
				t.found[k] = span{t.keyLo, end}
			} else {
				t.found[k] = span{-1, -1}
			}
			return
		}
	}
}

// bomLen is the length of the UTF-8 byte order mark b starts with (0 when
// none): the scans of the whole body start past it, as parseBody does.
func bomLen(b []byte) int {
	if bytes.HasPrefix(b, utf8BOM) {
		return len(utf8BOM)
	}
	return 0
}

// peekText estimates the bytes of prompt text in a body of size bytes (-1:
// unknown) of which peek is the start, when the rest cannot be read: the
// body's size less the base64 the peek shows (data URLs, "data" members
// and "images" lists' strings, the one it ends in included), the rest
// taken to hold text in the peek's proportion. A body cut inside a photo
// is then a photo, not a million tokens of text; one without base64 in
// its peek is its size.
func peekText(peek []byte, size int64) int64 {
	size = min(max(size, int64(len(peek))), 1<<40)
	m := memBody{bb: bytes.NewBuffer(peek), n: int64(len(peek))}
	t := topScan{m: &m}
	bom := bomLen(peek)
	t.feed(int64(bom), peek[bom:])
	if t.inStr && t.ph == tsInVal {
		t.valueStringEnded(int64(len(peek))) // the string the peek ends in
	}
	if t.inline == 0 {
		return size
	}
	text := int64(len(peek)) - t.inline
	rest := float64(size-int64(len(peek))) * float64(text) / float64(len(peek))
	return text + int64(rest)
}

// readTail reads the top-level fields among tailKeys from the whole of an
// in-memory body of which head is the start (the peek), and sets them in
// out as parseBody would have from the whole body, and the prompts of its
// batch (a bound: the most of the peek's count and the whole body's). When the body is not a
// well-formed object at its top level, out is left as the peek made it.
func readTail(m *memBody, head []byte, keyed bool, out *body) {
	t := topScan{m: m, systemMax: int64(len(head))}
	// A byte order mark is read past, as parseBody does; it is taken from
	// the body, which has it whole however short the head.
	var mark [3]byte // len(utf8BOM)
	start := int64(bomLen(mark[:m.readAt(mark[:], 0)]))
	off := max(int64(len(head)), start)
	if t.feed(start, head[min(start, int64(len(head))):]) {
		var chunk [tailChunk]byte
		for off < m.n {
			n := m.readAt(chunk[:], off)
			if n == 0 || !t.feed(off, chunk[:n]) {
				break
			}
			off += int64(n)
		}
	}
	if t.ph != tsDone {
		return
	}
	out.textSize, out.sized = m.n-t.inline, true
	// The whole body's batch, of which the peek may hold a part.
	out.prompts = max(out.prompts, t.prompts)
	// The members read, in body order: of two that set one field (n and
	// sampling_params.n), the later wins, as in parseBody. A field whose
	// last member was too large to read (over) keeps the peek's reading,
	// which has the member whole when it lies in the peek.
	var spans [len(tailKeys)]span
	var over uint16
	ns, size := 0, 2
	for k, s := range t.found {
		switch {
		case s.lo < 0:
			over |= tailFields[k]
		case s.hi > 0:
			i := ns
			for ; i > 0 && spans[i-1].lo > s.lo; i-- {
				spans[i] = spans[i-1]
			}
			spans[i], ns = s, ns+1
			size += int(s.hi-s.lo) + 1
		}
	}
	obj := make([]byte, 1, size)
	obj[0] = '{'
	for _, s := range spans[:ns] {
		if len(obj) > 1 {
			obj = append(obj, ',')
		}
		n := len(obj)
		obj = slices.Grow(obj, int(s.hi-s.lo))[:n+int(s.hi-s.lo)]
		m.readAt(obj[n:], s.lo)
	}
	obj = append(obj, '}')
	var tail body
	parseBody(obj, keyed, &tail)
	if over&fModel == 0 {
		out.model = tail.model
	}
	if over&fStream == 0 {
		out.stream = tail.stream
	}
	// The output bound is the largest of its members, as parseBody keeps
	// it, and so are the choices when a member of either was not read: a
	// bound, not a guess.
	if over&fMaxTokens != 0 {
		out.maxTokens = max(out.maxTokens, tail.maxTokens)
	} else {
		out.maxTokens = tail.maxTokens
	}
	if over&fN != 0 {
		out.n = max(out.n, tail.n)
	} else {
		out.n = tail.n
	}
	if !keyed {
		return
	}
	if over&fCacheKey == 0 {
		out.cacheKey = tail.cacheKey
	}
	if over&fConversation == 0 {
		out.conversation = tail.conversation
	}
	if over&fPrevResponse == 0 {
		out.prevResponse = tail.prevResponse
	}
	if over&fCacheSalt == 0 {
		out.cacheSalt = tail.cacheSalt
	}
	if over&fSystem == 0 {
		out.system = tail.system
	}
}
