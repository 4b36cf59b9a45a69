package fleetsim

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPromptsSharingAPrefixShareBlockHashes(t *testing.T) {
	ctx := Segment{ID: 1, Tokens: 100}
	a := NewPrompt(ctx, Segment{ID: 2, Tokens: 50})
	b := NewPrompt(ctx, Segment{ID: 3, Tokens: 50})
	require.Len(t, a.Hashes, 150/BlockSize)
	assert.Equal(t, a.Hashes[:100/BlockSize], b.Hashes[:100/BlockSize], "blocks inside the shared context")
	assert.NotEqual(t, a.Hashes[100/BlockSize], b.Hashes[100/BlockSize], "the block that straddles into the question")
	assert.Equal(t, a.Hashes, a.Extend().Hashes)
	// Same tokens in a different position hash differently: hashes are chained.
	c := NewPrompt(Segment{ID: 2, Tokens: 50})
	assert.NotEqual(t, c.Hashes[0], a.Hashes[100/BlockSize])
}

// Extend hashes only what follows its prompt's last full block: the
// result must be NewPrompt's of all the segments, whatever the segments'
// lengths against the block size (zero, under one block, ending on a
// block's edge or within one), turn after turn.
func TestExtendHashesAsNewPrompt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 5, BlockSize - 1, BlockSize, BlockSize + 1, 2 * BlockSize, 100, 333}
	for trial := range 50 {
		all := []Segment{}
		p := NewPrompt()
		for turn := range 8 {
			segs := make([]Segment, rng.IntN(3))
			for i := range segs {
				segs[i] = Segment{ID: rng.Uint64(), Tokens: lengths[rng.IntN(len(lengths))]}
			}
			all = append(all, segs...)
			p = p.Extend(segs...)
			want := NewPrompt(all...)
			require.Equal(t, want.Tokens, p.Tokens, "trial %d turn %d", trial, turn)
			require.Equal(t, want.Segments, p.Segments, "trial %d turn %d", trial, turn)
			require.Equal(t, want.Hashes, p.Hashes, "trial %d turn %d", trial, turn)
		}
	}
}

// tokensAt reads the stream tokenAt does, from any start, across segments
// of any length (zero included), the prompt's end and into the answer; for
// prompts of segments and of explicit tokens.
func TestTokensAtReadsAsTokenAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	lengths := []int{0, 1, 5, BlockSize - 1, BlockSize, BlockSize + 1, 40}
	for trial := range 100 {
		segs := make([]Segment, rng.IntN(5))
		for i := range segs {
			segs[i] = Segment{ID: rng.Uint64(), Tokens: lengths[rng.IntN(len(lengths))]}
		}
		p := NewPrompt(segs...)
		raw := make([]uint64, rng.IntN(50))
		for i := range raw {
			raw[i] = rng.Uint64()
		}
		answer := rng.Uint64()
		for _, q := range []*Prompt{p, PromptFromTokens(raw)} {
			for start := range q.Tokens + 2*BlockSize {
				got := make([]uint64, rng.IntN(2*BlockSize)+1)
				q.tokensAt(start, answer, got)
				for k, tok := range got {
					require.Equal(t, q.tokenAt(start+k, answer), tok, "trial %d, start %d, token %d", trial, start, k)
				}
			}
		}
	}
}

func TestBlockPoolCachesAndEvictsLeastRecentlyFreed(t *testing.T) {
	p := newBlockPool(4)
	h := []uint64{11, 13, 15}
	tab, ok := p.alloc(3, nil)
	require.True(t, ok)
	for i, b := range tab {
		p.register(b, h[i])
	}
	assert.InDelta(t, 0.75, p.usage(), 1e-9)
	hit, idle := p.lookup(h)
	assert.Equal(t, 3, hit)
	assert.Equal(t, 0, idle, "all referenced")
	p.release(tab)
	assert.Equal(t, 0.0, p.usage(), "cached blocks count as free, as in vLLM")
	hit, idle = p.lookup(h)
	assert.Equal(t, 3, hit, "freed blocks stay cached")
	assert.Equal(t, 3, idle)

	// Two new blocks: the never-used block goes first, then the prompt's
	// tail (freed first), so the head of the prefix survives.
	_, ok = p.alloc(2, nil)
	require.True(t, ok)
	hit, _ = p.lookup(h)
	assert.Equal(t, 2, hit)
	_, ok = p.alloc(3, nil)
	assert.False(t, ok, "only two blocks left")

	// Touching a cached block takes it off the free queue.
	p2 := newBlockPool(2)
	tab, _ = p2.alloc(1, nil)
	p2.register(tab[0], 7)
	p2.release(tab)
	tab = p2.touch([]uint64{7}, 1, nil)
	assert.Equal(t, 1, p2.nFree)
	_, ok = p2.alloc(2, nil)
	assert.False(t, ok)
	p2.release(tab)
}

func TestHashTableDeleteKeepsProbeRuns(t *testing.T) {
	tb := newHashTable(8)
	// Keys with the same home slot form one probe run.
	keys := []uint64{1 << 40, 2 << 40, 3 << 40, 4 << 40}
	for i, k := range keys {
		tb.put(k|1, int32(i))
	}
	tb.del(keys[1] | 1)
	for i, k := range keys {
		v, ok := tb.get(k | 1)
		if i == 1 {
			assert.False(t, ok)
			continue
		}
		assert.True(t, ok)
		assert.Equal(t, int32(i), v)
	}
}
