package window

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
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

func FuzzCarried(f *testing.F) {
	f.Add([]byte(`{"x":"maximum context length is 10"}`))
	f.Add([]byte(`\u0041\\\u`))
	f.Fuzz(func(t *testing.T, b []byte) {
		carried, whole := Carried(bytes.NewReader(b), 1<<20)
		if !whole {
			t.Fatal("a short body not read whole")
		}
		// Text that reads as a refusal as it stands reads so after the
		// escapes are undone too, unless an escape was in it.
		if refuses(b) && !bytes.Contains(b, []byte(`\`)) && !carried {
			t.Fatalf("%q reads as a refusal, Carried says not", b)
		}
	})
}
