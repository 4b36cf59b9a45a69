package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An unanswered wait only a little longer than the EWMA becomes the EWMA
// as a much longer one does: an embedder whose calls are abandoned at 1.5x
// its latency is at least that slow, and the scorer must see it.
func TestUnansweredWaitJustPastTheEWMABecomesIt(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
	const svc = inferlb.ServiceEmbedding

	call(t, b, clock, svc, 200*time.Millisecond, inferlb.Outcome{})
	call(t, b, clock, svc, 200*time.Millisecond, inferlb.Outcome{}) // the EWMA starts at the second (see endpoint.observe)
	_, ewma := seenLatency(t, b, svc)
	require.Equal(t, 200*time.Millisecond, ewma)

	call(t, b, clock, svc, 300*time.Millisecond, inferlb.Outcome{Err: context.Canceled, Unanswered: true})
	seen, ewma := seenLatency(t, b, svc)
	assert.Equal(t, 300*time.Millisecond, ewma, "a wait of 1.5x the EWMA becomes it")
	assert.Equal(t, 300*time.Millisecond, seen)
}

// With the first answer's latency held aside (see endpoint.observe), the scorer sees no
// EWMA yet; an unanswered wait starts it at that answer's latency and
// bounds it below as any EWMA, also when the wait is shorter than that
// answer (left at none, the endpoint was priced as an idle probe:
// TestHungAfterOneSlowAnswerStopsDrawingCalls).
func TestUnansweredWaitAfterFirstAnswer(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
	const svc = inferlb.ServiceRerank
	abandoned := inferlb.Outcome{Err: context.Canceled, Unanswered: true}

	call(t, b, clock, svc, 200*time.Millisecond, inferlb.Outcome{})
	_, ewma := seenLatency(t, b, svc)
	require.Zero(t, ewma, "the first answer is held aside")
	clock.Advance(10 * time.Second)
	call(t, b, clock, svc, 150*time.Millisecond, abandoned)
	seen, ewma := seenLatency(t, b, svc)
	assert.Equal(t, 200*time.Millisecond, ewma, "a wait within the first answer's latency starts the EWMA at it")
	assert.InDelta(t, float64(150*time.Millisecond), float64(seen), float64(time.Millisecond), "and the scorer sees at least the wait")
	call(t, b, clock, svc, 300*time.Millisecond, abandoned)
	seen, ewma = seenLatency(t, b, svc)
	assert.Equal(t, 300*time.Millisecond, ewma, "a longer wait raises it")
	assert.Equal(t, 300*time.Millisecond, seen)
}
