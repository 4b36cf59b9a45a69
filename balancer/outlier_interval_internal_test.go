package balancer

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An OutlierInterval as long as a Duration goes (a way to say "never")
// set the next evaluation to now plus it, which wrapped to a time long
// past: every Done then ran an evaluation, a scan of the whole fleet, and
// each one restarted every endpoint's window, so none was ever judged.
func TestHugeOutlierIntervalSchedulesTheNextEvaluationAhead(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: time.Duration(math.MaxInt64)})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a"}, {ID: "b"}}))
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	now := clock.Now().UnixNano()
	assert.Greater(t, b.nextOutlier.Load(), now, "the next evaluation is ahead")
	assert.False(t, b.outliersDue(now+int64(time.Hour)), "not due an hour later")
}
