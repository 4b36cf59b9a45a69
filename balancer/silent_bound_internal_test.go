package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// Balancer.unanswering sends the affinity bound to the group's fleet view
// while some endpoint is in a run of abandoned calls (fleetView.silent).
// It counts an endpoint once, from the call that makes its run
// scoring.MinAbandoned long, until an answer ends the run or the endpoint
// leaves every membership: left counted, every pick reads the fleet view
// for nothing; not counted, a run's member stayed in the bound's weight.
func TestUnansweringCountsRuns(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	eps := []inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}
	require.NoError(t, b.Update(eps))
	e := b.eps["a"]
	llm := &inferlb.Request{Service: inferlb.ServiceLLM}
	pick := func() Pick {
		p, err := b.PickAt(llm, e.serial)
		require.NoError(t, err)
		return p
	}
	p := pick()
	clock.Advance(time.Second)
	p.Done(inferlb.Outcome{}) // it answers in a second
	// A run: its callers give up on calls after twice as long, with
	// nothing back.
	abandon := func(n int) {
		ps := make([]Pick, n)
		for i := range ps {
			ps[i] = pick()
		}
		clock.Advance(2 * time.Second)
		for i := range ps {
			ps[i].Done(inferlb.Outcome{Err: context.Canceled, Unanswered: true})
		}
	}
	abandon(scoring.MinAbandoned - 1)
	assert.Zero(t, b.unanswering.Load(), "a run shorter than MinAbandoned")
	abandon(3)
	assert.EqualValues(t, 1, b.unanswering.Load(), "a run of MinAbandoned or more, counted once")
	assert.True(t, e.unanswering())
	p = pick()
	p.Done(inferlb.Outcome{})
	assert.Zero(t, b.unanswering.Load(), "an answer ends the run")
	abandon(scoring.MinAbandoned)
	assert.EqualValues(t, 1, b.unanswering.Load())
	held := pick()
	require.NoError(t, b.Update(eps[1:]))
	assert.Zero(t, b.unanswering.Load(), "an endpoint no membership lists")
	clock.Advance(2 * time.Second)
	held.Done(inferlb.Outcome{Err: context.Canceled, Unanswered: true})
	assert.Zero(t, b.unanswering.Load(), "a departed endpoint's call abandoned after it left")
}
