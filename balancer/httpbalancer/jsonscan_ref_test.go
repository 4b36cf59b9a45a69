// The scanner as it was at c66efec, before it lost its closures: the
// reference that FuzzScannerMatchesReference holds the current one to.
// Later changes of what is read (function call items, image parts) are
// made here too.

package httpbalancer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb/cache"
)

type refScanner struct {
	b []byte
	i int
}

func (s *refScanner) ws() {
	if s.i < len(s.b) && s.b[s.i] > ' ' {
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

func (s *refScanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *refScanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func (s *refScanner) str() (raw, quoted []byte, esc, ok bool) {
	if s.peek() != '"' {
		return nil, nil, false, false
	}
	start := s.i + 1
	for j := start; j <= len(s.b); {
		k := bytes.IndexByte(s.b[j:], '"')
		if k < 0 {
			break
		}
		q := j + k
		bs := 0
		for p := q - 1; p >= start && s.b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			raw = s.b[start:q]
			s.i = q + 1
			return raw, s.b[start-1 : q+1], bytes.IndexByte(raw, '\\') >= 0, true
		}
		j = q + 1
	}
	s.i = len(s.b)
	return nil, nil, false, false
}

func refDecode(raw, quoted []byte, esc bool) string {
	if esc {
		var v string
		if json.Unmarshal(quoted, &v) == nil {
			return v
		}
	}
	return string(raw)
}

// refTextLen is the bytes a prompt string counts: its value's, as
// encoding/json decodes it; for a string it rejects, or whose bytes are not
// UTF-8 (which it would replace), the string less what escSaved says its
// escapes take beyond their values.
func refTextLen(raw, quoted []byte, esc bool) int {
	if !esc {
		return len(raw)
	}
	var v string
	if json.Unmarshal(quoted, &v) == nil && utf8.Valid(raw) {
		return len(v)
	}
	return len(raw) - escSaved(raw)
}

func refView(raw, quoted []byte, esc bool) string {
	if esc {
		return refDecode(raw, quoted, esc)
	}
	return refAlias(raw)
}

func refAlias(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

var refModels [64]atomic.Pointer[string]

const refMaxInternModel = 256

func refInternModel(raw, quoted []byte, esc bool) string {
	if esc || len(raw) > refMaxInternModel {
		return refDecode(raw, quoted, esc)
	}
	h := uint32(2166136261)
	for _, c := range raw {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &refModels[h%uint32(len(refModels))]
	if p := slot.Load(); p != nil && *p == string(raw) {
		return *p
	}
	m := string(raw)
	slot.Store(&m)
	return m
}

func refIsDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r', ':':
		return true
	}
	return false
}

func (s *refScanner) skip() bool {
	s.ws()
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			if _, _, _, ok := s.str(); !ok {
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
			if depth == 0 {
				start := s.i
				for s.i < len(s.b) && !refIsDelim(s.b[s.i]) {
					s.i++
				}
				return s.i > start && s.i < len(s.b)
			}
		}
		s.i++
	}
	return false
}

func (s *refScanner) scalar() ([]byte, bool) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && !refIsDelim(s.b[s.i]) {
		if c := s.b[s.i]; c == '"' || c == '{' || c == '[' {
			return nil, false
		}
		s.i++
	}
	return s.b[start:s.i], s.i > start && s.i < len(s.b)
}

func (s *refScanner) integer() (int, bool) {
	if s.peek() == '"' {
		raw, quoted, esc, ok := s.str()
		if !ok {
			return 0, false
		}
		v, ok := refStrAsInt(refDecode(raw, quoted, esc))
		if !ok || v < 0 || v > 1<<31-1 {
			return 0, true
		}
		return int(v), true
	}
	if c := s.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, s.skip()
	}
	lit, ok := s.scalar()
	if !ok {
		return 0, false
	}
	n := 0
	for _, c := range lit {
		if c < '0' || c > '9' {
			// A whole number written with a fraction or exponent.
			var v float64
			if json.Unmarshal(lit, &v) != nil || v < 0 || v > 1<<31-1 || v != math.Trunc(v) {
				return 0, true
			}
			return int(v), true
		}
		n = n*10 + int(c-'0')
		if n > 1<<31-1 {
			return 0, true
		}
	}
	return n, true
}

