package fleetsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// oracleFleet is two idle LLM replicas of blocks KV blocks each, with the
// oracle over them.
func oracleFleet(blocks int) (*run, *oracle) {
	p := LLMServer()
	p.KVTokens = blocks * BlockSize
	s := &run{sc: &Scenario{}, cfg: RunConfig{Duration: 1 << 62}, classE2E: map[string][]float64{}}
	for i, id := range []string{"a", "b"} {
		s.reps = append(s.reps, newReplica(i, id, p, 1, s))
	}
	o := &oracle{run: s}
	o.SetMembers([]int{0, 1})
	return s, o
}

func oracleCall(prompt *Prompt, out int) *Request {
	return &Request{Service: inferlb.ServiceLLM, Model: Model, Prompt: prompt, OutputTokens: out, MaxOutputTokens: out}
}

// decoding puts on r a running sequence that has prefilled its prompt of
// tokens and generated one token of out, holding the blocks of its
// computed tokens.
func decoding(t *testing.T, r *replica, id uint64, tokens, out int) {
	t.Helper()
	req := oracleCall(NewPrompt(Segment{ID: id, Tokens: tokens}), out)
	s := &seq{job: &job{req: req}, prompt: req.Prompt, hashes: req.Prompt.Hashes,
		computed: tokens, generated: 1, prefilled: true}
	var ok bool
	s.blocks, ok = r.kv.alloc((tokens+BlockSize-1)/BlockSize, nil)
	require.True(t, ok)
	r.running = append(r.running, s)
}

// cacheIdle leaves prompt's full blocks in r's prefix cache with nothing
// referencing them, as a finished call does: in the free pool.
func cacheIdle(t *testing.T, r *replica, prompt *Prompt) {
	t.Helper()
	tab, ok := r.kv.alloc(len(prompt.Hashes), nil)
	require.True(t, ok)
	for i, b := range tab {
		require.True(t, r.kv.register(b, prompt.Hashes[i]))
	}
	r.kv.release(tab)
}

// The oracle prices a request's wait for KV blocks. A running sequence
// still allocates a block every 16 tokens of the answer it has left, so a
// replica's free pool shrinks with no new request: on a, one sequence of
// 160 tokens has 2,999 tokens to go, 188 more blocks of a 200-block pool,
// and a request needing 40 blocks gets there only by preempting it (or
// being preempted). b runs two sequences about to finish. Counting a's 190
// free blocks as free, the oracle preferred a for its smaller batch.
func TestOraclePricesRunningSequencesDecodeGrowth(t *testing.T) {
	s, o := oracleFleet(200)
	a, b := s.reps[0], s.reps[1]
	decoding(t, a, 1, 160, 3000)
	decoding(t, b, 2, 160, 17)
	decoding(t, b, 3, 160, 17)
	require.Equal(t, 190, a.kv.nFree)
	require.Equal(t, 180, b.kv.nFree)

	req := oracleCall(NewPrompt(Segment{ID: 9, Tokens: 320}), 320)
	i, _, err := o.Pick(req)
	require.NoError(t, err)
	assert.Equal(t, 1, i, "a's free blocks are its running sequence's answer")
	assert.Greater(t, o.cost(a, req), o.cost(b, req))
}

// A cached block nothing references sits in the free pool, and leaves it
// when a request hits it: on a, 100 of the 160 free blocks of a 240-block
// pool are the request's own cached context, so it has 60 for its 151
// blocks of question and answer, and preempts (it is the last admitted,
// so itself, over and over). b holds no cache for it but 230 free blocks.
// Counting the hits as free, the oracle sent it to a for its hit.
func TestOracleDoesNotCountItsOwnHitsAsFree(t *testing.T) {
	s, o := oracleFleet(240)
	a, b := s.reps[0], s.reps[1]
	ctx := Segment{ID: 7, Tokens: 1600}
	cacheIdle(t, a, NewPrompt(ctx))
	decoding(t, a, 1, 1280, 2)
	decoding(t, b, 2, 160, 2)
	require.Equal(t, 160, a.kv.nFree)
	require.Equal(t, 230, b.kv.nFree)

	req := oracleCall(NewPrompt(ctx, Segment{ID: 8, Tokens: 16}), 2400)
	require.Equal(t, 100, a.kv.contains(req.Prompt.Hashes))
	i, _, err := o.Pick(req)
	require.NoError(t, err)
	assert.Equal(t, 1, i, "a's free blocks are the request's own hits")

	// The same hits taken by a request queued ahead count once.
	q := &seq{job: &job{req: oracleCall(NewPrompt(ctx, Segment{ID: 5, Tokens: 16}), 10)}}
	q.prompt, q.hashes = q.job.req.Prompt, q.job.req.Prompt.Hashes
	a.waiting = append(a.waiting, q)
	assert.Equal(t, 100, o.idleHits(a, req))
}

func TestIdleHitsCountsEachFreeCachedBlockOnce(t *testing.T) {
	p := newBlockPool(64)
	ctx := Segment{ID: 1, Tokens: 10 * BlockSize}
	x := NewPrompt(ctx, Segment{ID: 2, Tokens: 4 * BlockSize})
	y := NewPrompt(ctx, Segment{ID: 3, Tokens: 4 * BlockSize})
	cache := func(pr *Prompt) []int32 {
		tab, ok := p.alloc(len(pr.Hashes), nil)
		require.True(t, ok)
		for i, b := range tab {
			p.register(b, pr.Hashes[i]) // the context's blocks stay x's
		}
		return tab
	}
	p.release(cache(x))
	p.release(cache(y)) // its question's blocks: the context is x's
	// Reference x's first three blocks, as a running sequence would.
	tab := p.touch(x.Hashes, 3, nil)
	mark := make([]uint32, 64)

	assert.Equal(t, 14-3, p.idleHits(x.Hashes, mark, 1), "x's blocks but the three referenced")
	assert.Equal(t, 4, p.idleHits(y.Hashes, mark, 1), "y's question only: the context is counted")
	assert.Zero(t, p.idleHits(x.Hashes, mark, 1))
	assert.Equal(t, 14-3, p.idleHits(x.Hashes, mark, 2), "a new generation counts afresh")
	assert.Equal(t, 5-3, p.idleHits(y.Hashes[:5], mark, 3), "a prefix")
	assert.Equal(t, 14-5, p.idleHits(x.Hashes, mark, 3), "past the prefix already counted")
	p.release(tab)
}
