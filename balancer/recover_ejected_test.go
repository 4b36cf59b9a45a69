package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A breaker whose half-open probes pass while outlier detection has
// ejected the endpoint (the evaluation fell while the probes were out)
// started the slow-start ramp at the recovery, though the endpoint
// stayed held out until the ejection ended: it came back at full weight
// (an ejection longer than SlowStartWindow) or part way up. As for a
// reconnect during an ejection, the ramp starts when the endpoint is
// eligible for traffic again.
func TestRecoveryDuringEjectionStillRampsAtItsEnd(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{
		Clock: clock, Rand: testutil.NewRand(4), OnEvent: rec.record, Scorers: constantScorers(),
		SlowStartWindow: time.Second, OutlierInterval: 15 * time.Second, OutlierMinRequests: 3,
	})
	bad := endpoints(4)[0].Addr
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, bad)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	for range 40 { // the others' calls of the interval
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())

	clock.Advance(balancer.DefaultEjectionTime) // half-open
	var probes []balancer.Pick
	for range balancer.DefaultBreakerProbes {
		probes = append(probes, pickOn(t, b, bad))
	}
	clock.Advance(5 * time.Second) // the evaluation: an outlier
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventEjected}, rec.kinds())
	ejected := rec.last()

	for i := range probes {
		probes[i].Done(inferlb.Outcome{})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventEjected, balancer.EventRecovered}, rec.kinds())
	require.Greater(t, ejected.Until.Sub(clock.Now()), time.Second, "the test needs the ejection to outlast the window")

	clock.Set(ejected.Until)
	assert.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, bad).RampFactor, 1e-9,
		"returns at full weight: the ramp ran out during the ejection")
	clock.Advance(time.Second)
	assert.Equal(t, 1.0, stat(t, b, bad).RampFactor, "the ramp ends a window after the ejection")
}
