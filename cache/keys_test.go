package cache_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

const model = "llama-3.1-70b"

// conversation returns the message list a client sends at each turn: the
// history so far plus the new user message.
func conversation(system string, users ...string) [][]cache.Message {
	var turns [][]cache.Message
	msgs := []cache.Message{{Role: "system", Content: system}}
	for i, u := range users {
		msgs = append(msgs, cache.Message{Role: "user", Content: u})
		turns = append(turns, append([]cache.Message(nil), msgs...))
		msgs = append(msgs, cache.Message{Role: "assistant", Content: fmt.Sprintf("answer %d to %q", i, u)})
	}
	return turns
}

func TestChatTurnsShareKey(t *testing.T) {
	k := cache.NewKeyer(1)
	for _, system := range []string{"", "You are terse.", strings.Repeat("Use the tools. ", 3000)} {
		turns := conversation(system, "What is a KV cache?", "And prefix caching?", "Thanks", strings.Repeat("long follow-up ", 1000))
		first := k.Chat(model, turns[0])
		var prev []uint64
		for i, msgs := range turns {
			assert.Equal(t, first, k.Chat(model, msgs), "turn %d", i)
			// Each turn's blocks extend the previous turn's: the prefix a
			// longest-prefix index or an engine cache would reuse.
			blocks := k.Blocks(model, msgs, nil)
			require.GreaterOrEqual(t, len(blocks), len(prev))
			if len(prev) > 0 {
				assert.Equal(t, prev, blocks[:len(prev)], "turn %d", i)
			}
			prev = blocks
		}
	}
}

func TestChatSharedSystemPromptSpreads(t *testing.T) {
	k := cache.NewKeyer(2)
	p := cache.NewPlacement(membersN(16), k.Seed())
	// A long application system prompt (well past Depth), as agents send.
	system := strings.Repeat("You are a coding agent. Follow the rules. ", 500)
	const conversations = 10_000
	keys := map[uint64]bool{}
	owners := make([]int, 16)
	for i := range conversations {
		msgs := []cache.Message{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprintf("task %d: fix the build", i)}}
		key := k.Chat(model, msgs)
		keys[key] = true
		w := p.Walk(key)
		m, ok := w.Next()
		require.True(t, ok)
		owners[m]++
	}
	assert.Len(t, keys, conversations, "conversations sharing only a system prompt must not share keys")
	for m, c := range owners {
		assert.LessOrEqual(t, c, 2*conversations/16, "member %d owns %d of %d conversations", m, c, conversations)
	}
}

func TestChatSharedLongContextSharesKey(t *testing.T) {
	k := cache.NewKeyer(3)
	doc := strings.Repeat("Retrieved passage about KV caches. ", 200) // 7 KB > Depth
	ask := func(ctx, q string) uint64 {
		return k.Chat(model, []cache.Message{
			{Role: "system", Content: "Answer from the context."},
			{Role: "user", Content: ctx + "\n\nQuestion: " + q},
		})
	}
	// Past Depth the shared document decides the key: the questions share
	// the document's KV cache on one owner (and its spills).
	assert.Equal(t, ask(doc, "What is paged attention?"), ask(doc, "Who wrote vLLM?"))
	// A short context does not: the questions are what tells them apart.
	short := doc[:500]
	assert.NotEqual(t, ask(short, "What is paged attention?"), ask(short, "Who wrote vLLM?"))
	// A deeper Keyer tells the long ones apart too.
	deep := k.WithDepth(64 << 10)
	assert.Equal(t, 64<<10, deep.Depth())
	a := deep.Chat(model, []cache.Message{{Role: "user", Content: doc + "Q1"}})
	b := deep.Chat(model, []cache.Message{{Role: "user", Content: doc + "Q2"}})
	assert.NotEqual(t, a, b)
	assert.Equal(t, cache.DefaultDepth, k.Depth(), "WithDepth must not change the original")
	assert.Equal(t, cache.BlockChars, k.WithDepth(1).Depth())
	assert.Equal(t, cache.MaxKeyChars, k.WithDepth(1<<30).Depth())
}