func (s *refScanner) object(field func(key []byte) bool) bool {
	if s.peek() != '{' {
		return s.skip()
	}
	s.i++
	if s.eat('}') {
		return true
	}
	for {
		key, quoted, esc, ok := s.str()
		if !ok || !s.eat(':') {
			return false
		}
		if esc {
			var k string
			if json.Unmarshal(quoted, &k) == nil {
				key = []byte(k)
			}
		}
		ok = field(key)
		if !ok {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat('}')
	}
}

func (s *refScanner) array(elem func() bool) bool {
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat(']')
	}
}

type refBody struct {
	images    uint64
	model     string
	stream    bool
	maxTokens int
	bounds    map[string]int // the last bound each key gave
	n         int
	prompts   int
	chars     int
	cacheKey  string
	cacheSalt string

	prevResponse string
	conversation string

	keyed   bool
	system  string
	msgs    [4]cache.Message
	nmsg    int
	more    []cache.Message
	prompt  string
	hasText bool
	// promptFrom is the top-level key whose value set prompt or ids.
	promptFrom string
	parts      []byte
	single     []byte
	nparts     int

	keyDone  bool
	rendered int
	collect  bool

	ids     []byte
	idState uint8

	idCount, idBytes int
}

func (out *refBody) startIDs(c byte) {
	if out.keyed && !out.hasText && out.idState == 0 && (c == '-' || c >= '0' && c <= '9') {
		out.idState = idsCollecting
		out.ids = []byte(idsTag)
	}
}

func (out *refBody) endIDs() {
	if out.idState == idsCollecting {
		out.idState = idsDone
		if len(out.ids) > len(idsTag) && !out.hasText {
			out.prompt, out.hasText = string(out.ids), true
		}
	}
}

// refTokenIDValue is tokenIDValue by another route: what parses as a
// uint32 and prints back the same.
func refTokenIDValue(lit []byte) (uint32, bool) {
	v, err := strconv.ParseUint(string(lit), 10, 32)
	return uint32(v), err == nil && strconv.FormatUint(v, 10) == string(lit)
}

func (s *refScanner) tokenID(out *refBody) bool {
	out.chars += 4
	out.idCount++
	if out.idState != idsCollecting {
		return s.skip()
	}
	lit, ok := s.scalar()
	if !ok {
		return false
	}
	id, ok := refTokenIDValue(lit)
	if !ok {
		out.idState, out.ids = idsDone, nil
		return true
	}
	if len(out.ids)-len(idsTag) < cache.DefaultDepth {
		out.ids = binary.LittleEndian.AppendUint32(out.ids, id)
	}
	return true
}

// idArray reads a list whose first element starts collection when it is
// an ID, and ends it after the list.
func (s *refScanner) idArray(out *refBody, elem func() bool) bool {
	first := true
	s.ws()
	start := s.i
	var c byte
	ok := s.array(func() bool {
		if first {
			first = false
			c = s.peek()
			out.startIDs(c)
		}
		return elem()
	})
	out.endIDs()
	if c == '-' || '0' <= c && c <= '9' {
		out.idBytes += s.i - start // the list's bytes, brackets included
	}
	return ok
}

