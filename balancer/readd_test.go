package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// An endpoint removed by Update and added back under the same ID is a new
// endpoint (a new Serial, clean state). The calls still out to the old one
// end on the old one's state, but what that state did by ID reached the
// new one: their failures tripped the old breaker, whose trip expired the
// load readings of the ID (the new replica's fresh report with them) and
// told OnEvent that the ID tripped, and an overload answer reported a
// cooldown of the ID, while the new endpoint was in rotation all along.
func TestReAddedEndpointIsNotChargedWithTheOldOnesCalls(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := resilient(t, clock, rec, 4)
	x := endpoints(4)[0].Addr
	s := serialOf(t, b, x)
	var old []balancer.Pick
	for range balancer.DefaultBreakerFailures + 1 {
		p, err := b.PickAt(&inferlb.Request{}, s)
		require.NoError(t, err)
		old = append(old, p)
	}
	require.NoError(t, b.Update(endpoints(4)[1:]))
	clock.Advance(time.Second)
	require.NoError(t, b.Update(endpoints(4)))
	require.NotEqual(t, s, serialOf(t, b, x), "a new endpoint")
	fresh := telemetry.Sample{Time: clock.Now()}
	fresh.Set(telemetry.Running, 3)
	b.Publish(x, fresh)
	clock.Advance(time.Second)

	old[0].Done(inferlb.Outcome{Overloaded: true})
	for i := range old[1:] {
		old[1+i].Done(inferlb.Outcome{Err: errDown})
	}
	assert.Empty(t, rec.kinds(), "events of the old endpoint, reported under the ID of the new one")
	st := stat(t, b, x)
	assert.False(t, st.BreakerOpen)
	assert.Zero(t, st.Failures)
	assert.Zero(t, st.InFlight)
	assert.True(t, st.Telemetry.Has.Has(telemetry.Running), "the new endpoint's reading was expired by the old one's trip")
	got, ok := b.Telemetry().Latest(x, clock.Now(), time.Minute)
	require.True(t, ok)
	assert.Equal(t, 3.0, got.Values[telemetry.Running])

	// The new endpoint's own failures still count.
	for range balancer.DefaultBreakerFailures {
		p := pickOn(t, b, x)
		p.Done(inferlb.Outcome{Err: errDown})
	}
	assert.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	assert.True(t, stat(t, b, x).BreakerOpen)
}