func TestChatMessageSplitsDiffer(t *testing.T) {
	k := cache.NewKeyer(4)
	lists := [][]cache.Message{
		{{Role: "system", Content: "ab"}, {Role: "user", Content: "c"}},
		{{Role: "system", Content: "a"}, {Role: "user", Content: "bc"}},
		{{Role: "system", Content: "abc"}, {Role: "user", Content: ""}},
		{{Role: "systema", Content: "b"}, {Role: "user", Content: "c"}},
		{{Role: "user", Content: "abc"}},
		{{Role: "", Content: "abc"}},
		{{Role: "system", Content: "abc"}},
		{},
	}
	seen := map[uint64]int{}
	for i, msgs := range lists {
		key := k.Chat(model, msgs)
		if j, dup := seen[key]; dup {
			t.Errorf("lists %d and %d share key %x", j, i, key)
		}
		seen[key] = i
	}
	// Blocks see the whole rendering: long contents split differently over
	// messages differ from the block where the split happens.
	text := strings.Repeat("x", 3*cache.BlockChars)
	a := k.Blocks(model, []cache.Message{{Role: "user", Content: text[:200]}, {Role: "user", Content: text[200:]}}, nil)
	b := k.Blocks(model, []cache.Message{{Role: "user", Content: text[:201]}, {Role: "user", Content: text[201:]}}, nil)
	require.Len(t, a, len(b))
	assert.Equal(t, a[0], b[0], "the first block is identical text")
	assert.NotEqual(t, a[1], b[1])
	assert.NotEqual(t, a[len(a)-1], b[len(b)-1])
}

func TestKeysSaltedBySeedAndModel(t *testing.T) {
	msgs := conversation("sys", "hello")[0]
	k1, k2 := cache.NewKeyer(1), cache.NewKeyer(2)
	assert.NotEqual(t, k1.Chat(model, msgs), k1.Chat("other-model", msgs))
	assert.NotEqual(t, k1.Chat(model, msgs), k2.Chat(model, msgs))
	assert.NotEqual(t, k1.Prompt(model, "p"), k1.Prompt("other-model", "p"))
	assert.NotEqual(t, k1.Prompt(model, "p"), k2.Prompt(model, "p"))
	assert.NotEqual(t, k1.Session("s"), k2.Session("s"))
	assert.Equal(t, k1.Chat(model, msgs), cache.NewKeyer(1).Chat(model, msgs), "same seed, same key")
	// A chat and a prompt with the same text are different requests.
	assert.NotEqual(t, k1.Prompt(model, "hello"), k1.Chat(model, []cache.Message{{Content: "hello"}}))
}

func TestPromptDepth(t *testing.T) {
	k := cache.NewKeyer(5)
	preamble := strings.Repeat("p", cache.DefaultDepth)
	assert.Equal(t, k.Prompt(model, preamble+"A"), k.Prompt(model, preamble+"B"), "agree on Depth chars: share a key")
	assert.NotEqual(t, k.Prompt(model, preamble[1:]+"A"), k.Prompt(model, preamble[1:]+"B"))
	assert.NotEqual(t, k.Prompt(model, "a"), k.Prompt(model, "b"))
	// At a block boundary the key is the chain's block hash there, so an
	// index over Blocks can find what a key routed on.
	blocks := k.PromptBlocks(model, preamble+"tail", nil)
	require.Len(t, blocks, cache.DefaultDepth/cache.BlockChars)
	assert.Equal(t, blocks[len(blocks)-1], k.Prompt(model, preamble+"tail"))
}

// The zero Keyer is not usable (seed 0, depth 0), and a consumer such as
// httpbalancer tells it by its depth of 0. WithDepth gives it a depth, so
// its copy must not keep the seed everyone knows: keys hashed under seed 0
// are keys an outsider can compute, and aim at one endpoint.
func TestWithDepthOnTheZeroKeyerDrawsASeed(t *testing.T) {
	var zero cache.Keyer
	a, b := zero.WithDepth(8192), zero.WithDepth(8192)
	assert.Equal(t, 8192, a.Depth())
	assert.NotZero(t, a.Seed(), "a usable depth with the public seed 0")
	assert.NotEqual(t, a.Seed(), b.Seed(), "each a random seed, as NewKeyer(0)")
	assert.Equal(t, uint64(7), cache.NewKeyer(7).WithDepth(8192).Seed(), "a seeded Keyer keeps its seed")
}

func TestNewKeyerRandomSeed(t *testing.T) {
	a, b := cache.NewKeyer(0), cache.NewKeyer(0)
	assert.NotZero(t, a.Seed())
	assert.NotEqual(t, a.Seed(), b.Seed())
	assert.Equal(t, uint64(7), cache.NewKeyer(7).Seed())
	assert.Zero(t, a.Session(""), "no session ID, no affinity")
}

func TestKeysDoNotAllocate(t *testing.T) {
	k := cache.NewKeyer(6)
	turns := conversation(strings.Repeat("s", 5000), "one", "two", "three")
	msgs := turns[len(turns)-1]
	prompt := strings.Repeat("q", 32<<10)
	dst := make([]uint64, 0, 1024)
	for name, f := range map[string]func(){
		"Chat":         func() { _ = k.Chat(model, msgs) },
		"Prompt":       func() { _ = k.Prompt(model, prompt) },
		"Session":      func() { _ = k.Session("session-1234") },
		"Blocks":       func() { dst = k.Blocks(model, msgs, dst[:0]) },
		"PromptBlocks": func() { dst = k.PromptBlocks(model, prompt, dst[:0]) },
	} {
		assert.Zero(t, testing.AllocsPerRun(100, f), name)
	}
}

