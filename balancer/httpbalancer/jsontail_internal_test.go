package httpbalancer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tailWant is what encoding/json reads from a whole body for the fields
// readTail fills: the last occurrence of each key wins.
type tailWant struct {
	model, cacheKey, conversation, prevResponse string
	cacheSalt                                   string
	stream                                      bool
	maxTokens, n                                int
}

func tailFromJSON(t *testing.T, b []byte) tailWant {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	var w tailWant
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(m[k], &s)
		return s
	}
	w.model, w.cacheKey, w.prevResponse, w.cacheSalt = str("model"), str("prompt_cache_key"), str("previous_response_id"), str("cache_salt")
	if w.conversation = str("conversation"); w.conversation == "" {
		var c struct{ ID string }
		_ = json.Unmarshal(m["conversation"], &c)
		w.conversation = c.ID
	}
	w.stream = string(m["stream"]) == "true"
	for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens"} {
		var n int
		_ = json.Unmarshal(m[k], &n)
		w.maxTokens = max(w.maxTokens, n)
	}
	var p struct {
		N int `json:"max_new_tokens"`
	}
	_ = json.Unmarshal(m["parameters"], &p)
	w.maxTokens = max(w.maxTokens, p.N)
	var sp struct {
		N int `json:"max_new_tokens"`
		C int `json:"n"`
	}
	_ = json.Unmarshal(m["sampling_params"], &sp)
	w.maxTokens = max(w.maxTokens, sp.N)
	// tailBody sends n at the top level or in sampling_params, not both.
	w.n = sp.C
	_ = json.Unmarshal(m["n"], &w.n)
	return w
}

// tailText returns a string made to trip a scanner of JSON's top level:
// quotes, backslashes and brackets escaped inside it (some at the end, to
// land on chunk boundaries), text that looks like a "model" member, long
// runs like a base64 image, and control characters.
func tailText(r *rand.Rand) string {
	var sb strings.Builder
	for range r.IntN(12) {
		switch r.IntN(8) {
		case 0:
			sb.WriteString(strings.Repeat("A", r.IntN(6000)))
		case 1:
			sb.WriteString(`","model":"decoy"},{"model":"decoy`)
		case 2:
			sb.WriteString(strings.Repeat(`\`, 1+r.IntN(3)))
		case 3:
			sb.WriteString(`{[}]],:`)
		case 4:
			sb.WriteString("\n\t\x01<é😀>")
		default:
			sb.WriteString(strings.Repeat("lorem ipsum ", r.IntN(40)))
		}
	}
	return sb.String()
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// tailBody builds a chat request whose top-level members come in a random
// order, with decoy "model" keys nested in the messages and in metadata,
// sometimes a repeated model, and random whitespace.
func tailBody(r *rand.Rand) []byte {
	ws := func() string { return [...]string{"", "", " ", "\n  ", "\t"}[r.IntN(5)] }
	var msgs []string
	for range 1 + r.IntN(6) {
		if r.IntN(3) == 0 {
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","model":"decoy","content":[{"type":"text","text":%s},{"type":"image_url","image_url":{"url":%s}}]}`,
				quote(tailText(r)), quote("data:image/png;base64,"+strings.Repeat("QUJD", r.IntN(3000)))))
			continue
		}
		msgs = append(msgs, fmt.Sprintf(`{%s"role"%s:%s"user",%s"content":%s}`, ws(), ws(), ws(), ws(), quote(tailText(r))))
	}
	members := []string{`"messages":[` + strings.Join(msgs, ","+ws()) + `]`}
	add := func(p int, m string) {
		if r.IntN(100) < p {
			members = append(members, m)
		}
	}
	add(90, `"model":`+quote(fmt.Sprintf("model-%d\"\\/é", r.IntN(100))))
	add(20, `"model":`+quote(fmt.Sprintf("again-%d", r.IntN(100))))
	add(10, `"model":7`)
	add(60, fmt.Sprintf(`"stream":%t`, r.IntN(2) == 0))
	add(60, fmt.Sprintf(`"max_completion_tokens":%d`, r.IntN(1<<20)))
	add(30, fmt.Sprintf(`"max_tokens":%d`, r.IntN(1<<20)))
	add(20, fmt.Sprintf(`"parameters":{"stop":["]}"],"max_new_tokens":%d}`, r.IntN(1<<20)))
	topN, spN := r.IntN(100) < 30, ""
	if topN {
		members = append(members, fmt.Sprintf(`"n":%d`, r.IntN(8)))
	} else if r.IntN(2) == 0 {
		spN = fmt.Sprintf(`"n":%d,`, r.IntN(8))
	}
	add(15, fmt.Sprintf(`"sampling_params":{%s"max_new_tokens":%d,"stop":"}"}`, spN, r.IntN(1<<20)))
	add(30, `"cache_salt":`+quote(fmt.Sprintf("tenant-%d\t", r.IntN(100))))
	add(50, `"prompt_cache_key":`+quote(fmt.Sprintf("user-%d\n", r.IntN(100))))
	add(20, `"previous_response_id":`+quote(fmt.Sprintf("resp_%d", r.IntN(100))))
	add(20, `"conversation":{"metadata":{"id":"decoy"},"id":`+quote(fmt.Sprintf("conv_%d", r.IntN(100)))+`}`)
	add(30, `"metadata":{"model":"decoy","stream":true,"max_tokens":99,"n":99}`)
	add(30, `"temperature":0.5e-1`)
	add(20, `"tools":[{"type":"function","function":{"name":"f","parameters":{"model":{"type":"string"}}}}]`)
	add(20, `"model_":"decoy"`)
	add(10, `"mod\u0065l":"escaped-key"`)
	r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	var sb strings.Builder
	sb.WriteString(ws() + "{" + ws())
	for i, m := range members {
		if i > 0 {
			sb.WriteString(ws() + "," + ws())
		}
		sb.WriteString(m)
	}
	sb.WriteString(ws() + "}" + ws())
	return []byte(sb.String())
}