func refParseBody(b []byte, keyed bool, out *refBody) {
	out.keyed = keyed
	if len(b) >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF {
		b = b[3:]
	}
	s := &refScanner{b: b}
	out.bounds = map[string]int{}
	defer func() {
		for _, n := range out.bounds {
			out.maxTokens = max(out.maxTokens, n)
		}
	}()
	s.object(func(key []byte) bool {
		switch k := string(key); k {
		case "model":
			out.model = ""
			if s.peek() != '"' {
				return s.skip()
			}
			raw, quoted, esc, ok := s.str()
			if ok {
				out.model = refInternModel(raw, quoted, esc)
			}
			return ok
		case "stream":
			// pydantic's lax bool: true, 1 or 1.0, or one of its
			// strings for true.
			out.stream = false
			if s.peek() == '"' {
				raw, quoted, esc, ok := s.str()
				if ok {
					switch v := refDecode(raw, quoted, esc); {
					case v == "1":
						out.stream = true
					default:
						for _, t := range []string{"t", "y", "on", "yes", "true"} {
							if len(v) == len(t) && strings.Map(refASCIILower, v) == t {
								out.stream = true
							}
						}
					}
				}
				return ok
			}
			if c := s.peek(); c != 't' && c != 'f' && c != '-' && (c < '0' || c > '9') {
				return s.skip()
			}
			lit, ok := s.scalar()
			var v float64
			out.stream = ok && (string(lit) == "true" || refJSONNumber(lit) && json.Unmarshal(lit, &v) == nil && v == 1)
			return ok
		case "max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens":
			// The last of a repeated key, as Python's json reads it.
			n, ok := s.integer()
			out.bounds[k] = n
			return ok
		case "n":
			var ok bool
			out.n, ok = s.integer()
			return ok
		case "parameters", "sampling_params":
			// The value replaces an earlier one of the key: its bound is
			// its last max_new_tokens, a list's the largest of its
			// objects'.
			out.bounds[k] = 0
			bound := 0
			params := func() bool {
				bound = 0
				return s.object(func(key []byte) bool {
					switch string(key) {
					case "max_new_tokens":
						n, ok := s.integer()
						bound = n
						return ok
					case "n":
						var ok bool
						out.n, ok = s.integer()
						return ok
					}
					return s.skip()
				})
			}
			if s.peek() != '[' {
				ok := params()
				out.bounds[k] = bound
				return ok
			}
			// SGLang's list, an object per prompt: the largest n of
			// the objects that give one.
			var ns []int
			most := 0
			ok := s.array(func() bool {
				if s.peek() != '{' {
					return s.skip()
				}
				saved := out.n
				out.n = -1
				ok := params()
				most = max(most, bound)
				if out.n >= 0 {
					ns = append(ns, out.n)
				}
				out.n = saved
				return ok
			})
			if len(ns) > 0 {
				out.n = slices.Max(ns)
			}
			out.bounds[k] = most
			return ok
		case "messages":
			return s.messages(out)
		case "prompt", "text", "input_ids":
			out.refPromptKey(k)
			n, ok := s.promptValue(out)
			out.refPromptKeyed(k)
			out.prompts = max(out.prompts, n)
			return ok
		case "input", "inputs", "text_input", "query", "documents", "texts",
			"text_1", "text_2", "queries", "data_1", "data_2":
			out.refPromptKey(k)
			_, ok := s.promptValue(out)
			out.refPromptKeyed(k)
			return ok
		case "tools", "functions":
			return s.counted(out)
		case "images":
			out.images = 0
			if !out.keyed || s.peek() != '[' {
				return s.skip()
			}
			var all []byte
			n := 0
			ok := s.array(func() bool {
				if s.peek() != '"' {
					return s.skip()
				}
				start := s.i + 1
				raw, _, _, ok := s.str()
				if !ok {
					raw = s.b[start:]
				}
				all = append(append(all, raw...), 0)
				n++
				return ok
			})
			if n > 0 {
				out.images = xxhash.Sum64(all) | 1
			}
			return ok
		case "instructions", "system":
			out.system = ""
			out.parts, out.single, out.nparts = out.parts[:0], nil, 0
			out.collect = out.keyed
			ok := s.content(out)
			if ok && out.collect && out.nparts > 0 {
				if out.nparts == 1 && out.single != nil {
					out.system = refAlias(out.single)
				} else {
					out.system = string(out.parts)
				}
			}
			out.collect = false
			return ok
		case "prompt_cache_key":
			return s.stringInto(&out.cacheKey)
		case "cache_salt":
			return s.stringInto(&out.cacheSalt)
		case "conversation":
			if s.peek() != '{' {
				return s.stringInto(&out.conversation)
			}
			out.conversation = ""
			return s.object(func(key []byte) bool {
				if string(key) == "id" {
					return s.stringInto(&out.conversation)
				}
				return s.skip()
			})
		case "previous_response_id":
			return s.stringInto(&out.prevResponse)
		}
		return s.skip()
	})
}

