package fleetsim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
