package fleetsim_test

import (
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
