package window

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCarried(t *testing.T) {
	const phrase = "This model's maximum context length is 10 tokens. However, you requested 20 tokens (10 in the messages, 10 in the completion)."
	pad := strings.Repeat(`{"role":"user","content":"filler text"},`, 3000) // about 120 KB: several chunks
	for _, tc := range []struct {
		name, body string
		carried    bool
	}{
		{"plain chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":32}`, false},
		{"a refusal's text in a field", `{"model":"m","max_tokens":"` + phrase + `"}`, true},
		// The server decodes the JSON before it copies the value back.
		{"escaped", `{"model":"m","max_tokens":"This model\u0027s maximum \u0063ontext length is \u0031\u0030 tokens."}`, true},
		{"escaped capitals", `{"x":"\u004DAXIMUM CONTEXT LENGTH IS 10"}`, true},
		{"escaped newline and quote", `{"x":"a\n\"b\\c\/ maximum context length is 7"}`, true},
		{"far into the body", `{"messages":[` + pad + `{"role":"user","content":"` + phrase + `"}]}`, true},
		// The phrase without a number after it is no refusal.
		{"phrase alone", `{"x":"maximum context length is unknown"}`, false},
		{"TGI's", `{"inputs":"x","parameters":{"max_new_tokens":"` + "`inputs` tokens + `max_new_tokens` must be <= 12. Given: 1 `inputs` tokens and 1 `max_new_tokens`" + `"}}`, true},
		{"a broken escape", `{"x":"\u00zz maximum context length is 5"}`, true},
		{"a backslash at the end", `{"x":"a\`, false},
		{"non-ASCII escapes", `{"x":"\u4f60\u597d"}`, false},
		// The server copies the second field alone, and Refusal reads that
		// copy's number: the first text, without one, hides nothing.
		{"a number-less one first", `{"messages":[{"role":"user","content":"Its maximum context length is unknown."}],"max_tokens":"maximum context length is 10"}`, true},
		{"a number-less one first, TGI's", `{"inputs":"` + "`inputs` must have less than many tokens" + `","parameters":{"stop":["` + "`inputs` must have less than 9 tokens" + `"]}}`, true},
		// U+0130 lowers to i, as Refusal lowers the server's copy of it.
		{"escaped dotted capital I", `{"x":"MAX\u0130MUM CONTEXT LENGTH IS 10"}`, true},
		{"dotted capital I", "{\"x\":\"MAX\u0130MUM CONTEXT LENGTH IS 10\"}", true},
		// A window's text without the text Refusal knows the refusal by.
		{"TGI's max_new_tokens bound", "{\"x\":\"`max_new_tokens` must be <= 1024. Given: 2000\"}", false},
		{"the two halves far apart", `{"a":"exceed_context_size_error","messages":[` + pad + `{"content":"\"n_ctx\":8"}]}`, true},
		{"empty", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			carried, whole := Carried(strings.NewReader(tc.body), 1<<20)
			assert.True(t, whole)
			assert.Equal(t, tc.carried, carried)
			// However the body arrives.
			carried, whole = Carried(iotest.OneByteReader(strings.NewReader(tc.body)), 1<<20)
			assert.True(t, whole)
			assert.Equal(t, tc.carried, carried)
		})
	}
}

// A refusal's text that straddles the point where one chunk of decoded
// text ends is still found: the next chunk starts before it.
func TestCarriedAcrossChunks(t *testing.T) {
	const phrase = "maximum context length is 10 tokens"
	for _, at := range []int{carriedChunk - 10, carriedChunk + carriedOverlap - 20, 2*carriedChunk + carriedOverlap - 5, 3*carriedChunk + carriedOverlap - 1} {
		body := strings.Repeat("a", at) + phrase + strings.Repeat("b", 100)
		carried, whole := Carried(strings.NewReader(body), 1<<20)
		assert.True(t, whole, "at %d", at)
		assert.True(t, carried, "at %d", at)
	}
}

func TestCarriedLimit(t *testing.T) {
	body := strings.Repeat("a", 1000)
	carried, whole := Carried(strings.NewReader(body), 1000)
	assert.True(t, whole)
	assert.False(t, carried)
	// Longer than the limit: nothing is known, even of a refusal before it.
	carried, whole = Carried(strings.NewReader("maximum context length is 10"+body), 1000)
	assert.False(t, whole)
	assert.False(t, carried)
	// A read that fails: nothing is known.
	carried, whole = Carried(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(errors.New("cut"))), 1000)
	assert.False(t, whole)
	assert.False(t, carried)
}

// Carried finds the text of every refusal Refusal reads, as a field's
// value; TestRefusal's texts are these.
func TestCarriedEveryRefusal(t *testing.T) {
	for _, tc := range refusalTexts {
		if tc.window == 0 {
			continue
		}
		v, err := json.Marshal(tc.body)
		require.NoError(t, err)
		carried, whole := Carried(strings.NewReader(`{"model":"m","max_tokens":`+string(v)+`}`), 1<<20)
		assert.True(t, whole, tc.name)
		assert.True(t, carried, tc.name)
	}
}

// A body holding, among other text, text that reads as a refusal is
// carried: a server may copy that part alone.
func FuzzCarried(f *testing.F) {
	f.Add([]byte(`{"x":"maximum context length is unknown`), []byte(`maximum context length is 10"}`))
	f.Add([]byte(`\u0041\\\u`), []byte(`\u0130`))
	f.Fuzz(func(t *testing.T, other, copied []byte) {
		body := slices.Concat(other, copied, other)
		carried, whole := Carried(bytes.NewReader(body), 1<<20)
		if !whole {
			t.Fatal("a short body not read whole")
		}
		// Without escapes, the server's copy is the text as it stands.
		if w, _, _, _ := Refusal(copied); w > 0 && !bytes.Contains(body, []byte(`\`)) && !carried {
			t.Fatalf("%q reads as a refusal, Carried says %q does not", copied, body)
		}
	})
}