// memBodies holds b in each kind of in-memory body inMemory recognizes, one
// of them behind bytes already read, as a caller's reader may be.
func memBodies(b []byte) map[string]io.ReadCloser {
	skipped := bytes.NewReader(append([]byte("read!"), b...))
	_, _ = skipped.Seek(5, io.SeekStart)
	return map[string]io.ReadCloser{
		"bytes.Reader":         io.NopCloser(bytes.NewReader(b)),
		"bytes.Reader, offset": io.NopCloser(skipped),
		"strings.Reader":       io.NopCloser(strings.NewReader(string(b))),
		"bytes.Buffer":         io.NopCloser(bytes.NewBuffer(b)),
	}
}

// TestReadTailMatchesEncodingJSON: a body cut anywhere by the peek, whose
// rest is in memory, yields the top-level model, stream, output bound and
// session IDs encoding/json reads from the whole body, whatever lies in
// between and wherever the peek and the chunks end; also after a UTF-8
// byte order mark, which Python servers read past.
func TestReadTailMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 150 {
		b := tailBody(r)
		want := tailFromJSON(t, b)
		if i%4 == 0 {
			b = append([]byte("\xef\xbb\xbf"), b...)
		}
		cuts := []int{1, len(b) / 2, len(b) - 1, 1 + r.IntN(len(b)-1), 1 + r.IntN(min(len(b)-1, 300))}
		for name, rc := range memBodies(b) {
			m := inMemory(rc)
			require.True(t, m.ok(), name)
			for _, cut := range cuts {
				var got body
				parseBody(b[:cut], true, &got)
				readTail(&m, b[:cut], true, &got)
				require.Equal(t, want, tailWant{got.model, got.cacheKey, got.conversation, got.prevResponse, got.cacheSalt, got.stream, got.maxTokens, got.n},
					"body %d (%d bytes) in a %s, cut at %d:\n%.300s", i, len(b), name, cut, b)
			}
		}
	}
}

// TestReadTailReadsInBodyOrder: of two members that set one field (the
// choices, n and SGLang's sampling_params.n), the later in the body wins,
// as parseBody reads the whole body; the rest's reading took them in a
// fixed order of its own.
func TestReadTailReadsInBodyOrder(t *testing.T) {
	text := `"text":"` + strings.Repeat("x", 200) + `"`
	for _, b := range []string{
		`{"sampling_params":{"n":2},` + text + `,"n":1}`,
		`{"n":1,` + text + `,"sampling_params":{"n":2}}`,
		`{"n":3,"sampling_params":{"n":2},` + text + `,"n":1}`,
	} {
		var want, got body
		parseBody([]byte(b), true, &want)
		parseBody([]byte(b[:20]), true, &got)
		m := inMemory(io.NopCloser(strings.NewReader(b)))
		readTail(&m, []byte(b[:20]), true, &got)
		require.Equal(t, want.n, got.n, b)
	}
}

