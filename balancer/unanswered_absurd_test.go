package balancer_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An unanswered call's wait is held to the same bound as a reported
// latency (TestAbsurdLatencyDoesNotWrapTheEWMA): a caller reporting a wait
// near the largest Duration must not leave an EWMA the next answer's
// arithmetic wraps negative, nor one of centuries.
func TestAbsurdUnansweredWaitIsHeldToTheLatencyBound(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	end := func(o inferlb.Outcome) time.Duration {
		t.Helper()
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		p.Done(o)
		return b.Stats()[0].Latency
	}
	require.Equal(t, time.Second, end(inferlb.Outcome{Latency: time.Second}))
	held := end(inferlb.Outcome{Err: context.Canceled, Unanswered: true, Latency: math.MaxInt64})
	assert.Greater(t, held, time.Second, "the wait still raises the latency")
	assert.LessOrEqual(t, held, time.Duration(1)<<50, "to at most the bound a reported latency has (13 days)")
	assert.Positive(t, end(inferlb.Outcome{Latency: time.Second}), "the next answer leaves it positive")
}
