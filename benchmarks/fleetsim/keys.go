package fleetsim

import (
	"strings"

	"github.com/inferlb/inferlb/cache"
)

// KeyerSeed is the affinity-key seed every simulated client shares, as a
// fleet that wants its independent routers to agree shares one secret seed
// (see package cache).
const KeyerSeed = 0x1f1ee75eed

// Model is the model name LLM requests ask for; it salts affinity keys.
const Model = "qwen3-32b"

var keyer = cache.NewKeyer(KeyerSeed)

// charsPerToken is how many characters of rendered text stand for one
// synthetic token: about 4 for English text with a BPE tokenizer, the figure
// package cache's DefaultDepth assumes.
const charsPerToken = 4

const alphabet = "abcdefghijklmnopqrstuvwxyz012345"

// render writes the text of segs, at most maxChars characters of it: each
// token becomes 4 characters derived from its value, so equal token streams
// render to equal text and different ones (almost surely) differ.
func render(b *strings.Builder, maxChars int, segs ...Segment) {
	// The text's length is known: growing the builder to it at once spares
	// the doublings and copies of WriteByte's growth, which were 9% of the
	// shedding scenario's run (a chat system prompt renders to 6,000
	// characters, for every conversation).
	tokens := 0
	for _, s := range segs {
		tokens += s.Tokens
	}
	if room := (maxChars - b.Len()) / charsPerToken; room > 0 {
		b.Grow(min(tokens, room) * charsPerToken)
	}
	for _, s := range segs {
		for i := range s.Tokens {
			if b.Len()+charsPerToken > maxChars {
				return
			}
			t := token(s.ID, i)
			for range charsPerToken {
				b.WriteByte(alphabet[t&31])
				t >>= 5
			}
		}
	}
}

// promptKey is the key a client computes for a plain (completions API)
// prompt made of segs: cache.Keyer.Prompt over its rendered text. Only the
// key's depth of text is rendered, since no more counts.
func promptKey(segs ...Segment) uint64 {
	var b strings.Builder
	render(&b, keyer.Depth(), segs...)
	return keyer.Prompt(Model, b.String())
}

// chatKey is the key a client computes for a chat request that opens with a
// system message and a user message: cache.Keyer.Chat, which covers the
// system prompt and the start of the first user turn, so every later turn of
// the conversation keeps the key. The key is salted with the model the
// request names, as the adapters' keys are.
func chatKey(model string, system, user Segment) uint64 {
	var sys, usr strings.Builder
	render(&sys, cache.MaxKeyChars, system)
	render(&usr, keyer.Depth(), user)
	return keyer.Chat(model, []cache.Message{{Role: "system", Content: sys.String()}, {Role: "user", Content: usr.String()}})
}