// TestReadTailLeavesMalformedAlone: when the rest of the body is not a
// well-formed object at its top level, what the peek found stands.
func TestReadTailLeavesMalformedAlone(t *testing.T) {
	for _, b := range []string{
		`{"model":"m","messages":[{"content":"` + strings.Repeat("x", 100) + `"}],"model":"n"`, // never closed
		`{"model":"m","messages":[{"content":"` + strings.Repeat("x", 100) + `"}] "model" "n"}`,
		`{"model":"m","messages":[{"content":"` + strings.Repeat("x", 100) + `"}],"model":}`,
		`{"model":"m","messages":[{"content":"` + strings.Repeat("x", 100) + `}],"model":"n"}`, // string never closed
	} {
		m := inMemory(io.NopCloser(strings.NewReader(b)))
		var got body
		parseBody([]byte(b[:30]), true, &got)
		readTail(&m, []byte(b[:30]), true, &got)
		require.Equal(t, "m", got.model, b)
	}
	// Not an object at all.
	b := `[{"model":"n"}]` + strings.Repeat(" ", 100)
	m := inMemory(io.NopCloser(strings.NewReader(b)))
	var got body
	readTail(&m, []byte(b[:5]), true, &got)
	require.Empty(t, got.model)
}

// TestReadTailBoundsValues: a member of interest larger than maxTailValue
// is not read, and nothing of it is copied: its field keeps what the peek
// read (here, nothing).
func TestReadTailBoundsValues(t *testing.T) {
	huge := strings.Repeat("m", maxTailValue)
	b := `{"messages":[{"content":"` + strings.Repeat("x", 100) + `"}],"model":"` + huge + `","stream":true}`
	m := inMemory(io.NopCloser(strings.NewReader(b)))
	var got body
	readTail(&m, []byte(b[:20]), true, &got)
	require.Empty(t, got.model)
	require.True(t, got.stream)
}

// FuzzReadTail: on any body cut anywhere, readTail does not panic, and on a
// well-formed one it reads what parseBody reads from the whole body, and
// counts the batch (prompts) it counts.
func FuzzReadTail(f *testing.F) {
	for _, s := range append(scanSeeds, batchSeeds...) {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 4 {
		b := tailBody(r)
		f.Add(b, uint16(r.IntN(len(b))))
	}
	for added := 0; added < 4; {
		if b := batchBody(r); len(b) <= 16<<10 { // small inputs mutate fast
			f.Add(b, uint16(r.IntN(len(b))))
			added++
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		if len(b) < 2 {
			return
		}
		c := 1 + int(cut)%(len(b)-1)
		var want, got body
		parseBody(b, true, &want)
		parseBody(b[:c], true, &got)
		m := inMemory(io.NopCloser(bytes.NewReader(b)))
		readTail(&m, b[:c], true, &got)
		if !json.Valid(b) {
			return
		}
		require.Equal(t, want.prompts, got.prompts, "%q cut at %d", b, c)
		if len(b) > maxTailValue {
			return
		}
		require.Equal(t,
			tailWant{want.model, want.cacheKey, want.conversation, want.prevResponse, want.cacheSalt, want.stream, want.maxTokens, want.n},
			tailWant{got.model, got.cacheKey, got.conversation, got.prevResponse, got.cacheSalt, got.stream, got.maxTokens, got.n}, "%q cut at %d", b, c)
	})
}

// BenchmarkReadTail reads the fields after a 1 MiB peek of a 4 MiB chat
// request held in memory, against copying the same bytes out in the same
// chunks (copy), the floor of any scan that does not alias the body: an
// image as a base64 data URL (few quotes, no escapes), and a document with
// an escaped newline every 40 bytes.
func BenchmarkReadTail(b *testing.B) {
	const size, peek = 4 << 20, 1 << 20
	bodies := map[string][]byte{
		"image": []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
			strings.Repeat("iVBORw0KGgo", size/11) + `"}},{"type":"text","text":"What is this?"}]}],"model":"qwen-vl","max_completion_tokens":512,"stream":true}`),
		"document": []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat(`Lorem ipsum dolor sit amet, consectetur\n`, size/41) +
			`"}],"model":"llama","max_completion_tokens":512,"prompt_cache_key":"doc-1"}`),
	}
	for name, doc := range bodies {
		b.Run("body="+name+"/scan", func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				m := inMemory(io.NopCloser(bytes.NewReader(doc)))
				var out body
				readTail(&m, doc[:peek], true, &out)
				if out.model == "" || out.maxTokens != 512 {
					b.Fatal("fields not found")
				}
			}
		})
		b.Run("body="+name+"/copy", func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			var chunk [tailChunk]byte
			for b.Loop() {
				m := inMemory(io.NopCloser(bytes.NewReader(doc)))
				for off := int64(peek); off < m.n; {
					off += int64(m.readAt(chunk[:], off))
				}
			}
		})
	}
}

