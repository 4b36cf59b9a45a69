package balancer

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

// With the default clock a call's latency is its real time out, measured
// by the monotonic clock too (config.waited), whether its pick and Done
// read the clock between two re-anchors (monoClock.read's cheap path) or
// its Done is the read that re-anchors. Kills monoClock.read returning the
// anchor's monotonic time for its own on the cheap path (every wait
// within a second of the anchor measured 0, an embedding answered in
// half a second read as instant), and returning 0 from a re-anchor (the
// Done's wait went negative, and the answer fed no latency).
func TestDefaultClockMeasuresACallsTimeOut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		before, out time.Duration // from the clock's anchor to the pick; pick to Done
	}{
		{"pick and Done between re-anchors", 200 * time.Millisecond, 500 * time.Millisecond},
		{"Done re-anchors the clock", 200 * time.Millisecond, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := New(Options{Rand: runtimeRand{}})
				defer b.Close()
				require.NotNil(t, b.cfg.mono, "the default clock")
				require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
				time.Sleep(tc.before)
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
				require.NoError(t, err)
				time.Sleep(tc.out)
				p.Done(inferlb.Outcome{})
				assert.Equal(t, tc.out, b.Stats()[0].Latency)
			})
		})
	}
}

// The default clock reads the wall clock again every second, at every
// second, not only the first time: a wall clock its anchor has drifted
// from (an NTP step of the host's clock) is caught up with within a
// second, each time. Kills the re-anchoring writer never releasing its
// flag (writing left set): after its first re-anchor the clock ran on the
// monotonic clock alone, and telemetry stamped by other processes with
// time.Now drifted from the balancer's readings for good.
func TestMonoClockReanchorsEverySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newMonoClock()
		for round := range 3 {
			time.Sleep(2 * time.Second)
			c.read()                                         // re-anchors
			c.slots[c.cur.Load()].wall.Add(int64(time.Hour)) // the host's wall clock stepped back an hour
			require.NotEqual(t, time.Now().UnixNano(), c.unixNano())
			time.Sleep(2 * time.Second)
			assert.Equal(t, time.Now().UnixNano(), c.unixNano(), "round %d: not back on the wall clock", round)
		}
	})
}
