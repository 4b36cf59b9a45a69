package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// seenLatency is the latency of svc the scorer sees on the only endpoint
// of b, decayed to now, and the EWMA beneath it.
func seenLatency(t *testing.T, b *Balancer, svc inferlb.Service) (seen, ewma time.Duration) {
	t.Helper()
	b.mu.Lock()
	e := b.eps["a:80"]
	b.mu.Unlock()
	require.NotNil(t, e)
	var st scoring.State
	e.state(b.cfg, b.Now(), svc, 1, &st)
	return st.Latency(), st.LatencyEWMA
}

// call picks for svc, lets d pass and reports o.
func call(t *testing.T, b *Balancer, clock *testutil.Clock, svc inferlb.Service, d time.Duration, o inferlb.Outcome) {
	t.Helper()
	p, err := b.Pick(&inferlb.Request{Service: svc})
	require.NoError(t, err)
	clock.Advance(d)
	p.Done(o)
}

// A call abandoned with nothing back from the endpoint (Outcome.Unanswered)
// is a censored latency sample: it raises the latency the scorer sees to
// its wait, the EWMA itself when the wait is longer, else by moving the
// decay's start, and never lowers it. Only embeddings and rerankers are
// priced by it.
func TestUnansweredWaitRaisesLatencyOnly(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
	abandoned := inferlb.Outcome{Err: context.Canceled, Unanswered: true}
	const svc = inferlb.ServiceEmbedding

	call(t, b, clock, svc, 50*time.Millisecond, abandoned)
	_, ewma := seenLatency(t, b, svc)
	assert.Zero(t, ewma, "no latency yet: the scorer's prior prices the endpoint, not the wait")

	call(t, b, clock, svc, 200*time.Millisecond, inferlb.Outcome{})
	call(t, b, clock, svc, 200*time.Millisecond, inferlb.Outcome{}) // the EWMA starts at the second (see endpoint.observe)
	call(t, b, clock, svc, 50*time.Millisecond, abandoned)
	seen, ewma := seenLatency(t, b, svc)
	assert.Equal(t, 200*time.Millisecond, ewma, "a wait shorter than the latency says nothing")
	assert.Greater(t, seen, 190*time.Millisecond)

	call(t, b, clock, svc, time.Second, inferlb.Outcome{Err: context.Canceled})
	_, ewma = seenLatency(t, b, svc)
	assert.Equal(t, 200*time.Millisecond, ewma, "a cancel not known to be unanswered says nothing")

	call(t, b, clock, svc, time.Second, abandoned)
	seen, ewma = seenLatency(t, b, svc)
	assert.Equal(t, time.Second, ewma, "a wait longer than the EWMA becomes it")
	assert.Equal(t, time.Second, seen)

	// Decayed for a time constant, the scorer sees about 0.37 s; a wait of
	// half a second raises that, and leaves the EWMA.
	clock.Advance(DefaultLatencyDecay)
	seen, _ = seenLatency(t, b, svc)
	require.Less(t, seen, 400*time.Millisecond)
	call(t, b, clock, svc, 500*time.Millisecond, abandoned)
	seen, ewma = seenLatency(t, b, svc)
	assert.Equal(t, time.Second, ewma)
	assert.InDelta(t, float64(500*time.Millisecond), float64(seen), float64(time.Millisecond), "seen %v", seen)
	// A shorter wait then leaves it to its decay.
	call(t, b, clock, svc, 300*time.Millisecond, abandoned)
	after, ewma := seenLatency(t, b, svc)
	assert.Equal(t, time.Second, ewma)
	assert.Less(t, after, seen)
	assert.Greater(t, after, 400*time.Millisecond)

	// A generation's wait, and an unclassified call's, change nothing: a
	// non-streamed generation sends nothing until it is done.
	for _, other := range []inferlb.Service{inferlb.ServiceLLM, inferlb.ServiceUnknown} {
		call(t, b, clock, other, time.Second, inferlb.Outcome{})
		call(t, b, clock, other, time.Minute, abandoned)
		_, ewma = seenLatency(t, b, other)
		assert.Equal(t, time.Second, ewma, "%v", other)
	}
	// Each is counted, whatever its service, among the cancellations.
	st := b.Stats()
	require.Len(t, st, 1)
	assert.EqualValues(t, 8, st[0].Canceled)
	assert.EqualValues(t, 7, st[0].Unanswered)
}