// TestReadTailLeavesDataURLsOutOfTheSize: past the peek, the bytes of data
// URLs (images as base64) are left out of the size the prompt estimate
// starts from, wherever they lie; text is not.
func TestReadTailLeavesDataURLsOutOfTheSize(t *testing.T) {
	image := "data:image/png;base64," + strings.Repeat("iVBORw0KGgo", 150_000)     // 1.65 MB
	text := strings.Repeat("All work and no play makes Jack a dull boy. ", 40_000) // 1.76 MB
	for _, tc := range []struct {
		name string
		body string
		text int // bytes outside data URLs
	}{
		{"image", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + image + `"}},{"type":"text","text":"Describe."}]}],"model":"m"}`, -1},
		{"image in the responses input", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"` + image + `"},{"type":"input_text","text":"Hi"}]}],"model":"m"}`, -1},
		{"text", `{"messages":[{"role":"user","content":"` + text + `"}],"model":"m"}`, 0},
		{"image, slashes escaped", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + strings.Replace(image, "/", `\/`, 1) + `"}}]}],"model":"m"}`, -2},
		{"text naming data:", `{"messages":[{"role":"user","content":"data: ` + text + `"}],"model":"m"}`, 0},
	} {
		b := []byte(tc.body)
		m := inMemory(io.NopCloser(bytes.NewReader(b)))
		var got body
		readTail(&m, b[:1<<20], true, &got)
		require.True(t, got.sized, tc.name)
		want := int64(len(b))
		switch tc.text {
		case -1:
			want = int64(len(b) - len(image) - 2) // the URL and its quotes
		case -2:
			want = int64(len(b) - len(image) - 3) // and the escape
		}
		require.Equal(t, want, got.textSize, tc.name)
		require.Equal(t, "m", got.model, tc.name)
	}
}

