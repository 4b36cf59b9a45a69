package fleetsim

// Segment is a run of synthetic tokens with one content ID: a shared context,
// a user's question, a model's answer. Token i of a segment is a pure function
// of (ID, i), so two prompts that start with the same segments have the same
// leading tokens, and the server's prefix cache and the router's affinity key
// can both be computed from the content, as for real text.
type Segment struct {
	ID     uint64
	Tokens int
}

// Prompt is a request's input: its segments and the chained hashes of its
// full KV blocks, computed once when the prompt is built and shared by every
// request that sends it.
type Prompt struct {
	Segments []Segment
	Tokens   int
	Hashes   []uint64 // one per full block of BlockSize tokens
	raw      []uint64 // explicit tokens (from text) instead of Segments
}

// PromptFromTokens builds a prompt from explicit token values, such as
// TextTokens of a real request's text.
func PromptFromTokens(toks []uint64) *Prompt {
	p := &Prompt{Tokens: len(toks), raw: toks, Hashes: make([]uint64, 0, len(toks)/BlockSize)}
	var h blockHasher
	for _, t := range toks {
		if bh, ok := h.add(t); ok {
			p.Hashes = append(p.Hashes, bh)
		}
	}
	return p
}

// BlockSize is the KV-cache block size in tokens: vLLM's default --block-size
// of 16 (https://docs.vllm.ai/en/latest/configuration/engine_args.html).
const BlockSize = 16

// mix64 is SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a cheap bijective 64-bit mixer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// token is the synthetic token at offset i of segment id.
func token(id uint64, i int) uint64 {
	return mix64(id*0x9e3779b97f4a7c15 + uint64(i) + 1)
}

// blockHasher chains block hashes over a token stream, as vLLM hashes each
// full block together with its parent's hash.
type blockHasher struct {
	parent uint64
	cur    uint64
	n      int
}

// add feeds one token; it returns the block's hash when the token completes a block.
func (h *blockHasher) add(tok uint64) (uint64, bool) {
	if h.n == 0 {
		h.cur = mix64(h.parent ^ 0x51af3c2b7d4e9f01)
	}
	h.cur = mix64(h.cur ^ tok)
	h.n++
	if h.n < BlockSize {
		return 0, false
	}
	out := h.cur | 1 // 0 means "no hash" in the block pool
	h.parent, h.n = out, 0
	return out, true
}

// NewPrompt builds a prompt from segments and hashes its full blocks.
func NewPrompt(segs ...Segment) *Prompt {
	p := &Prompt{Segments: segs}
	for _, s := range segs {
		p.Tokens += s.Tokens
	}
	p.Hashes = make([]uint64, 0, p.Tokens/BlockSize)
	var h blockHasher
	p.hashFrom(&h, 0, 0)
	return p
}

// hashFrom feeds h the tokens of p's segments from segment seg, offset off
// on, appending each completed block's hash to p.Hashes.
func (p *Prompt) hashFrom(h *blockHasher, seg, off int) {
	for _, s := range p.Segments[seg:] {
		for i := off; i < s.Tokens; i++ {
			if bh, ok := h.add(token(s.ID, i)); ok {
				p.Hashes = append(p.Hashes, bh)
			}
		}
		off = 0
	}
}

// Extend returns a prompt that continues p with more segments (the next turn
// of a conversation), reusing p's hashes for the blocks they share: a chained
// block hash depends only on the tokens up to the block's end, so p's full
// blocks hash alike in the longer prompt, and only p's partial last block and
// the new segments are hashed. Hashing the whole conversation again at every
// turn took a quarter of the shedding scenario's run, with or without the
// race detector. The result is the same as NewPrompt of all the segments
// (TestExtendHashesAsNewPrompt).
func (p *Prompt) Extend(segs ...Segment) *Prompt {
	all := make([]Segment, 0, len(p.Segments)+len(segs))
	all = append(append(all, p.Segments...), segs...)
	if p.raw != nil {
		return NewPrompt(all...) // a prompt of explicit tokens has no segments to continue
	}
	q := &Prompt{Segments: all, Tokens: p.Tokens}
	for _, s := range segs {
		q.Tokens += s.Tokens
	}
	q.Hashes = make([]uint64, len(p.Hashes), q.Tokens/BlockSize)
	copy(q.Hashes, p.Hashes)
	// Resume the chain after p's last full block: its hash is the parent,
	// and the hasher takes the tokens from the block's end on.
	var h blockHasher
	if n := len(p.Hashes); n > 0 {
		h.parent = p.Hashes[n-1]
	}
	start := len(p.Hashes) * BlockSize
	seg, off := 0, start
	for seg < len(all) && off >= all[seg].Tokens {
		off -= all[seg].Tokens
		seg++
	}
	q.hashFrom(&h, seg, off)
	return q
}

// tokenAt returns token i of the stream formed by the prompt followed by an
// answer segment, which is how the server hashes blocks that straddle the end
// of the prompt.
func (p *Prompt) tokenAt(i int, answer uint64) uint64 {
	if p.raw != nil {
		if i < len(p.raw) {
			return p.raw[i]
		}
		return token(answer, i-len(p.raw))
	}
	for _, s := range p.Segments {
		if i < s.Tokens {
			return token(s.ID, i)
		}
		i -= s.Tokens
	}
	return token(answer, i)
}

// tokensAt fills out with tokens start, start+1, ... of the stream tokenAt
// reads. It finds start's segment once, where tokenAt walks the segments
// for every token: the server hashes each answer block this way, and the
// walk over a long conversation's segments for each token was 5% of the
// slowest chat tests' time under the race detector.
func (p *Prompt) tokensAt(start int, answer uint64, out []uint64) {
	if p.raw != nil {
		for k := range out {
			out[k] = p.tokenAt(start+k, answer)
		}
		return
	}
	seg, off := 0, start
	for seg < len(p.Segments) && off >= p.Segments[seg].Tokens {
		off -= p.Segments[seg].Tokens
		seg++
	}
	for k := range out {
		for seg < len(p.Segments) && off >= p.Segments[seg].Tokens {
			off -= p.Segments[seg].Tokens
			seg++
		}
		if seg < len(p.Segments) {
			out[k] = token(p.Segments[seg].ID, off)
		} else {
			out[k] = token(answer, off)
		}
		off++
	}
}

// promptID identifies p's content: its segments and their lengths, or its
// explicit tokens. Two prompts of the same text have the same ID.
func promptID(p *Prompt) uint64 {
	h := uint64(len(p.Segments))<<32 ^ uint64(p.Tokens)
	for _, s := range p.Segments {
		h = mix64(h ^ s.ID ^ uint64(s.Tokens)<<1)
	}
	for _, t := range p.raw {
		h = mix64(h ^ t)
	}
	return mix64(h)
}
