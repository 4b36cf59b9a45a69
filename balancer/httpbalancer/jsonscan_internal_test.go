package httpbalancer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
)

// scanResult is what parseBody hands to Inspect, without the scratch.
type scanResult struct {
	model, cacheKey, system, prompt string
	prevResponse, conversation      string
	cacheSalt                       string
	stream, hasText                 bool
	maxTokens, n, chars             int
	idCount, idBytes                int
	images                          uint64
	msgs                            []cache.Message
}

func scanNew(b []byte, keyed bool) scanResult {
	var o body
	parseBody(b, keyed, &o)
	return scanResult{o.model, o.cacheKey, o.system, o.prompt, o.prevResponse, o.conversation, o.cacheSalt, o.stream, o.hasText, o.maxTokens, o.n, o.chars,
		o.idCount, o.idBytes, o.images, slices.Concat(o.msgs[:o.nmsg], o.more)}
}

func scanRef(b []byte, keyed bool) scanResult {
	var o refBody
	refParseBody(b, keyed, &o)
	return scanResult{o.model, o.cacheKey, o.system, o.prompt, o.prevResponse, o.conversation, o.cacheSalt, o.stream, o.hasText, o.maxTokens, o.n, o.chars,
		o.idCount, o.idBytes, o.images, slices.Concat(o.msgs[:o.nmsg], o.more)}
}

