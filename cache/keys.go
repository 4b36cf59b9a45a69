package cache

import (
	"crypto/rand"
	"encoding/binary"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

const (
	// BlockChars is the size, in bytes of rendered prompt, of one block of
	// the chained hash: about 32 tokens at 4 characters a token, i.e. two
	// 16-token vLLM KV blocks. Matching finer than the engine's own cache
	// block buys nothing, and each block costs one hash finalization.
	BlockChars = 128

	// DefaultDepth is how many characters of the first user message (or of
	// a plain prompt) a key covers unless WithDepth says otherwise: 4 KiB,
	// about 1,000 tokens. Requests that agree on this much of their first
	// turn share a key, and so a KV cache worth keeping together.
	//
	// Like BlockChars and MaxKeyChars it counts bytes of the UTF-8 text, not
	// runes (4 KiB of CJK text is about 1,400 characters), and a cut may fall
	// inside a multi-byte character: the key still depends only on the bytes
	// before the cut, alike in every process.
	DefaultDepth = 4096

	// MaxKeyChars caps the whole rendered prefix a key covers (256 KiB,
	// about 64k tokens), so one request costs at most this much hashing
	// however long its system prompt. Conversations whose system prompts
	// agree on more than this share a key.
	MaxKeyChars = 256 << 10
)

// Message is one chat message as the affinity key sees it.
type Message struct {
	// Role is the author as the API names it ("system", "user",
	// "assistant", ...). Chat compares it with "user" exactly, to find
	// the first user message.
	Role string
	// Content is the message's text.
	Content string
}

// Keyer computes affinity keys: seeded 64-bit hashes that are never 0 (0
// means "no affinity" in inferlb.Request). The zero Keyer is not usable; use
// NewKeyer. A Keyer is immutable and safe for concurrent use.
type Keyer struct {
	seed  uint64
	depth int
}

// NewKeyer returns a Keyer for seed with DefaultDepth. A seed of 0 draws a
// random one from crypto/rand, so keys cannot be predicted from outside the
// process.
func NewKeyer(seed uint64) *Keyer {
	if seed == 0 {
		seed = randomSeed()
	}
	return &Keyer{seed: seed, depth: DefaultDepth}
}

// randomSeed draws a seed from crypto/rand; never 0, which marks the
// unusable zero Keyer.
func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// WithDepth returns a copy of k whose keys cover chars characters of the
// first user message (Chat) or of the prompt (Prompt). Larger depths tell
// more conversations apart; smaller ones let more requests that open with
// the same long context share an endpoint. chars is clamped to
// [BlockChars, MaxKeyChars]. On the zero Keyer it is
// NewKeyer(0).WithDepth(chars): a copy with a usable depth must not keep
// the seed 0 everyone knows, under which an outsider can compute keys.
func (k *Keyer) WithDepth(chars int) *Keyer {
	c := *k
	if c.seed == 0 {
		c.seed = randomSeed()
	}
	c.depth = min(max(chars, BlockChars), MaxKeyChars)
	return &c
}

// Seed returns the seed in use.
func (k *Keyer) Seed() uint64 { return k.seed }

// Depth returns how many characters of the first user message or prompt
// the keys cover.
func (k *Keyer) Depth() int { return k.depth }

// Session returns the key for an explicit session or conversation ID, or 0
// (no affinity) for an empty ID.
func (k *Keyer) Session(id string) uint64 {
	return k.named("session\x00", id)
}

// Tenant returns the placement key of a tenant name, for shuffle sharding:
// seeded like every other key and tagged, so a tenant and a session with
// the same name land apart. 0 for an empty name. It does not allocate.
func (k *Keyer) Tenant(name string) uint64 {
	return k.named("tenant\x00", name)
}

// Salted returns key scoped to a cache salt (vLLM's cache_salt: requests
// with different salts never share prefix-cache blocks, which isolates one
// tenant's cache from another's timing): requests that agree on their key
// but not their salt get different keys, so they are not sent to one owner
// for a cache they cannot share. An empty salt, or a zero key, returns key
// unchanged. It does not allocate.
func (k *Keyer) Salted(key uint64, salt string) uint64 {
	if salt == "" || key == 0 {
		return key
	}
	var d xxhash.Digest
	d.ResetWithSeed(k.seed)
	_, _ = d.WriteString("salt\x00")
	_, _ = d.WriteString(salt)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], key)
	_, _ = d.Write(b[:])
	return nonZero(d.Sum64())
}

