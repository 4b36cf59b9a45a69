package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// pyQuote quotes s as Python's json.dumps does by default (ensure_ascii):
// every non-ASCII character as \uXXXX, one beyond U+FFFF as a surrogate
// pair. requests, LangChain and the openai package over httpx before 0.28
// send bodies so.
func pyQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r < ' ':
			fmt.Fprintf(&b, `\u%04x`, r)
		case r < 0x80:
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// rawQuote quotes s with its characters as UTF-8 (openai-python over httpx
// 0.28, openai-node, openai-go).
func rawQuote(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

var (
	chinese  = "请总结以下文章的主要观点，并用简洁的中文回答。人工智能正在改变我们的生活方式和工作方式。"
	japanese = "次の文章を要約してください。機械学習は多くの分野で使われています。"
	korean   = "다음 글을 요약해 주세요. 인공지능은 우리의 삶을 바꾸고 있습니다."
	emoji    = "😀🎉🚀👍🔥 " // beyond U+FFFF: surrogate pairs when escaped
)

// escapedBodies are the places prompt text is counted, for text quoted by
// q. A tool call's arguments are a string of JSON, whose own escapes are
// part of its value (the model reads them): the same in both.
func escapedBodies(q func(string) string, text string) map[string][2]string {
	return map[string][2]string{
		"chat":         {"/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":` + q(text) + `},{"role":"user","content":` + q(text+text) + `}],"max_tokens":16}`},
		"parts":        {"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":` + q(text) + `},` + q(text) + `]}]}`},
		"completions":  {"/v1/completions", `{"model":"m","prompt":` + q(text+text) + `}`},
		"batch":        {"/v1/completions", `{"model":"m","prompt":[` + q(text) + `,` + q(text+text) + `]}`},
		"responses":    {"/v1/responses", `{"model":"m","instructions":` + q(text) + `,"input":[{"role":"user","content":[{"type":"input_text","text":` + q(text) + `}]}]}`},
		"tools":        {"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","description":` + q(text+text) + `}}]}`},
		"tool calls":   {"/v1/chat/completions", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":` + q(`{"q":`+rawQuote(text)+`}`) + `}}]},{"role":"tool","content":` + q(text) + `}]}`},
		"messages api": {"/v1/messages", `{"model":"m","max_tokens":8,"system":` + q(text) + `,"messages":[{"role":"user","content":[{"type":"tool_use","input":{"q":` + q(text) + `}},{"type":"tool_result","content":[{"type":"text","text":` + q(text) + `}]}]}]}`},
		"embeddings":   {"/v1/embeddings", `{"model":"e","input":[` + q(text) + `,` + q(text+text+text) + `]}`},
	}
}

// TestInspectCountsEscapedTextByItsCharacters: a prompt whose non-ASCII
// characters are escaped (\u4f60, six bytes, as Python clients send them)
// counts as the same prompt sent as UTF-8 (three bytes a CJK character).
// The escapes were counted as sent, twice the tokens of escaped CJK text:
// an endpoint's in-flight load doubled for such traffic, and a call that
// fits a replica's context window was taken not to.
func TestInspectCountsEscapedTextByItsCharacters(t *testing.T) {
	for _, lang := range []struct{ name, text string }{
		{"chinese", strings.Repeat(chinese, 8)},
		{"japanese", strings.Repeat(japanese, 8)},
		{"korean", strings.Repeat(korean, 8)},
		{"emoji", strings.Repeat(emoji, 40)},
	} {
		raw, esc := escapedBodies(rawQuote, lang.text), escapedBodies(pyQuote, lang.text)
		for name, r := range raw {
			e := esc[name]
			require.NotEqual(t, r[1], e[1])
			want, got := inspect(r[0], r[1], true), inspect(e[0], e[1], true)
			require.Greater(t, want.PromptTokens, 100, "%s %s", lang.name, name)
			assert.InDelta(t, want.PromptTokens, got.PromptTokens, 1, "%s %s: prompt tokens", lang.name, name)
			assert.InDelta(t, want.LongestInput, got.LongestInput, 1, "%s %s: longest input", lang.name, name)
			assert.Equal(t, want.AffinityKey, got.AffinityKey, "%s %s", lang.name, name)
		}
	}
	// The count is the UTF-8's: a CJK character three bytes, an emoji four.
	body := `{"model":"m","prompt":` + pyQuote(strings.Repeat("你好", 200)+strings.Repeat("😀", 100)) + `}`
	assert.Equal(t, (200*2*3+100*4)/4, inspect("/v1/completions", body, true).PromptTokens)
}

// TestInspectCountsShortEscapesAsOneByte: \n, \t, \" and \\ stand for one
// byte each; a document of many short lines counted its newlines twice.
func TestInspectCountsShortEscapesAsOneByte(t *testing.T) {
	for _, esc := range []string{`\n`, `\t`, `\"`, `\\`, `\/`, `\u0041`} {
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`abc`+esc, 1000) + `"}]}`
		assert.Equal(t, 1000, inspect("/v1/chat/completions", body, true).PromptTokens, esc)
	}
}

// TestInspectCountsEscapedTextPastThePeek: a body larger than the peek is
// estimated from its size, in the proportion of its text's value to its
// bytes that the peek shows: an escaped body is not counted as twice the
// same body sent as UTF-8, streamed (its declared size) or held in memory
// (its size, read to the end), whether the peek ends between messages or
// inside one.
func TestInspectCountsEscapedTextPastThePeek(t *testing.T) {
	const peek = 64 << 10
	text := strings.Repeat(chinese, 3000) // 130 KB of UTF-8, 260 KB escaped
	shapes := map[string]func(q func(string) string) string{
		"one message": func(q func(string) string) string {
			return `{"model":"m","messages":[{"role":"user","content":` + q(text) + `}],"max_tokens":16}`
		},
		"many messages": func(q func(string) string) string {
			var b strings.Builder
			b.WriteString(`{"model":"m","messages":[`)
			for i := range 300 {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(`{"role":"user","content":` + q(strings.Repeat(chinese, 10)) + `}`)
			}
			b.WriteString(`],"max_tokens":16}`)
			return b.String()
		},
		"prompt": func(q func(string) string) string {
			return `{"model":"m","prompt":` + q(text) + `,"max_tokens":16}`
		},
	}
	for name, shape := range shapes {
		raw, esc := shape(rawQuote), shape(pyQuote)
		require.Greater(t, len(esc), 3*peek)
		want := inspect("/v1/chat/completions", raw, true).PromptTokens
		require.Equal(t, want, inspect("/v1/chat/completions", esc, true).PromptTokens, name)
		for _, mode := range []string{"streamed", "in memory"} {
			for _, body := range []string{raw, esc} {
				var r *http.Request
				if mode == "streamed" {
					r, _ = http.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions", io.MultiReader(strings.NewReader(body)))
					r.ContentLength = int64(len(body))
				} else {
					r, _ = http.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions", strings.NewReader(body))
				}
				var info httpbalancer.Info
				(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:peek]), false, &info)
				assert.InEpsilon(t, want, info.PromptTokens, 0.03, "%s, %s, escaped %v", name, mode, body == esc)
			}
		}
	}
}