var scanSeeds = []string{
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","image_url":{"url":"u"},"text":"b\u00e9"}],"images":["x"],"content":"c","content":["d",{"text":"e"}]}],"prompt":"p","prompt":[1,2]}`,
	`{"model":"m","prompt":[101, 7,0,13],"cache_salt":"t1"}`,
	"\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"x\"}",
	`{"model":"m","prompt":[[1,2],[3,4]],"max_tokens":3}`,
	`{"prompt": [ 7, 8 , 9 ], "input":[[1, [2, 3], "x"], ["y", 4], [], 5, [-1]]}`,
	`{"prompt":[4294967295,0,9],"input_ids":[[4294967296,1],[0]]}`,
	`{"input_ids":[1,"x",2.5,-1,00,12345678901],"sampling_params":{"n":2,"max_new_tokens":4}}`,
	`{"sampling_params":{"n":2},"text":"abcdefghijklmnopqrstuvwxyz","n":1,"parameters":{"n":3}}`,
	`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":32,"temperature":0}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}`,
	`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}],"instructions":"y"}`,
	`{"prompt":[[1,2],[3]],"model":"m"}`,
	`{"model":"a","model":"b","stream":true,"stream":false}`,
	`{"messages":[{"content":[{"text":"\ud83d\ude00"},{"text":"b"}],"role":"assistant"},{"role":"user","content":"u"},{"role":"user","content":"v"}]}`,
	`{ "messages" : [ {"content":"tell me a story", "role":"user"} ], "model":"m", "stream": true }`,
	`{"model":"a\"b","messages":[{"role":"user","content":"\u00e9t\u00e9"}]}`,
	`{"model":"m","prompt_cache_key":"s1","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","previous_response_id":"resp_1","input":"next","previous_response_id":7}`,
	`{"model":"m","conversation":"conv_1","input":"hi"}`,
	`{"model":"m","conversation":{"metadata":{"id":"x"},"id":"conv_\u00e92"},"input":"hi"}`,
	`{"model":"m","conversation":{"id":3},"conversation":7}`,
	`{"model":"m","previous_response_id":"resp_\u00e9\"x","input":[{"role":"user","content":"next"}]}`,
	`{"inputs":"abcdefgh","parameters":{"max_new_tokens":12,"x":[1,{"a":"]"}]}}`,
	`{"model":"bge","query":"abcd","documents":["abcdefgh",{"text":"abcd"}],"texts":["q"]}`,
	`{"model":"` + strings.Repeat("long model name ", 5) + `","messages":[{"role":"system","content":"` + strings.Repeat(`a \"quoted\" \\ text `, 20) + `"}]}`,
	`{"messages":[{"role":"user","content":"` + strings.Repeat("x", 100) + `\\"}],"model":"m\\\\"}`,
	`{"\u006dodel":"m","max_tokens":1.5,"max_completion_tokens":7,"stream":"yes"}`,
	`{"messages":[1,"a",{"role":5,"content":{"x":1}},{"role":"user","content":[1,{"text":5}]}]}`,
	`[[[[[[[[[[[[[[[[[[[[`,
	`{"model":"\x`,
	`{"messages":[{"role":"user","content":"a"},]}`,
	`{"a":1,}`,
	"",
	`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/cat.png","detail":"low"}},{"type":"text","text":"Describe."}]}]}`,
	`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"},{"type":"input_text","text":"Hi"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":{"url":"x"},"detail":"high"}},{"image_url":7},{"text":"t"}]}]}`,
	`{"model":"m","previous_response_id":"r","input":[{"type":"function_call","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"21"}]}]}`,
	`{"model":"m","max_tokens":9,"system":[{"type":"text","text":"be \"terse\""},{"type":"text","text":"s2"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"text","text":"q"}]}],"system":7}`,
	`{"instructions":"a","instructions":null,"system":"","input":"x"}`,
	`{"n":3,"messages":[{"role":"user","content":"x"}],"max_tokens":5,"n":-1,"n":2}`,
	`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"QUFB","format":"wav"}},{"type":"audio_url","audio_url":{"url":"a"}},{"type":"video_url","video_url":"v"},{"type":"text","text":"t"}]}]}`,
	`{"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]},{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"},{"type":"tool_result","content":[{"text":"deeper"}]}]},{"type":"tool_use","input":{"a":[1]}},{"type":"tool_result","content":"s"}]}],"functions":7}`,
	`{"messages":[{"role":"system","content":"s\\\\\"\u00e9\ud83d\ude00"},{"content":[{"type":"text","text":"q\n\\"},{"type":"image_url","image_url":{"url":"data:image/png;base64,QUJDREVG"}}],"role":"user"},{"role":"user","content":"y"}]}`,
	`{"model":"m","messages":[{"role":"system","content":["be \"terse\"",7,"s2"]},{"role":"user","content":["What is this?",{"type":"image_url","image_url":{"url":"u"}},"Explain."]}]}`,
	`{"model":"bge","text_1":"q","text_2":["d1",{"text":"d2"}],"queries":["a","b"],"data_1":{"content":[]},"data_2":"x"}`,
	`{"max_tokens":"512","n":" 2 ","sampling_params":{"max_new_tokens":"64.0","n":"3."},"max_completion_tokens":"1_0","max_output_tokens":"0.00","n":"x\u0031"}`,
	`{"model":"llava","messages":[{"role":"user","content":"what is this?","images":["iVBORw0KGgo","QUJD",7,{"a":"b"}]},{"role":"user","images":"x","content":"y"}],"images":["QUJD"],"prompt":"p"}`,
	`{"stream":"True","max_tokens":512,"max_tokens":16,"stream":"\u0079es","parameters":{"max_new_tokens":9},"parameters":{"max_new_tokens":3,"max_new_tokens":2},"stream":1.0}`,
	`{"sampling_params":[{"max_new_tokens":8},7,{"max_new_tokens":64,"max_new_tokens":4}],"stream":"on","stream":1e0,"sampling_params":{"n":2},"stream":"yeſ"}`,
}

// FuzzScannerMatchesReference: the scanner reads exactly what the closure
// based one it replaced read, on any input, whole or cut anywhere.
func FuzzScannerMatchesReference(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, keyed := range []bool{false, true} {
			for _, cut := range []int{len(b), len(b) / 2, len(b) - 1} {
				if cut < 0 {
					continue
				}
				got, want := scanNew(b[:cut], keyed), scanRef(b[:cut], keyed)
				if !equalScan(got, want) {
					t.Fatalf("body %q keyed %v:\n got %+v\nwant %+v", b[:cut], keyed, got, want)
				}
			}
		}
	})
}

// TestScannerMatchesReference runs the seeds cut at every length.
func TestScannerMatchesReference(t *testing.T) {
	for _, s := range scanSeeds {
		for cut := 0; cut <= len(s); cut++ {
			for _, keyed := range []bool{false, true} {
				b := []byte(s[:cut])
				if got, want := scanNew(b, keyed), scanRef(b, keyed); !equalScan(got, want) {
					t.Fatalf("body %q keyed %v:\n got %+v\nwant %+v", b, keyed, got, want)
				}
			}
		}
	}
}

