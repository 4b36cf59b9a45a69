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

// TestTripDuringACooldownReportsWhenTheEndpointReturns: an Event's Until
// is when the endpoint may be tried again. A breaker that trips (on the
// failures of calls still out) while a longer overload cooldown is in
// force keeps the endpoint out until the cooldown ends, as Stats says; the
// event said it would be back when its own exclusion ended, 20 s early.
func TestTripDuringACooldownReportsWhenTheEndpointReturns(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := resilient(t, clock, rec, 4)
	x := endpoints(4)[0].Addr
	var out []balancer.Pick
	for range balancer.DefaultBreakerFailures + 1 {
		out = append(out, pickOn(t, b, x))
	}
	out[0].Done(inferlb.Outcome{Overloaded: true, RetryAfter: 30 * time.Second})
	for _, p := range out[1:] {
		p.Done(inferlb.Outcome{Err: errDown})
	}
	require.Equal(t, []balancer.EventKind{balancer.EventCooldown, balancer.EventTripped}, rec.kinds())
	back := stat(t, b, x).ExcludedUntil
	assert.WithinDuration(t, clock.Now().Add(30*time.Second), back, 0)
	assert.WithinDuration(t, back, rec.last().Until, 0, "the trip's Until")
}