// promptValue also returns the prompts the value holds: a string is one,
// and so is each string or list in a list, as far as the body goes.
func (s *refScanner) promptValue(out *refBody) (int, bool) {
	switch s.peek() {
	case '"':
		start := s.i + 1
		raw, quoted, esc, ok := s.str()
		if !ok {
			out.cutPrompt(s.b[start:])
			return 1, false
		}
		out.chars += refTextLen(raw, quoted, esc)
		if out.keyed && !out.hasText {
			out.prompt, out.hasText = refView(raw, quoted, esc), true
		}
		return 1, true
	case '[':
		prompts := 0
		ok := s.idArray(out, func() bool {
			if c := s.peek(); c == '"' || c == '[' {
				prompts++
			}
			switch s.peek() {
			case '"':
				start := s.i + 1
				raw, quoted, esc, ok := s.str()
				if !ok {
					out.cutPrompt(s.b[start:])
				}
				if ok {
					out.chars += refTextLen(raw, quoted, esc)
					if out.keyed && !out.hasText {
						out.prompt, out.hasText = refView(raw, quoted, esc), true
					}
				}
				return ok
			case '{':
				return s.message(out)
			case '[':
				return s.idArray(out, func() bool { return s.tokenID(out) })
			}
			return s.tokenID(out)
		})
		return prompts, ok
	}
	return 0, s.skip()
}

func (s *refScanner) messages(out *refBody) bool {
	if s.peek() != '[' {
		return s.skip()
	}
	// A repeated "messages" replaces the earlier list, as in encoding/json.
	out.nmsg, out.more, out.keyDone, out.rendered = 0, out.more[:0], false, 0
	return s.array(func() bool { return s.message(out) })
}

func (s *refScanner) message(out *refBody) bool {
	if s.peek() != '{' {
		return s.skip()
	}
	var role string
	var texts refTextKeys
	out.parts, out.single, out.nparts = out.parts[:0], nil, 0
	out.collect = out.keyed && !out.keyDone
	ok := s.object(func(key []byte) bool {
		switch string(key) {
		case "role":
			raw, quoted, esc, ok := s.str()
			if !ok {
				return s.skip()
			}
			role = refInternRole(raw, quoted, esc)
			return true
		case "content", "text", "output", "arguments":
			texts.enter(out, string(key))
			return s.content(out)
		case "tool_calls":
			return s.counted(out)
		case "images":
			if s.peek() != '[' {
				return s.skip()
			}
			return s.array(func() bool {
				if s.peek() != '"' {
					return s.skip()
				}
				return s.imageURL(out)
			})
		}
		return s.skip()
	})
	if out.collect && (ok || s.i >= len(s.b) && out.nparts > 0) {
		var content string
		if out.nparts == 1 && out.single != nil {
			content = refAlias(out.single)
		} else {
			content = string(out.parts)
		}
		out.addMessage(cache.Message{Role: role, Content: content})
		out.rendered += len(content) + len(role) + 16
		out.keyDone = role == "user" || out.rendered >= cache.MaxKeyChars
	}
	out.collect = false
	return ok
}

func (out *refBody) addMessage(m cache.Message) {
	if out.nmsg < len(out.msgs) {
		out.msgs[out.nmsg] = m
		out.nmsg++
		return
	}
	out.more = append(out.more, m)
}

func (s *refScanner) content(out *refBody) bool {
	switch s.peek() {
	case '"':
		start := s.i + 1
		raw, quoted, esc, ok := s.str()
		if ok {
			out.chars += refTextLen(raw, quoted, esc)
			if out.collect {
				out.addPart(raw, quoted, esc)
			}
		} else if out.collect {
			out.addCut(s.b[start:])
		}
		return ok
	case '[':
		return s.array(func() bool { return s.contentPart(out, false) })
	}
	return s.skip()
}

func (s *refScanner) counted(out *refBody) bool {
	s.ws()
	start := s.i
	ok := s.skip()
	if ok {
		out.chars += s.i - start - escSaved(s.b[start:s.i])
	}
	return ok
}

func (s *refScanner) toolResult(out *refBody) bool {
	if s.peek() != '[' {
		return s.content(out)
	}
	return s.array(func() bool { return s.contentPart(out, true) })
}