func equalScan(a, b scanResult) bool {
	return a.model == b.model && a.cacheKey == b.cacheKey && a.system == b.system && a.prompt == b.prompt &&
		a.prevResponse == b.prevResponse && a.conversation == b.conversation && a.cacheSalt == b.cacheSalt &&
		a.stream == b.stream && a.hasText == b.hasText && a.maxTokens == b.maxTokens && a.n == b.n && a.chars == b.chars &&
		a.idCount == b.idCount && a.idBytes == b.idBytes && a.images == b.images &&
		slices.Equal(a.msgs, b.msgs)
}

func BenchmarkParseBody(b *testing.B) {
	in := []byte(scanSeeds[0])
	b.Run("new", func(b *testing.B) {
		for b.Loop() {
			var o body
			parseBody(in, true, &o)
		}
	})
	b.Run("ref", func(b *testing.B) {
		for b.Loop() {
			var o refBody
			refParseBody(in, true, &o)
		}
	})
}

// BenchmarkParseBodyVaried parses 16 different chat bodies in turn, so the
// branch predictor cannot learn one body's path (as it does in a loop over
// the same body, which the loopback call does not resemble).
func BenchmarkParseBodyVaried(b *testing.B) {
	var bodies [][]byte
	for i := range 16 {
		bodies = append(bodies, []byte(`{"model":"`+strings.Repeat("m", 3+i%5)+`","messages":[{"role":"system","content":"`+strings.Repeat("You are helpful. ", 1+i%3)+`"},{"role":"user","content":"`+strings.Repeat("What is the capital? ", 1+i%4)+`"}],"max_tokens":`+strings.Repeat("3", 1+i%3)+`,"temperature":0}`))
	}
	b.Run("new", func(b *testing.B) {
		i := 0
		for b.Loop() {
			var o body
			parseBody(bodies[i%16], true, &o)
			i++
		}
	})
	b.Run("ref", func(b *testing.B) {
		i := 0
		for b.Loop() {
			var o refBody
			refParseBody(bodies[i%16], true, &o)
			i++
		}
	})
}

// TestScannerDecodesEscapesEverywhere: str returns only the raw text and
// the quoted form is rebuilt from the scanner's position for decoding; each
// field that decodes does so right after its str, short strings and long
// ones (past shortStr, through longStr) alike.
func TestScannerDecodesEscapesEverywhere(t *testing.T) {
	long := strings.Repeat("y", 2*shortStr)
	for _, tail := range []string{"", long} {
		b := []byte(`{"model":"m\"1` + tail + `","prompt_cache_key":"k\\2` + tail + `","instructions":"s\u00e93` + tail +
			`","input":[{"role":"us\u0065r","content":[{"type":"input_text","text":"a\tb` + tail + `"}]}]}`)
		got := scanNew(b, true)
		require.Equal(t, `m"1`+tail, got.model)
		require.Equal(t, `k\2`+tail, got.cacheKey)
		require.Equal(t, "s\u00e93"+tail, got.system)
		require.Equal(t, []cache.Message{{Role: "user", Content: "a\tb" + tail}}, got.msgs)
		b = []byte(`{"prompt":"p\/4` + tail + `","messages":[{"role":"user","content":"c\n5` + tail + `"}]}`)
		got = scanNew(b, true)
		require.Equal(t, "p/4"+tail, got.prompt)
		require.Equal(t, []cache.Message{{Role: "user", Content: "c\n5" + tail}}, got.msgs)
	}
}

