package balancer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/scoring"
)

// A replica in a run of abandoned generation calls is silent as soon as
// one call is out to it (endpoint.silent): a hung engine behind a live
// API server holds that call with nothing back, and its keys' next calls
// go to the next members of their order. Kills silent asking for more
// than one call out: with one hung call out, the owner kept its keys'
// calls, each to hang until its caller gave up.
func TestSilentWithOneCallOut(t *testing.T) {
	r := newStayRig(t, 4, Options{})
	owner := r.g.members[r.order[0]]
	owner.abandoned.Store(scoring.MinAbandoned)
	r.b.markUnanswering(owner, true)
	require.False(t, owner.silent(), "nothing out to it yet")
	// Its keys' next call takes it: one hung call out. Its peers carry 3
	// each, so with one call out it is well within its bound.
	r.hold(t, map[int]int{0: 1, 1: 3, 2: 3, 3: 3})
	t.Cleanup(r.release)
	r.clock.Advance(time.Second)
	p, err := r.b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey})
	require.NoError(t, err)
	defer p.Done(inferlb.Outcome{})
	assert.NotEqual(t, owner.id, p.ID(), "the silent owner took its key's call")
}