func (k *Keyer) named(tag, id string) uint64 {
	if id == "" {
		return 0
	}
	var d xxhash.Digest
	d.ResetWithSeed(k.seed)
	_, _ = d.WriteString(tag)
	_, _ = d.WriteString(id)
	return nonZero(d.Sum64())
}

// Domain tags keep chat, plain-prompt and session keys apart even when their
// bytes agree: the engines render them differently, so they share no cache.
const (
	tagChat   = "chat\x00"
	tagPrompt = "prompt\x00"
)

// Chat returns the affinity key of a chat request: the chained block hash
// of the rendered messages from the start through the first message whose
// Role is "user", of which at most Depth characters of content count, and
// never more than MaxKeyChars in all. Without a user message every message
// counts, up to MaxKeyChars.
//
// Why that depth: the messages up to and including the first user turn are
// what every later turn of the same conversation repeats verbatim, so the key
// stays put while the conversation grows and its KV cache stays useful. The
// system prompt is counted in full because it is what unrelated conversations
// of one application share: if it alone decided the key, a whole agent
// fleet with a 40 KB system prompt would pile onto one endpoint and lose
// per-conversation stickiness, the affinity that pays most. The first user
// message is where conversations part, except when it opens with a long
// shared context (a RAG document, a file, a transcript) followed by
// different questions; capping its contribution at Depth characters makes
// such requests share a key, so the context is prefilled once and its KV
// blocks are reused. The bounded load in the balancer keeps such a shared
// key from overloading its owner: it spills along the key's own Walk.
//
// Chat does not allocate.
func (k *Keyer) Chat(model string, msgs []Message) uint64 {
	var c chain
	c.start(k.seed, tagChat, model, MaxKeyChars, nil)
	for i := range msgs {
		m := &msgs[i]
		if m.Role == "user" {
			if len(m.Content) >= k.depth {
				c.write(m.Content[:k.depth])
			} else {
				c.record(m)
			}
			break
		}
		c.record(m)
		if c.full() {
			break
		}
	}
	return nonZero(c.sum())
}

// Prompt returns the affinity key of a plain (completions API) prompt: the
// chained block hash of its first Depth characters. A prompt has no turns to
// tell a conversation from its shared preamble, so the depth is the only
// rule: prompts that agree on their first Depth characters share a key and
// the KV cache of that prefix. Prompt does not allocate.
func (k *Keyer) Prompt(model, prompt string) uint64 {
	var c chain
	c.start(k.seed, tagPrompt, model, k.depth, nil)
	c.write(prompt)
	return nonZero(c.sum())
}

// Blocks appends to dst the chained hashes of every complete BlockChars
// block of the rendered conversation (all messages, no depth limit) and
// returns the extended slice. Element i identifies the first (i+1) *
// BlockChars characters: two requests agree on element i exactly when (up to
// 64-bit collisions) they agree on that whole prefix, which is what a
// longest-prefix index or a simulated KV cache needs. A trailing partial
// block is left out, as engines cache only full blocks. Blocks allocates only
// when dst must grow.
//
// When the key depth of Chat falls on a block boundary, the key equals the
// block hash there (or 1 where that hash is 0).
func (k *Keyer) Blocks(model string, msgs []Message, dst []uint64) []uint64 {
	c := chain{collect: true}
	c.start(k.seed, tagChat, model, -1, dst)
	for i := range msgs {
		c.record(&msgs[i])
	}
	return c.dst
}