// TestScannerDecodesEscapedKeys: a key spelled with escapes is the key
// encoding/json reads, at the top level and inside messages and parts.
func TestScannerDecodesEscapedKeys(t *testing.T) {
	b := []byte(`{"mod\u0065l":"m","m\u0061x_tokens":5,"stre\u0061m":true,"messages":[{"r\u006fle":"user","c\u006fntent":` +
		`[{"t\u0065xt":"hi"},{"image_\u0075rl":{"\u0075rl":"https://x/cat.png"}}]}],"param\u0065ters":{"max_new_t\u006fkens":9}}`)
	got := scanNew(b, true)
	want := scanNew([]byte(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(string(b),
		`\u0065`, "e"), `\u0061`, "a"), `\u006f`, "o"), `\u0075`, "u")), true)
	require.Equal(t, "m", got.model)
	require.Equal(t, 9, got.maxTokens)
	require.True(t, got.stream)
	require.Len(t, got.msgs, 1)
	require.Equal(t, want, got)

	// A key whose escapes are too long to spell any key looked for is
	// none of them, without being decoded; so is one whose escape is not
	// JSON. Neither hides the keys around it.
	long := strings.Repeat(`\u006d`, maxKey+1)
	require.Greater(t, len(long), 6*maxKey)
	for _, key := range []string{long, `\u006dodel` + strings.Repeat(" ", 6*maxKey), `mod\el`, `\u00`} {
		b := []byte(`{"stream":true,"` + key + `":"x","model":"m","max_tokens":4}`)
		got := scanNew(b, true)
		require.Equal(t, "m", got.model, "key %q", key)
		require.Equal(t, 4, got.maxTokens, "key %q", key)
		require.True(t, got.stream, "key %q", key)
		require.Equal(t, scanRef(b, true), got, "key %q", key)
	}
}

// TestInternedModelsAreBounded: model names are request data. A stream of
// made-up names, long ones among them, leaves at most len(models) names of
// at most maxInternModel bytes in the table, and a long name is still read
// whole.
func TestInternedModelsAreBounded(t *testing.T) {
	long := strings.Repeat("m", maxInternModel+1)
	for i := range 10 * len(models) {
		name := []byte(fmt.Sprintf("made-up-%d", i))
		assert.Equal(t, string(name), internModel(name, false))
		assert.Equal(t, long, internModel([]byte(long), false))
	}
	for i := range models {
		if p := models[i].Load(); p != nil {
			assert.LessOrEqual(t, len(*p), maxInternModel)
		}
	}
}