func (s *refScanner) contentPart(out *refBody, nested bool) bool {
	if s.peek() == '"' {
		return s.content(out)
	}
	if s.peek() != '{' {
		return s.skip()
	}
	var texts refTextKeys
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "image_url", "source", "input_audio", "audio_url", "video_url":
			texts.enter(out, string(key))
			return s.image(out)
		}
		if string(key) == "content" && !nested {
			texts.enter(out, string(key))
			return s.toolResult(out)
		}
		if string(key) == "input" {
			return s.counted(out)
		}
		if string(key) != "text" {
			return s.skip()
		}
		texts.enter(out, string(key))
		if s.peek() == '"' {
			start := s.i + 1
			if _, _, _, ok := (&refScanner{b: s.b, i: s.i}).str(); !ok {
				s.i = len(s.b)
				if out.collect {
					out.addCut(s.b[start:])
				}
				return false
			}
		}
		raw, quoted, esc, ok := s.str()
		if !ok {
			return s.skip()
		}
		out.chars += refTextLen(raw, quoted, esc)
		if out.collect {
			out.addPart(raw, quoted, esc)
		}
		return true
	})
}

// imageURL marks the URL string the scanner is at.
func (s *refScanner) imageURL(out *refBody) bool {
	start := s.i + 1
	raw, _, _, ok := s.str()
	if !ok {
		if out.collect && s.peek() == 0 {
			marker := fmt.Appendf(nil, "<image %016x>", xxhash.Sum64(s.b[start:]))
			out.addPart(marker, marker, false)
		}
		return s.skip()
	}
	if out.collect {
		marker := fmt.Appendf(nil, "<image %016x>", xxhash.Sum64(raw))
		out.addPart(marker, marker, false)
	}
	return true
}

func (s *refScanner) image(out *refBody) bool {
	url := func() bool { return s.imageURL(out) }
	switch s.peek() {
	case '"':
		return url()
	case '{':
		return s.object(func(key []byte) bool {
			if string(key) != "url" && string(key) != "data" || s.peek() != '"' {
				return s.skip()
			}
			return url()
		})
	}
	return s.skip()
}

// addCut is body.addCut, decoding with encoding/json.
func (out *refBody) addCut(raw []byte) {
	raw, esc := refCutString(raw)
	out.addPart(raw, []byte(`"`+string(raw)+`"`), esc)
}

func refCutString(raw []byte) ([]byte, bool) {
	raw = raw[:min(len(raw), cache.MaxKeyChars)]
	esc := bytes.IndexByte(raw, '\\') >= 0
	if esc {
		i := bytes.LastIndexByte(raw, '\\')
		n := 0
		for p := i; p >= 0 && raw[p] == '\\'; p-- {
			n++
		}
		if n%2 == 1 && (i+1 == len(raw) || raw[i+1] == 'u' && len(raw)-i < 6) {
			raw = raw[:i]
		}
	}
	return raw, esc
}

// cutPrompt is body.cutPrompt.
func (out *refBody) cutPrompt(raw []byte) {
	if !out.keyed || out.hasText {
		return
	}
	if raw, esc := refCutString(raw); len(raw) > 0 {
		out.prompt, out.hasText = refView(raw, []byte(`"`+string(raw)+`"`), esc), true
	}
}

func (out *refBody) addPart(raw, quoted []byte, esc bool) {
	out.nparts++
	if out.nparts == 1 && !esc {
		out.single = raw
		return
	}
	if out.nparts == 2 && out.single != nil {
		out.parts = append(out.parts, out.single...)
		out.single = nil
	}
	if out.nparts > 1 {
		// Parts are joined with "\n", as servers render them, also
		// after an empty one.
		out.parts = append(out.parts, '\n')
	}
	out.parts = refAppendText(out.parts, raw, quoted, esc)
}

func refInternRole(raw, quoted []byte, esc bool) string {
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
	return refDecode(raw, quoted, esc)
}

func refAppendText(dst, raw, quoted []byte, esc bool) []byte {
	if esc {
		return append(dst, refDecode(raw, quoted, esc)...)
	}
	return append(dst, raw...)
}

// stringInto reads a string value into *dst; another type clears it.
func (s *refScanner) stringInto(dst *string) bool {
	*dst = ""
	if s.peek() != '"' {
		return s.skip()
	}
	raw, quoted, esc, ok := s.str()
	if ok {
		*dst = refView(raw, quoted, esc)
	}
	return ok
}

