package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

const (
	fastEP = "10.0.0.0:8000"
	slowEP = "10.0.0.1:8000"
)

// teachSpeeds finishes 40 streamed generation calls on a fleet of two:
// 100 output tokens after a 100 ms first token, at the given time per
// output token on each endpoint, or with the given token count.
func teachSpeeds(t *testing.T, b *balancer.Balancer, tpot map[string]time.Duration, tokens int) {
	t.Helper()
	for range 40 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		ttft := 100 * time.Millisecond
		p.Done(inferlb.Outcome{TTFT: ttft, OutputTokens: tokens,
			Latency: ttft + time.Duration(tokens-1)*tpot[p.ID()]})
	}
}

// holdSplit holds 60 generation calls and returns how many each endpoint took.
func holdSplit(t *testing.T, b *balancer.Balancer) (fast, slow int64) {
	t.Helper()
	held := make([]balancer.Pick, 0, 60)
	for range 60 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		held = append(held, p)
	}
	fast, slow = stat(t, b, fastEP).InFlight, stat(t, b, slowEP).InFlight
	for i := range held {
		held[i].Done(inferlb.Outcome{Err: context.Canceled})
	}
	return fast, slow
}

func TestDecodeSpeedScalesGenerationPicks(t *testing.T) {
	speeds := map[string]time.Duration{fastEP: 20 * time.Millisecond, slowEP: 60 * time.Millisecond}
	b := newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3)})
	teachSpeeds(t, b, speeds, 100)
	assert.Equal(t, 20*time.Millisecond, stat(t, b, fastEP).TimePerOutputToken)
	assert.Equal(t, 60*time.Millisecond, stat(t, b, slowEP).TimePerOutputToken)

	// Equal loads cost 3/1.1 times more on the 3x slower endpoint: P2C
	// settles near 44:16 instead of 30:30.
	fast, slow := holdSplit(t, b)
	assert.GreaterOrEqual(t, fast, 2*slow, "fast %d, slow %d", fast, slow)

	// Calls too short to time decoding teach nothing: costs alone decide
	// (in-flight counts here, as the LLM scorer ignores completion latency).
	b = newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3)})
	teachSpeeds(t, b, speeds, 3)
	assert.Zero(t, stat(t, b, slowEP).TimePerOutputToken)
	fast, slow = holdSplit(t, b)
	assert.InDelta(t, fast, slow, 2, "fast %d, slow %d", fast, slow)
}
