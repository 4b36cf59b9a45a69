package fleetsim_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

func TestLiveServerStreamsTokensAndCachesPrefixes(t *testing.T) {
	l := fleetsim.NewLiveServer(fleetsim.LLMServer(), 1, 100)
	defer l.Close()
	prompt := fleetsim.PromptFromTokens(fleetsim.TextTokens(fleetsim.Text(fleetsim.Segment{ID: 1, Tokens: 2000})))
	for round := range 2 {
		n := 0
		var end fleetsim.Token
		for tok := range l.Generate(prompt, 5) {
			if tok.End {
				end = tok
				break
			}
			n++
			assert.Equal(t, n, tok.N)
		}
		require.True(t, end.End, "round %d", round)
		require.NoError(t, end.Err)
		assert.Equal(t, 5, n)
	}
	st := l.Stats()
	assert.Equal(t, int64(4000), st.QueryTokens)
	assert.Equal(t, int64(2000/fleetsim.BlockSize-1)*fleetsim.BlockSize, st.HitTokens, "the second call reuses all but the last block")
}

// A call made after Close ends at once with ErrStopped: with the engine's
// goroutine gone, nothing would ever run it, and its caller (an HTTP
// handler, which httptest.Server.Close then waits for) would hang.
func TestLiveServerCallAfterCloseEndsWithErrStopped(t *testing.T) {
	l := fleetsim.NewLiveServer(fleetsim.LLMServer(), 1, 100)
	l.Close()
	ch := l.Generate(fleetsim.PromptFromTokens(fleetsim.TextTokens("hello")), 3)
	select {
	case tok := <-ch:
		require.True(t, tok.End)
		require.ErrorIs(t, tok.Err, fleetsim.ErrStopped)
	default:
		t.Fatal("a call after Close got no answer")
	}
	_, open := <-ch
	assert.False(t, open, "the channel is closed after the end")
}

// Close may be called from several goroutines at once (it is safe for
// concurrent use); each returns once the calls in progress have ended.
func TestLiveServerConcurrentClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := fleetsim.LLMServer()
	p.KVTokens = 2000
	for range 1000 {
		l := fleetsim.NewLiveServer(p, 1, 1)
		ch := l.Generate(fleetsim.PromptFromTokens(fleetsim.TextTokens("hello")), 1000)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Go(func() {
				<-start
				l.Close()
			})
		}
		close(start)
		wg.Wait()
		var end fleetsim.Token
		for tok := range ch {
			end = tok
		}
		require.ErrorIs(t, end.Err, fleetsim.ErrStopped)
	}
}

// A call whose prompt and answer cannot fit in the whole KV cache is
// refused at once (vLLM answers 400 for one longer than its context): queued,
// it would never be admitted and every call behind it would wait for ever.
// Nor does a huge token count size the answer's channel.
func TestLiveServerRefusesACallLargerThanTheKVCache(t *testing.T) {
	p := fleetsim.LLMServer()
	p.KVTokens = 1000
	l := fleetsim.NewLiveServer(p, 1, 100)
	defer l.Close()
	small := fleetsim.PromptFromTokens(fleetsim.TextTokens(fleetsim.Text(fleetsim.Segment{ID: 1, Tokens: 100})))
	big := fleetsim.PromptFromTokens(fleetsim.TextTokens(fleetsim.Text(fleetsim.Segment{ID: 2, Tokens: 990})))
	for _, c := range []struct {
		prompt *fleetsim.Prompt
		out    int
	}{{big, 20}, {small, min(1<<40, math.MaxInt)}, {small, math.MaxInt}} { // min: for 32-bit ints
		ch := l.Generate(c.prompt, c.out)
		select {
		case tok := <-ch:
			require.True(t, tok.End)
			require.ErrorIs(t, tok.Err, fleetsim.ErrTooLong)
		default:
			t.Fatalf("a call of %d+%d tokens on a %d-token cache was queued", c.prompt.Tokens, c.out, p.KVTokens)
		}
	}
	// The replica still serves: nothing is wedged at the head of its queue;
	// and a call that fills the cache exactly (the last token is never
	// stored: 990+3-1 = 992 tokens, 62 blocks) is served.
	for _, c := range []struct {
		prompt *fleetsim.Prompt
		out    int
	}{{small, 5}, {big, 3}} {
		var end fleetsim.Token
		for tok := range l.Generate(c.prompt, c.out) {
			end = tok
		}
		require.True(t, end.End)
		require.NoError(t, end.Err)
	}
}
