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

// shortsFirst counts the short generation calls, held, that go elsewhere
// before busy gets one.
func shortsFirst(t *testing.T, b *balancer.Balancer, busy string) int {
	t.Helper()
	var held []balancer.Pick
	defer func() {
		for i := range held {
			held[i].Done(inferlb.Outcome{})
		}
	}()
	for n := 0; ; n++ {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100})
		require.NoError(t, err)
		held = append(held, p)
		if p.ID() == busy || n > 100 {
			return n
		}
	}
}

func TestRecentPrefillDelaysTheNextFirstToken(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
	// A 30k-token prompt goes out and stays in flight. In-flight calls and
	// tokens price it the same all along; its prefill only while recent.
	long, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 30000})
	require.NoError(t, err)
	busy := long.ID()
	now := shortsFirst(t, b, busy)
	clock.Advance(3 * time.Second) // six prefill windows: the prefill is done
	later := shortsFirst(t, b, busy)
	assert.Greater(t, now, later+4, "just sent: %d short calls went elsewhere first; 3s later: %d", now, later)

	// An ended call is past its prefill at once: the two are equal again.
	long.Done(inferlb.Outcome{})
	long, err = b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 30000})
	require.NoError(t, err)
	busy = long.ID()
	long.Done(inferlb.Outcome{})
	split := map[string]int{}
	for range 200 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		split[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	assert.InDelta(t, 100, split[busy], 25, "split %v", split)

	// A prompt its affinity key placed is likely cached there: its prefill
	// is short, and it is not counted.
	clock.Advance(3 * time.Second)
	keyed, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 30000, AffinityKey: 99})
	require.NoError(t, err)
	assert.InDelta(t, later, shortsFirst(t, b, keyed.ID()), 1, "as if the long prompt had been sent long ago")
	keyed.Done(inferlb.Outcome{})
}
