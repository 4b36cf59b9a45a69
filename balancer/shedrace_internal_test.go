package balancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A call the endpoint served, sent after its cooldown, ends its row of
// overload answers and the probation after it (shedServed). When that
// call's Done ran while a refusal's Done was between counting the refusal
// as the row's second and setting the probation, it ended the row and
// found no probation yet; the probation was then set, with no row on, and
// no served call ended it (a served call's Done looks at the endpoint only
// while it is in a row): the endpoint stayed second choice for the whole
// probation (here 2s) though it had served a call after the refusal. The
// two Dones are run in that order through the hook shedCounted, with no
// goroutine.
func TestServedDoneDuringRefusalEndsItsProbation(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), OutlierInterval: -1})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}))
	b.mu.Lock()
	e := b.eps["a"]
	b.mu.Unlock()
	pick := func() *Pick {
		t.Helper()
		p, err := b.PickAt(&inferlb.Request{}, e.serial)
		require.NoError(t, err)
		require.Equal(t, "a", p.ID())
		return &p
	}
	overloaded := inferlb.Outcome{Overloaded: true, RetryAfter: time.Second}

	pick().Done(overloaded) // the row's first: a cooldown, no probation
	require.EqualValues(t, 1, e.shedStreak.Load())
	clock.Advance(time.Second) // back in full standing

	served, refused := pick(), pick() // both sent after the cooldown
	clock.Advance(5 * time.Millisecond)
	b.shedCounted = func() {
		b.shedCounted = nil
		served.Done(inferlb.Outcome{}) // ends the row just counted
	}
	refused.Done(overloaded) // the row's second
	require.Nil(t, b.shedCounted, "the hook ran")

	s := b.Stats()[0]
	require.Equal(t, "a", s.ID)
	assert.Zero(t, s.OverloadStreak, "the served call ended the row")
	assert.True(t, s.ProbationUntil.IsZero(), "on probation until %v after serving a call sent after its cooldown", s.ProbationUntil)
	assert.Zero(t, b.shedRows.Load())

	// Back in full once its cooldown ends: a pick of the two finds it in
	// good standing, not second choice.
	clock.Advance(time.Second)
	assert.False(t, onProbation(e, clock.Now().UnixNano()))
}
