package balancer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Made-up model names are request data: an app's users can send any model
// string through it. Each such call goes round the fleet, as the HTTP
// adapter sends it on past every "model not found" answer (up to all the
// endpoints but one), and each answer is remembered.

// floodHops is how many endpoints without its model one call may meet
// over 16, as the HTTP adapter allows (notServedHops).
const floodHops = 15

// walk sends a call for model to the fleet as the HTTP adapter does:
// the first pick, then on each "not served" answer a retry (PickRetry
// made before the answer is reported), up to floodHops of them. served
// says which endpoints serve the model. It returns the endpoint the first
// pick chose, and whether the call was served in the end.
func walk(t *testing.T, b *balancer.Balancer, model string, served func(string) bool) (first string, ok bool) {
	t.Helper()
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: model}
	p, err := b.Pick(req)
	require.NoError(t, err)
	first = p.ID()
	for hops := 0; ; hops++ {
		if served(p.ID()) {
			p.Done(inferlb.Outcome{Latency: time.Millisecond, Model: model})
			return first, true
		}
		if hops == floodHops {
			p.Done(inferlb.Outcome{NotServedModel: model})
			return first, false
		}
		next, err := b.PickNotServedRetry(req, p.ID())
		p.Done(inferlb.Outcome{NotServedModel: model})
		if err != nil {
			require.True(t, errors.Is(err, balancer.ErrNoEndpoints) || errors.Is(err, balancer.ErrNoRetryBudget), "%v", err)
			return first, false
		}
		p = next
	}
}

// TestMadeUpModelsLeaveFailoverBudget: 1,000 calls for made-up models,
// one a millisecond, each going round 16 replicas on the retry budget,
// then a replica dies under 40 calls of a served model. The flood used to
// spend the whole budget (its bank, 20% of the calls, the floor: 1,309
// requests for the 1,000 calls), so none of the 40 could fail over for
// some 10 s; hops past "not served" answers now draw the budget only
// down to a reserve kept for failover.
func TestMadeUpModelsLeaveFailoverBudget(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 16, balancer.Options{Clock: clock, Rand: testutil.NewRand(22), OutlierInterval: -1})
	eps := endpoints(16)
	requests := 0
	for i := range 1000 {
		clock.Advance(time.Millisecond)
		before := b.RetryStats().Allowed
		walk(t, b, fmt.Sprintf("made-up-%d", i), func(string) bool { return false })
		requests += 1 + int(b.RetryStats().Allowed-before)
	}
	flood := b.RetryStats()
	t.Logf("flood: %d requests for 1000 calls; retries %+v", requests, flood)
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "base"}
	failedOver := 0
	for range 40 {
		p, err := b.PickRetry(req, eps[5].Addr)
		if err == nil {
			failedOver++
			p.Done(inferlb.Outcome{Latency: time.Millisecond, Model: "base"})
		} else {
			require.ErrorIs(t, err, balancer.ErrNoRetryBudget)
		}
	}
	t.Logf("failovers allowed right after the flood: %d of 40", failedOver)
	assert.Equal(t, 40, failedOver, "of 40 failovers right after the flood")
	assert.Less(t, requests, 1309, "the flood takes no more than it did")
}
