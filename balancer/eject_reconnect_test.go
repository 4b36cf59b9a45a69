package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An ejected endpoint ramps up through slow start when its ejection ends.
// One that lost its connection and got it back during the ejection (a
// replica that restarted while held out) started its ramp at the
// reconnect instead: an ejection longer than SlowStartWindow then ended
// with the endpoint at full weight at once, and a shorter one part way up.
func TestReconnectDuringEjectionStillRampsAtItsEnd(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(12), OnEvent: rec.record, BreakerFailures: -1, Scorers: constantScorers(),
		SlowStartWindow: time.Second,
	})
	bad := endpoints(4)[3].Addr
	failEveryOther(t, b, clock, bad, 4000, balancer.DefaultOutlierInterval/2000)
	require.Equal(t, []balancer.EventKind{balancer.EventEjected}, rec.kinds())
	ev := rec.last()
	require.Greater(t, ev.Until.Sub(clock.Now()), time.Second, "the test needs the ejection to outlast the window")

	require.True(t, b.SetReady(bad, false))
	clock.Advance(100 * time.Millisecond)
	require.True(t, b.SetReady(bad, true)) // reconnected, still ejected

	clock.Set(ev.Until)
	assert.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, bad).RampFactor, 1e-9,
		"returns at full weight: the ramp ran out during the ejection")
	clock.Advance(time.Second)
	assert.Equal(t, 1.0, stat(t, b, bad).RampFactor, "the ramp ends a window after the ejection")
}
