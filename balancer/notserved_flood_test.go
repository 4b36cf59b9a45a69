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

// TestMadeUpModelsKeepRealAdapterMemory: 16 replicas, a LoRA adapter on
// two of them. Once its calls have learned where it is, 100 calls a
// second for made-up models (each a name of its own, none served) run
// beside 100 a second for the adapter, for 10 s. The made-up names'
// answers fill the not-served memory (16 pairs and a model entry a name);
// they evicted the adapter's entries, which lapse first, so its calls
// went to replicas without it again, each an extra hop: 52 of 1,000 (143
// in the review's setup). Entries of a model an endpoint served are now
// kept ahead of those of models none served: none.
func TestMadeUpModelsKeepRealAdapterMemory(t *testing.T) {
	clock := testutil.NewClock()
	// RetryFloor: the budget allows every hop, as a client's own traffic
	// earns it when it is large beside the flood's.
	b := newBalancer(t, 16, balancer.Options{Clock: clock, Rand: testutil.NewRand(21), OutlierInterval: -1, RetryFloor: 1e5})
	eps := endpoints(16)
	adapter := func(id string) bool { return id == eps[3].Addr || id == eps[11].Addr }
	none := func(string) bool { return false }
	for range 50 { // learn the adapter's replicas
		walk(t, b, "adapter", adapter)
		clock.Advance(10 * time.Millisecond)
	}
	misrouted := 0
	for i := range 1000 {
		walk(t, b, fmt.Sprintf("made-up-%d", i), none)
		first, ok := walk(t, b, "adapter", adapter)
		require.True(t, ok)
		if !adapter(first) {
			misrouted++
		}
		clock.Advance(10 * time.Millisecond)
	}
	t.Logf("adapter calls first sent to a replica without it: %d of 1000", misrouted)
	assert.Zero(t, misrouted, "of 1,000 adapter calls beside the flood")
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