// TestScannerDoesNotRecurseOnImageURLs: an image_url object nested in
// itself ({"url":{"url":...}}) is stepped over, not followed. Followed, each
// level was a call: a peek of MaxPeek (up to 1 GiB) of such a body grew the
// goroutine's stack to 8 times the peek, past the runtime's limit (a fatal
// error, not a panic), and a 1 MiB one to 8 MiB for the call.
func TestScannerDoesNotRecurseOnImageURLs(t *testing.T) {
	b := []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":` +
		strings.Repeat(`{"url":`, 4<<20/7))
	defer debug.SetMaxStack(debug.SetMaxStack(16 << 20))
	for _, keyed := range []bool{false, true} {
		got := scanNew(b, keyed)
		require.Empty(t, got.msgs)
	}
	// The shapes the APIs send still mark the image.
	for _, img := range []string{`"https://x/cat.png"`, `{"url":"https://x/cat.png","detail":"low"}`} {
		got := scanNew([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":`+img+`}]}]}`), true)
		require.Len(t, got.msgs, 1)
		require.Contains(t, got.msgs[0].Content, "<image ")
	}
}

// TestScannerCollectsOnlyWhatTheKeyReads: Keyer.Chat reads no message past
// MaxKeyChars of rendering (content, role and 16 bytes of lengths each), so
// the scanner collects none: a body of a million empty messages before its
// first user turn made it keep all of them (68 MB of allocation for 1 MiB of
// body). The key is the one the whole list gives.
func TestScannerCollectsOnlyWhatTheKeyReads(t *testing.T) {
	for _, el := range []string{`{}`, `{"role":"system","content":[{"text":""},{"text":""}]}`,
		`{"role":"tool","content":[{"image_url":"x"}]}`, `{"role":"system","content":"` + strings.Repeat("s", 1000) + `"}`} {
		n := 1 << 20 / (len(el) + 1)
		b := []byte(`{"model":"m","messages":[` + strings.Repeat(el+",", n) + `{"role":"user","content":"q"}]}`)
		got := scanNew(b, true)
		rendered := 0
		for _, m := range got.msgs[:len(got.msgs)-1] {
			rendered += len(m.Content) + len(m.Role) + 16
		}
		require.Less(t, rendered, cache.MaxKeyChars, el)
		var all body
		parseBody([]byte(`{"messages":[`+el+`]}`), true, &all)
		whole := slices.Repeat([]cache.Message{all.msgs[0]}, n)
		whole = append(whole, cache.Message{Role: "user", Content: "q"})
		k := cache.NewKeyer(7)
		require.Equal(t, k.Chat("m", whole), k.Chat("m", got.msgs), el)
	}
}

// TestScannerDecodesWithoutAllocatingPerString: a body of many short
// escaped strings (keys spelled "\u0061", roles, text parts) is request
// data. Each used to cost a json.Unmarshal (three allocations, about 170
// bytes), whatever its length: 17 bytes allocated per byte of such a body.
func TestScannerDecodesWithoutAllocatingPerString(t *testing.T) {
	n := 1 << 16
	for name, b := range map[string]string{
		"keys":        `{"model":"m",` + strings.Repeat(`"\u0061":0,`, n) + `"a":0}`,
		"keys inside": `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`{"t\u0065xt":"x","\u0061":0},`, n) + `{}]}]}`,
		"later roles": `{"model":"m","messages":[{"role":"user","content":"x"},` + strings.Repeat(`{"role":"\u0061"},`, n) + `{}]}`,
		"parts":       `{"model":"m","messages":[{"role":"system","content":[` + strings.Repeat(`{"text":"\n"},`, n) + `{}]},{"role":"user","content":"x"}]}`,
	} {
		in := []byte(b)
		allocs := testing.AllocsPerRun(2, func() {
			var o body
			parseBody(in, true, &o)
		})
		assert.Less(t, allocs, 64.0, name)
	}
}

// FuzzUnquoteMatchesEncodingJSON: appendUnquoted reads a string as
// encoding/json does, and rejects what it rejects.
func FuzzUnquoteMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{
		``, `plain`, `a\"b`, `\\`, `\/\b\f\n\r\t`, `\u00e9t\u00e9`, `\ud83d\ude00`, `\ud83d`, `\ud83dx`,
		`\ude00\ud83d`, `\ud83d\u0041`, `\ud83d\ud83d\ude00`, `\u12`, `\u12g4`, `\x`, `\'`, `a\`, "a\x01b", "\xff\xfe",
		"\xef\xbf\xbd", `"`, `a"b`, `\uD83D\uDE00`, `\u0000`, "\u2028", `\u0061\u0062`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := appendUnquoted([]byte("prefix"), raw)
		var want string
		err := json.Unmarshal([]byte(`"`+string(raw)+`"`), &want)
		if ok != (err == nil) || ok && string(got) != "prefix"+want {
			t.Fatalf("%q: got %q %v, encoding/json %q %v", raw, got, ok, want, err)
		}
	})
}

// TestUnquoteMatchesEncodingJSON runs the fuzz seeds and every escape.
func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	for c := range 256 {
		for _, raw := range []string{`\` + string(rune(c)), string([]byte{byte(c)}), `\u00` + fmt.Sprintf("%02x", c), `\ud800\udc` + fmt.Sprintf("%02X", c)} {
			got, ok := appendUnquoted(nil, []byte(raw))
			var want string
			err := json.Unmarshal([]byte(`"`+raw+`"`), &want)
			require.Equal(t, err == nil, ok, raw)
			if ok {
				require.Equal(t, want, string(got), raw)
			}
		}
	}
}

// TestScannerAllocatesLittleForEscapedText: a prompt with escapes (a "\n"
// is in most) is decoded into the parts buffer in one growth and copied
// once; with json.Unmarshal it took six allocations.
func TestScannerAllocatesLittleForEscapedText(t *testing.T) {
	if testutil.Race {
		t.Skip("the race detector's instrumentation allocates one more")
	}
	b := []byte(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"What is the capital of France?\nAnswer briefly."}],"max_tokens":32,"stream":true}`)
	allocs := testing.AllocsPerRun(100, func() {
		var o body
		parseBody(b, true, &o)
	})
	assert.LessOrEqual(t, allocs, 2.0)
}