// TestReadTailLeavesInlineDataOutOfTheSize: base64 sent without a data
// URL's prefix, as the value of a "data" member (chat completions'
// input_audio, the Messages API's image and document sources), is no more
// prompt text than a data URL is. Counted, a 1.5 MB recording made a
// request of 400,000 prompt tokens.
func TestReadTailLeavesInlineDataOutOfTheSize(t *testing.T) {
	audio := strings.Repeat("UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQ", 30_000) // 1.6 MB
	escaped, _ := json.Marshal("{\"data\": \"" + audio + "\"}")                               // JSON text in a prompt
	for _, tc := range []struct {
		name   string
		body   string
		inline int // bytes of the body that are not text
	}{
		{"input_audio", `{"messages":[{"role":"user","content":[{"type":"text","text":"Transcribe."},{"type":"input_audio","input_audio":{"data":"` + audio + `","format":"wav"}}]}],"model":"m"}`, len(audio) + 2},
		{"messages api image", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data" : "` + audio + `"}},{"type":"text","text":"What is this?"}]}],"model":"m","max_tokens":9}`, len(audio) + 2},
		{"short data", `{"messages":[{"role":"user","content":[{"type":"x","data":"abc"},{"type":"text","text":"` + audio + `"}]}],"model":"m"}`, 0},
		{"json in a prompt", `{"messages":[{"role":"user","content":` + string(escaped) + `}],"model":"m"}`, 0},
		{"data then another string", `{"x":[{"data":5,"text":"` + audio + `"}],"model":"m"}`, 0},
		{"data then a top-level string", `{"x":{"data":"abc"},"prompt":"` + audio + `","model":"m"}`, 0},
		{"data then a top-level list", `{"x":{"data":5},"prompt":["` + audio + `"],"model":"m"}`, 0},
		{"data then a list element", `{"prompt":[{"data":5},"` + audio + `"],"model":"m"}`, 0},
		{"ollama chat images", `{"model":"m","messages":[{"role":"user","content":"What is this?","images":["` + audio + `", "` + audio + `"]}]}`, 2 * (len(audio) + 2)},
		{"ollama generate images", `{"model":"m","prompt":"What is this?","images" : [ "` + audio + `"]}`, len(audio) + 2},
		{"images then another string", `{"x":[{"images":5,"text":"` + audio + `"}],"model":"m"}`, 0},
		{"images, then a string after the list", `{"x":[{"images":["a"],"text":"` + audio + `"}],"model":"m"}`, 0},
		{"an object in images", `{"x":{"images":[{"t":"` + audio + `"}]},"model":"m"}`, 0},
		{"top-level images, then a prompt", `{"images":[],"prompt":"` + audio + `","model":"m"}`, 0},
		{"top-level images, an object in it", `{"images":[{"t":"` + audio + `"}],"model":"m"}`, 0},
	} {
		b := []byte(tc.body)
		m := inMemory(io.NopCloser(bytes.NewReader(b)))
		var got body
		readTail(&m, b[:1<<20], true, &got)
		require.True(t, got.sized, tc.name)
		require.Equal(t, int64(len(b)-tc.inline), got.textSize, tc.name)
		require.Equal(t, "m", got.model, tc.name)
	}
}

// TestRepeatedBoundKeepsTheLast: Python's json (vLLM, SGLang) keeps the
// last of a repeated key, and so the output bound is the last value of
// each member that gives one (the largest across max_tokens,
// max_completion_tokens, ...), read alike from a body the peek holds
// whole and from one read past the peek. The peek kept the largest of a
// repeated key and the rest of the body its last: a call's bound changed
// with the size of its prompt.
func TestRepeatedBoundKeepsTheLast(t *testing.T) {
	text := `"prompt":"` + strings.Repeat("x", 200) + `"`
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"max_tokens":512,"max_tokens":16,` + text + `}`, 16},
		{`{"max_tokens":16,` + text + `,"max_tokens":512}`, 512},
		{`{"max_tokens":512,` + text + `,"max_tokens":16}`, 16},
		{`{"max_completion_tokens":64,"max_tokens":32,"max_completion_tokens":8,` + text + `}`, 32},
		{`{"parameters":{"max_new_tokens":512},"parameters":{"stop":["x"]},` + text + `}`, 0},
		{`{"parameters":{"max_new_tokens":512},"parameters":7,` + text + `}`, 0},
		{`{"sampling_params":{"max_new_tokens":512,"max_new_tokens":16},` + text + `}`, 16},
		{`{"sampling_params":[{"max_new_tokens":8},{"max_new_tokens":64,"max_new_tokens":4}],` + text + `}`, 8},
		{`{"sampling_params":{"max_new_tokens":512},"sampling_params":[{"max_new_tokens":8}],` + text + `,"max_new_tokens":4}`, 8},
	} {
		var whole body
		parseBody([]byte(c.body), false, &whole)
		require.Equal(t, c.want, whole.maxTokens, "whole: %s", c.body)
		for _, cut := range []int{10, 30, 60, len(c.body) - 1} {
			var got body
			parseBody([]byte(c.body[:cut]), false, &got)
			m := inMemory(io.NopCloser(strings.NewReader(c.body)))
			readTail(&m, []byte(c.body[:cut]), false, &got)
			require.Equal(t, c.want, got.maxTokens, "cut at %d: %s", cut, c.body)
		}
	}
}

// TestStreamAsPydanticReadsIt: vLLM and SGLang validate "stream" with
// pydantic in its lax mode, which reads the strings "true", "yes", "on",
// "1", "t", "y" (in any ASCII case) and the numbers 1 and 1.0 as true:
// such a call streams, and is read so in the peek and past it. Other
// strings, numbers and types are false or fail validation (no stream).
func TestStreamAsPydanticReadsIt(t *testing.T) {
	text := `"prompt":"` + strings.Repeat("x", 200) + `"`
	for _, c := range []struct {
		v    string
		want bool
	}{
		{`true`, true}, {`"true"`, true}, {`"True"`, true}, {`"TRUE"`, true}, {`"yes"`, true}, {`"on"`, true},
		{`"1"`, true}, {`"t"`, true}, {`"Y"`, true}, {`"\u0074rue"`, true}, {`1`, true}, {`1.0`, true}, {`1e0`, true},
		{`false`, false}, {`"false"`, false}, {`"0"`, false}, {`0`, false}, {`0.0`, false}, {`null`, false},
		{`"maybe"`, false}, {`" true"`, false}, {`"true "`, false}, {`"tru"`, false}, {`"yeſ"`, false}, {`"1.0"`, false},
		{`2`, false}, {`-1`, false}, {`1.5`, false}, {`01`, false}, {`[true]`, false}, {`{"a":true}`, false},
	} {
		for _, b := range []string{`{"stream":` + c.v + `,` + text + `}`, `{` + text + `,"stream":` + c.v + `}`} {
			var whole body
			parseBody([]byte(b), false, &whole)
			require.Equal(t, c.want, whole.stream, "whole: %s", b)
			var got body
			parseBody([]byte(b[:5]), false, &got)
			m := inMemory(io.NopCloser(strings.NewReader(b)))
			readTail(&m, []byte(b[:5]), false, &got)
			require.Equal(t, c.want, got.stream, "past the peek: %s", b)
		}
	}
}
