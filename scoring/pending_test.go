package scoring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
)

// Calls out with none finished for longer than the endpoint's latency
// price it at least at that wait, per call: its EWMA, fed by finished
// calls, does not move while its calls hang. A single call out is left to
// the EWMA: one slow call on an endpoint that serves others meanwhile is
// an outlier, not a stuck endpoint.
func TestLatencyPricesAWaitWithCallsOut(t *testing.T) {
	var l scoring.Latency
	now := testutil.Epoch
	st := scoring.State{Now: now, Weight: 1, LatencyEWMA: 200 * time.Millisecond, LastLatency: now.Add(-time.Second), LatencyDecay: 10 * time.Second, InFlight: 2}
	base := l.Cost(nil, st)
	st.Pending = 100 * time.Millisecond
	assert.Equal(t, base, l.Cost(nil, st), "a wait shorter than the latency says nothing")
	st.Pending = 5 * time.Second
	assert.InDelta(t, 5*3, l.Cost(nil, st), 1e-9, "5 s waited x 3")
	st.InFlight = 1
	assert.Less(t, l.Cost(nil, st), 1.0, "one call out: its wait is left to the EWMA")
}

// Generation calls given up on with nothing back, two or more in a row
// with no answer between (State.Abandoned), price an endpoint up by one
// for each while calls are out to it; one is a user's stop, and with
// nothing out the endpoint costs what it did, so a replica that recovered
// draws the call whose answer ends the run.
func TestLLMPricesARunOfAbandonedCalls(t *testing.T) {
	var l scoring.LLM
	st := scoring.State{Now: testutil.Epoch, Weight: 1, InFlight: 3}
	base := l.Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, st)
	st.Abandoned = 1
	assert.Equal(t, base, l.Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, st), "one abandoned call: a user's stop")
	st.Abandoned = 5
	assert.InDelta(t, base*6, l.Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, st), 1e-9, "five in a row")
	st.InFlight = 0
	idle := l.Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, st)
	st.Abandoned = 0
	assert.Equal(t, l.Cost(&inferlb.Request{Service: inferlb.ServiceLLM}, st), idle, "nothing out: priced as before")
}