func FuzzKeys(f *testing.F) {
	f.Add(uint64(1), "m", "system", "hello", "user", "world", "a prompt")
	f.Add(uint64(0), "", "", "", "", "", "")
	f.Add(uint64(42), "model", "user", strings.Repeat("z", 5000), "assistant", "\x00\xff", "\x00")
	f.Add(uint64(200), "m", "user", strings.Repeat("u", 400), "assistant", "a", strings.Repeat("p", 256))
	f.Fuzz(func(t *testing.T, seed uint64, model, r1, c1, r2, c2, prompt string) {
		k := cache.NewKeyer(seed)
		msgs := []cache.Message{{Role: r1, Content: c1}, {Role: r2, Content: c2}}
		for _, m := range [][]cache.Message{nil, msgs[:1], msgs} {
			if k.Chat(model, m) == 0 {
				t.Fatalf("Chat(%q, %q) = 0", model, m)
			}
			n := 0
			for _, x := range m {
				n += len(x.Content) + len(x.Role) + 16
			}
			if got := len(k.Blocks(model, m, nil)); got != n/cache.BlockChars {
				t.Fatalf("Blocks: %d blocks for %d rendered bytes", got, n)
			}
		}
		if k.Prompt(model, prompt) == 0 {
			t.Fatalf("Prompt(%q, %q) = 0", model, prompt)
		}
		if got := len(k.PromptBlocks(model, prompt, nil)); got != len(prompt)/cache.BlockChars {
			t.Fatalf("PromptBlocks: %d blocks for %d bytes", got, len(prompt))
		}

		// The chain: a conversation's blocks start with those of every
		// conversation it extends, and a prompt's with those of its
		// prefixes; blocks append to dst, and another Keyer of the seed
		// gives the same.
		again := cache.NewKeyer(k.Seed())
		all := k.Blocks(model, msgs, nil)
		if first := k.Blocks(model, msgs[:1], nil); !slices.Equal(all[:len(first)], first) {
			t.Fatalf("Blocks(%q): the first message's blocks are not a prefix", msgs)
		}
		if got := again.Blocks(model, msgs, []uint64{7}); got[0] != 7 || !slices.Equal(got[1:], all) {
			t.Fatalf("Blocks(%q) into dst [7]: %v, alone %v", msgs, got, all)
		}
		pb := k.PromptBlocks(model, prompt, nil)
		if half := k.PromptBlocks(model, prompt[:len(prompt)/2], nil); !slices.Equal(pb[:len(half)], half) {
			t.Fatalf("PromptBlocks(%q): its first half's blocks are not a prefix", prompt)
		}
		// A key covers Depth characters of the prompt, or of the first user
		// message, and nothing after that message; where the depth ends on
		// a block's end, it is that block's hash (1 for 0).
		kd := k.WithDepth(cache.BlockChars + int(seed%256))
		d := kd.Depth()
		if got, want := kd.Prompt(model, prompt), kd.Prompt(model, prompt[:min(d, len(prompt))]); got != want {
			t.Fatalf("Prompt(%q) at depth %d reads past it", prompt, d)
		}
		if n := len(prompt); n > 0 && n <= d && n%cache.BlockChars == 0 {
			if got, want := kd.Prompt(model, prompt), max(pb[len(pb)-1], 1); got != want {
				t.Fatalf("Prompt(%q) = %x, its last block %x", prompt, got, want)
			}
		}
		user := []cache.Message{{Role: "user", Content: c1}, {Role: r2, Content: c2}}
		if kd.Chat(model, user) != kd.Chat(model, user[:1]) {
			t.Fatalf("Chat(%q) reads past the first user message", user)
		}
		if len(c1) >= d && kd.Chat(model, user[:1]) != kd.Chat(model, []cache.Message{{Role: "user", Content: c1[:d]}}) {
			t.Fatalf("Chat(%q) at depth %d reads past it", user[:1], d)
		}
		if k.Chat(model, msgs) != again.Chat(model, msgs) || k.Prompt(model, prompt) != again.Prompt(model, prompt) {
			t.Fatal("two Keyers of one seed disagree")
		}
	})
}

func membersN(n int) []cache.Member {
	ms := make([]cache.Member, n)
	for i := range ms {
		ms[i] = cache.Member{ID: fmt.Sprintf("vllm-%d.inference.svc:8000", i)}
	}
	return ms
}

