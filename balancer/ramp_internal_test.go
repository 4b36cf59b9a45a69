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

// A SlowStartWindow of centuries ("ramp for ever") wrapped the ramp's end
// negative, so the member counted as not ramping where its standing is
// built (the affinity load bound then shared the load at its full
// weight), while rampFactor gave it its slow-start weight.
func TestRampEndOfAWindowOfCenturies(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), SlowStartWindow: math.MaxInt64})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}))
	clock.Advance(time.Minute)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "10.0.0.2:8000"}}))
	b.mu.Lock()
	e := b.eps["10.0.0.2:8000"]
	b.mu.Unlock()
	require.NotNil(t, e)
	nowNs := clock.Now().UnixNano()
	require.Less(t, e.rampFactor(b.cfg, nowNs), 1.0, "joined a serving fleet: ramping")
	end, ramping := e.rampEnd(b.cfg, nowNs)
	assert.True(t, ramping, "ramp end %d", end)
	assert.Greater(t, end, nowNs)
}