// TestScannerDoesNotRecurseOnAnyNesting: no shape of nesting a body can
// take makes the scan (or the scan past the peek) use stack in proportion
// to it; 4 MiB of each under a 16 MiB stack limit, where recursing would
// need some 30 MiB.
func TestScannerDoesNotRecurseOnAnyNesting(t *testing.T) {
	const n = 4 << 20
	defer debug.SetMaxStack(debug.SetMaxStack(16 << 20))
	for _, open := range []string{
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":` + strings.Repeat(`{"url":`, n/7),
		`{"messages":[{"role":"user","content":[{"type":"tool_result","content":` + strings.Repeat(`[{"type":"tool_result","content":`, n/33),
		`{"messages":[{"role":"user","content":[{"type":"image","source":` + strings.Repeat(`{"data":`, n/8),
		`{"prompt":` + strings.Repeat(`[`, n),
		`{"input":[` + strings.Repeat(`{"content":[{"text":`, n/20),
		`{"conversation":` + strings.Repeat(`{"id":`, n/6),
		`{"sampling_params":` + strings.Repeat(`{"max_new_tokens":`, n/18),
		`{"tools":` + strings.Repeat(`{"a":[`, n/6),
	} {
		b := []byte(open)
		_ = scanNew(b, true)
		m := inMemory(io.NopCloser(bytes.NewReader(append(b, '}'))))
		var got body
		readTail(&m, b[:1<<20], true, &got)
		_ = peekText(b[:1<<20], int64(len(b)))
	}
}

// intStringCases: what pydantic-core (str_as_int, src/input/shared.rs; its
// tests/validators/test_int.py) makes of a string for an int field, which
// vLLM and SGLang then honour: a count, or 0 where it refuses the string
// (or the value is negative or beyond 2^31-1).
var intStringCases = []struct {
	in   string
	want int
}{
	{"512", 512}, {"0", 0}, {"00", 0}, {"0_000", 0}, {"+0", 0}, {"+0_000", 0},
	{"+512", 512}, {" 512", 512}, {"512 ", 512}, {"  1  ", 1},
	{"\t512\n", 512}, {"\u00a0512\u3000", 512}, {"\u2028512\u0085", 512},
	{"1_000", 1000}, {"+4_2", 42}, {"+0_42", 42}, {"+4_2.0", 42}, {"+04_2.0", 42},
	{"4_2.0", 42}, {"04_2.0", 42}, {"  04_2.0 ", 42}, {"  0_42.0 ", 42},
	{"512.0", 512}, {"512.00", 512}, {"0.0", 0}, {"00.0", 0}, {"042", 42}, {"000001", 1},
	{"123456789.0", 123456789}, {"2147483647", 1<<31 - 1},
	// Refused by pydantic.
	{"512.", 0}, {"1.", 0}, {".5", 0}, {"512.5", 0}, {"512.0_0", 0}, {"1.5", 0},
	{"00_", 0}, {"0:", 0}, {"++4_2", 0}, {"+-1", 0}, {"  _042.0 ", 0}, {"42_", 0}, {"42_.0", 0},
	{"1__000", 0}, {"1e3", 0}, {"0x10", 0}, {"", 0}, {" ", 0}, {"+", 0}, {"5x", 0},
	{"\ufeff512", 0}, {"５１２", 0}, {"\u00b9", 0},
	// Taken by pydantic but no count: negative, or too large to weigh.
	{"-1", 0}, {"-0", 0}, {"-00042_000", 0}, {"0-5", 0}, {"2147483648", 0}, {"99999999999", 0},
}

func TestIntStringReadsWhatPydanticTakes(t *testing.T) {
	for _, tc := range intStringCases {
		assert.Equal(t, tc.want, intString(tc.in), "%q", tc.in)
		v, ok := refStrAsInt(tc.in)
		if !ok || v < 0 || v > 1<<31-1 {
			v = 0
		}
		assert.Equal(t, tc.want, int(v), "reference, %q", tc.in)
	}
	// In a body, escapes are decoded first, as Python's json module does.
	var out body
	parseBody([]byte(`{"max_tokens":"\u0035\u0031\u0032","n":"\t2"}`), false, &out)
	assert.Equal(t, [2]int{512, 2}, [2]int{out.maxTokens, out.n})
}

// FuzzIntStringMatchesPydantic: intString reads every string as the line
// by line port of pydantic-core's str_as_int does.
func FuzzIntStringMatchesPydantic(f *testing.F) {
	for _, tc := range intStringCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := refStrAsInt(s)
		if !ok || v < 0 || v > 1<<31-1 {
			v = 0
		}
		if got := intString(s); got != int(v) {
			t.Fatalf("%q: %d, pydantic %d", s, got, v)
		}
	})
}