// PromptBlocks is Blocks for a plain prompt.
func (k *Keyer) PromptBlocks(model, prompt string, dst []uint64) []uint64 {
	c := chain{collect: true}
	c.start(k.seed, tagPrompt, model, -1, dst)
	c.write(prompt)
	return c.dst
}

// chain is the chained block hash: block i is hashed with XXH64 seeded by
// the hash of block i-1, and block 0 by a hash of (Keyer seed, domain tag,
// model). Each block hash therefore depends on the secret seed, the model and
// every byte before it, and the chain can stop at any depth without knowing
// the rest of the input. The digest lives on the caller's stack.
type chain struct {
	d       xxhash.Digest
	h       uint64 // hash through the last complete block; seeds the current one
	fill    int    // bytes in the current block
	left    int    // bytes the chain may still take; negative means no limit
	collect bool   // append each complete block's hash to dst
	dst     []uint64
}

func (c *chain) start(seed uint64, tag, model string, limit int, dst []uint64) {
	// The model name is the salt: the same prompt on two models shares no KV
	// cache, so it must not share an owner by construction either.
	c.d.ResetWithSeed(seed)
	var buf [96]byte
	if len(tag)+len(model) <= len(buf) {
		// One write instead of two: the digest of a stream does not depend
		// on how it is split, and each write has a fixed cost.
		n := copy(buf[:], tag)
		n += copy(buf[n:], model)
		_, _ = c.d.Write(buf[:n])
	} else {
		_, _ = c.d.WriteString(tag)
		_, _ = c.d.WriteString(model)
	}
	c.h = c.d.Sum64()
	c.d.ResetWithSeed(c.h)
	c.left = limit
	c.dst = dst
}

// full reports whether the chain has reached its limit.
func (c *chain) full() bool { return c.left == 0 }

func (c *chain) write(s string) {
	if c.left >= 0 && len(s) > c.left {
		s = s[:c.left]
	}
	if c.left > 0 {
		c.left -= len(s)
	}
	for len(s) > 0 {
		room := BlockChars - c.fill
		if len(s) < room {
			_, _ = c.d.WriteString(s)
			c.fill += len(s)
			return
		}
		_, _ = c.d.WriteString(s[:room])
		s = s[room:]
		c.h = c.d.Sum64()
		c.d.ResetWithSeed(c.h)
		c.fill = 0
		if c.collect {
			c.dst = append(c.dst, c.h)
		}
	}
}

// record renders one message as content, role, len(role), len(content), the
// lengths as fixed 8-byte little-endian integers. The encoding is injective
// (parse it backwards: the last 16 bytes give both lengths), so different
// message lists, or the same text split differently into messages, render
// differently. The content comes first and its length last so that requests
// whose messages open with the same long text share those blocks, as their
// token streams share the engine's KV blocks; a length prefix would make them
// differ from the first byte.
func (c *chain) record(m *Message) {
	c.write(m.Content)
	var b [48]byte
	n := 0
	if len(m.Role) <= len(b)-16 {
		n = copy(b[:], m.Role) // role and lengths in one write (roles are short)
	} else {
		c.write(m.Role)
	}
	binary.LittleEndian.PutUint64(b[n:], uint64(len(m.Role)))
	binary.LittleEndian.PutUint64(b[n+8:], uint64(len(m.Content)))
	c.writeBytes(b[:n+16])
}

func (c *chain) writeBytes(b []byte) {
	// Role and lengths are short; staging them through a string keeps one
	// write path. The string does not outlive the call.
	c.write(unsafe.String(unsafe.SliceData(b), len(b)))
}

// sum is the hash of everything written: the last complete block's hash when
// the input ends on a block boundary, else the digest of the partial block.
func (c *chain) sum() uint64 {
	if c.fill == 0 {
		return c.h
	}
	return c.d.Sum64()
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}
