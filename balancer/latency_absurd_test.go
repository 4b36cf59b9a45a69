package balancer_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A latency or time to first token reported near the largest Duration (a
// caller's arithmetic gone wrong through the core API) wrapped the
// peak-EWMA negative on the next report: the endpoint then read as the
// fastest there is, and an embedding fleet's latency scorer herded onto
// it. Reports are held to maxObserved.
func TestAbsurdLatencyDoesNotWrapTheEWMA(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 1, balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	for _, l := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, time.Second} {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		p.Done(inferlb.Outcome{Latency: l, TTFT: l, OutputTokens: 10})
		s := b.Stats()[0]
		assert.Positive(t, s.Latency, "after a report of %v", l)
		assert.GreaterOrEqual(t, s.TTFT, time.Duration(0), "after a report of %v", l)
	}
}
