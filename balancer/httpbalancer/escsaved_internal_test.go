package httpbalancer

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

var escSavedSeeds = []string{
	``, `abc`, `\n`, `\"\\\/\b\f\r\t`, `\u0041`, `\u00e9t\u00e9`, `\u4f60\u597d`,
	`\ud83d\ude00`, `\uD83D\uDE00x`, `\ud83d`, `\ud83dx`, `\ude00\ud83d`, `\ud83d\u0041`, `\ud83d\ud83d\ude00`,
	`\uffff\u0800\u07ff\u0080\u007f\u0000`, "é\\n😀", `\u12`, `\`, `a\u00`, `\ud83d\ude`,
}

// FuzzEscSavedMatchesEncodingJSON: a string's text counts as the UTF-8 of
// the value encoding/json decodes from it; on any input, cut anywhere,
// escSaved neither panics nor says more than the text holds.
func FuzzEscSavedMatchesEncodingJSON(f *testing.F) {
	for _, s := range escSavedSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		for cut := range len(raw) + 1 {
			if d := escSaved([]byte(raw[:cut])); d < 0 || d > cut {
				t.Fatalf("escSaved(%q) = %d", raw[:cut], d)
			}
		}
		var v string
		if !utf8.ValidString(raw) || json.Unmarshal([]byte(`"`+raw+`"`), &v) != nil {
			return
		}
		if got := len(raw) - escSaved([]byte(raw)); got != len(v) {
			t.Fatalf("%q counts %d bytes, its value %q has %d", raw, got, v, len(v))
		}
	})
}

func TestEscSaved(t *testing.T) {
	for raw, want := range map[string]int{
		`abc`:             0,
		`a\nb`:            1,
		`\u00e9`:          4,     // é: 2 bytes
		`\u4f60`:          3,     // 你: 3 bytes
		`\ud83d\ude00`:    8,     // 😀: 4 bytes
		`\ud83d`:          3,     // unpaired: U+FFFD, 3 bytes
		`\ud83d\u0041`:    3 + 5, // unpaired, then A
		`\u4f`:            1,     // cut by the peek: as written but the backslash
		`\`:               0,
		`x\u4f60\u597d\n`: 7,
	} {
		assert.Equal(t, want, escSaved([]byte(raw)), raw)
	}
}

// TestCountAllocs: counting escaped text decodes nothing into a buffer.
func TestCountAllocs(t *testing.T) {
	raw := []byte(`\u4f60\u597d\ud83d\ude00 and \"quotes\"\n`)
	var out body
	if n := testing.AllocsPerRun(100, func() { out.count(raw, true); out.countCut(raw) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
