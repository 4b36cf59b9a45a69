package balancer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// The default clock reads the wall clock again every second (monoClock),
// so a step of the host's wall clock reaches the balancer's readings: two
// generation calls given up on just after a step an hour forward counted
// as overdue on a replica whose answers take a minute (a run of 2, priced
// as hung). Measured with the monotonic clock too, their waits are the
// microseconds they were out. The step is made in the clock's anchor, as
// its next re-anchor would read it.
//
// The test runs in a synctest bubble, where the clock moves only when the
// test sleeps: on the real clock, a test descheduled for a second between
// New and the Dones (a loaded CI machine) had its first Done re-anchor the
// clock on the wall clock, which dropped the step, and the test passed
// with waits measured on Now alone (a sleep of 1.1 s put before the
// step showed it).
func TestForwardWallStepOfTheDefaultClockIsNoWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(Options{Rand: runtimeRand{}})
		defer b.Close()
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
		pick := func() Pick {
			t.Helper()
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
			require.NoError(t, err)
			return p
		}
		answer := pick()
		answer.Done(inferlb.Outcome{Latency: time.Minute}) // its answers take a minute

		calls := []Pick{pick(), pick()}
		c := b.cfg.mono
		c.slots[c.cur.Load()].wall.Add(int64(time.Hour))
		for _, p := range calls {
			p.Done(inferlb.Outcome{Err: context.Canceled, Unanswered: true})
		}
		s := b.Stats()[0]
		assert.EqualValues(t, 2, s.Unanswered)
		assert.Zero(t, s.Abandoned, "run of abandoned generation calls")
	})
}