// refJSONInt is a JSON integer, as jiter's NumberInt::from_bytes takes it.
var refJSONInt = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// refStrAsInt is pydantic-core's str_as_int (src/input/shared.rs) line by
// line: a JSON integer, else the string cleaned by clean_int_str. ok false:
// pydantic refuses the string (or its value is beyond int64).
func refStrAsInt(str string) (int64, bool) {
	if refJSONInt.MatchString(str) {
		v, err := strconv.ParseInt(str, 10, 64)
		return v, err == nil
	}
	cleaned, ok := refCleanIntStr(str)
	if !ok || !refJSONInt.MatchString(cleaned) {
		return 0, false
	}
	v, err := strconv.ParseInt(cleaned, 10, 64)
	return v, err == nil
}

func refCleanIntStr(s string) (string, bool) {
	lenBefore := len(s)
	s = strings.TrimSpace(s)
	if suffix, ok := strings.CutPrefix(s, "+"); ok {
		if strings.HasPrefix(suffix, "-") {
			return "", false
		}
		s = suffix
	}
	negative := false
	if suffix, ok := strings.CutPrefix(s, "-"); ok {
		if strings.HasPrefix(suffix, "-") || strings.HasPrefix(suffix, "+") {
			return "", false
		}
		negative, s = true, suffix
	}
	s, ok := refStripLeadingZeros(s)
	if !ok {
		return "", false
	}
	if i := strings.Index(s, "."); i >= 0 {
		if d := s[i+1:]; d != "" && strings.Trim(d, "0") == "" {
			s = s[:i]
		}
	}
	sign := ""
	if negative {
		sign = "-"
	}
	if stripped, ok := refStripUnderscores(s); ok {
		return sign + stripped, true
	}
	if lenBefore == len(s) {
		return "", false
	}
	return sign + s, true
}

func refStripLeadingZeros(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	switch c := s[0]; {
	case c == '0':
	case c >= '1' && c <= '9' || c == '-':
		return s, true
	default:
		return "", false
	}
	for i, c := range s[1:] {
		i++
		switch {
		case c == '0' || c == '_':
		case c >= '1' && c <= '9' || c == '-':
			return s[i:], true
		case c == '.':
			return s[i-1:], true
		default:
			return "", false
		}
	}
	return s[len(s)-1:], true
}

func refStripUnderscores(s string) (string, bool) {
	if strings.HasPrefix(s, "_") || strings.HasSuffix(s, "_") || !strings.Contains(s, "_") || strings.Contains(s, "__") {
		return "", false
	}
	return strings.ReplaceAll(s, "_", ""), true
}

// refPromptKey forgets the prompt when it came from the key k, which is
// repeated: the last value of a repeated key is the prompt.
func (out *refBody) refPromptKey(k string) {
	switch k {
	case "prompt", "text", "input_ids", "input", "inputs", "text_input":
		if out.promptFrom == k {
			out.prompt, out.hasText, out.promptFrom = "", false, ""
			out.idState, out.ids = 0, nil
		}
	}
}

// refPromptKeyed notes that the prompt, or the ID list looked at, came
// from k unless it came from an earlier key.
func (out *refBody) refPromptKeyed(k string) {
	switch k {
	case "prompt", "text", "input_ids", "input", "inputs", "text_input":
		if out.promptFrom == "" && (out.hasText || out.idState != 0) {
			out.promptFrom = k
		}
	}
}

// refTextKeys is textKeys: a repeated key of a message or content part
// drops the text the object added before it.
type refTextKeys struct {
	seen   map[string]bool
	parts  []byte
	single []byte
	nparts int
}

func (t *refTextKeys) enter(out *refBody, key string) {
	switch {
	case t.seen[key]:
		out.parts = append(out.parts[:0], t.parts...)
		out.single, out.nparts = t.single, t.nparts
	case len(t.seen) == 0:
		t.parts = slices.Clone(out.parts)
		t.single, t.nparts = out.single, out.nparts
	}
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	t.seen[key] = true
}

// refASCIILower lowers ASCII letters only, as Rust's eq_ignore_ascii_case
// compares (pydantic-core's str_as_bool).
func refASCIILower(r rune) rune {
	if 'A' <= r && r <= 'Z' {
		return r + 'a' - 'A'
	}
	return r
}

// refJSONNumber reports whether lit is a number as RFC 8259 writes it.
func refJSONNumber(lit []byte) bool {
	var v any
	return len(lit) > 0 && (lit[0] == '-' || lit[0] >= '0' && lit[0] <= '9') && json.Unmarshal(lit, &v) == nil
}