func TestChatKeyCappedAtMaxKeyChars(t *testing.T) {
	// Past MaxKeyChars of system prompt nothing else counts: hashing work
	// per request is bounded, at the price of such conversations sharing a
	// key (and spilling along its walk under load).
	k := cache.NewKeyer(8)
	system := strings.Repeat("s", cache.MaxKeyChars)
	a := k.Chat(model, []cache.Message{{Role: "system", Content: system}, {Role: "user", Content: "a"}})
	b := k.Chat(model, []cache.Message{{Role: "system", Content: system}, {Role: "user", Content: "b"}})
	assert.Equal(t, a, b)
	c := k.Chat(model, []cache.Message{{Role: "system", Content: system[1:] + "x"}, {Role: "user", Content: "a"}})
	assert.NotEqual(t, a, c)
}

func TestTenantKeys(t *testing.T) {
	k := cache.NewKeyer(1)
	assert.Zero(t, k.Tenant(""), "no tenant, no shard")
	assert.Equal(t, k.Tenant("acme"), cache.NewKeyer(1).Tenant("acme"), "same seed, same key")
	assert.NotEqual(t, k.Tenant("acme"), cache.NewKeyer(2).Tenant("acme"), "the seed moves it")
	assert.NotEqual(t, k.Tenant("acme"), k.Session("acme"), "a tenant and a session of one name land apart")
	assert.NotEqual(t, k.Tenant("acme"), k.Tenant("acme2"))
	var sum uint64
	assert.Zero(t, testing.AllocsPerRun(100, func() { sum += k.Tenant("acme") }))
	assert.NotZero(t, sum)
}

// Every message list of up to three messages over a few roles and contents
// (empty ones, NULs, a content that spells a role, bytes that read as a
// length or as a whole rendered message) has its own key: the rendering is
// injective where the key covers it whole, i.e. through the first user
// message. (Rendering without the content's length fails here.)
func TestChatEncodingInjective(t *testing.T) {
	k := cache.NewKeyer(77)
	var msgs []cache.Message
	for _, r := range []string{"", "user", "system", "a", "s\x00", strings.Repeat("r", 40)} {
		for _, c := range []string{"", "a", "aa", "\x00", "user", "\x04\x00\x00\x00\x00\x00\x00\x00", "a" + strings.Repeat("\x00", 16), "auser\x04\x00\x00\x00\x00\x00\x00\x00"} {
			msgs = append(msgs, cache.Message{Role: r, Content: c})
		}
	}
	seen := map[uint64][]cache.Message{}
	var walk func(list []cache.Message)
	walk = func(list []cache.Message) {
		key := k.Chat(model, list)
		if other, dup := seen[key]; dup {
			t.Fatalf("%q and %q share key %x", other, list, key)
		}
		seen[key] = list
		if len(list) == 3 || len(list) > 0 && list[len(list)-1].Role == "user" {
			return // messages after the first user message do not count
		}
		for _, m := range msgs {
			walk(append(slices.Clip(list), m))
		}
	}
	walk(nil)
	assert.Greater(t, len(seen), 30_000)
}

// When Chat cuts the first user message at Depth and the cut falls on a
// block boundary, the key is Blocks' hash of that block, as Blocks
// documents, for any depth and with a system prompt before it.
func TestChatCutKeyIsABlockHash(t *testing.T) {
	k := cache.NewKeyer(9)
	system := cache.Message{Role: "system", Content: strings.Repeat("s", 100)} // renders as 122 bytes
	user := cache.Message{Role: "user", Content: strings.Repeat("u", 5000)}
	for _, depth := range []int{134, 262, 4102} { // 122 + depth is a multiple of BlockChars
		kd := k.WithDepth(depth)
		msgs := []cache.Message{system, user}
		blocks := kd.Blocks(model, msgs, nil)
		assert.Equal(t, blocks[(122+depth)/cache.BlockChars-1], kd.Chat(model, msgs), "depth %d", depth)
	}
}

// Depth counts bytes: a cut inside a multi-byte character keys on the bytes
// before it, so prompts that agree on those share a key even where the
// character they cut differs, and no key depends on how text decodes.
func TestDepthCutsBytesInsideACharacter(t *testing.T) {
	k := cache.NewKeyer(10)
	// Byte DefaultDepth-1 opens an "é"; a and b end it as "é" and "è".
	text := "x" + strings.Repeat("é", cache.DefaultDepth)
	a, b := text[:cache.DefaultDepth]+"\xa9 rest", text[:cache.DefaultDepth]+"\xa8 other"
	assert.Equal(t, k.Prompt(model, a), k.Prompt(model, b))
	assert.Equal(t, k.Chat(model, []cache.Message{{Role: "user", Content: a}}), k.Chat(model, []cache.Message{{Role: "user", Content: b}}))
	assert.NotEqual(t, k.Prompt(model, a), k.Prompt(model, text[:cache.DefaultDepth-1]+"e"), "the byte at the cut counts")
}
