package inferlb_test

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
)

// Tokens never goes negative and saturates instead of wrapping: a request
// claiming a huge max_tokens must count as huge, not as nothing.
func TestRequestTokens(t *testing.T) {
	// The largest ints sum past int64 where an int is 64 bits, and fit it
	// where an int is 32.
	huge, past := int64(math.MaxInt64), int64(math.MaxInt64)
	if strconv.IntSize == 32 {
		huge, past = 2*math.MaxInt32, math.MaxInt32+1
	}
	for _, tc := range []struct {
		prompt, out int
		want        int64
	}{
		{100, 20, 120},
		{-5, 20, 20},
		{100, -1, 100},
		{math.MaxInt, 1, past},
		{math.MaxInt, math.MaxInt, huge},
	} {
		r := inferlb.Request{PromptTokens: tc.prompt, MaxOutputTokens: tc.out}
		assert.Equal(t, tc.want, r.Tokens(), "%d + %d", tc.prompt, tc.out)
	}
}

// Capacity reads every weight the balancer and the placement ring read as
// 1 as 1 too: a +Inf capacity divides every load to 0 and overflows any
// sum of weights a caller takes.
func TestEndpointCapacity(t *testing.T) {
	for _, tc := range []struct{ weight, want float64 }{
		{0, 1}, {2.5, 2.5}, {-3, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {math.Inf(-1), 1},
	} {
		assert.Equal(t, tc.want, inferlb.Endpoint{Weight: tc.weight}.Capacity(), "weight %v", tc.weight)
	}
}
