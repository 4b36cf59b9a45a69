package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// peerFleet is a Balancer over eps on a fake clock, with callAt, which
// sends a call of svc to the endpoint listed at index i of eps, lets d pass
// and reports o, and abandoned, the run of abandoned calls (EndpointStats.
// Abandoned) of the endpoint at index i.
func peerFleet(t *testing.T, eps []inferlb.Endpoint) (callAt func(i int, svc inferlb.Service, d time.Duration, o inferlb.Outcome), abandoned func(i int) int64) {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update(eps))
	callAt = func(i int, svc inferlb.Service, d time.Duration, o inferlb.Outcome) {
		t.Helper()
		// Serials are dense, in order of first appearance: eps[i]'s is i+1.
		p, err := b.PickAt(&inferlb.Request{Service: svc}, uint64(i+1))
		require.NoError(t, err)
		require.Equal(t, eps[i].Key(), p.ID())
		clock.Advance(d)
		p.Done(o)
	}
	abandoned = func(i int) int64 {
		t.Helper()
		for _, s := range b.Stats() {
			if s.ID == eps[i].Key() {
				return s.Abandoned
			}
		}
		t.Fatalf("no stats for %s", eps[i].Key())
		return 0
	}
	return callAt, abandoned
}

var (
	peerAnswered  = inferlb.Outcome{}
	peerAbandoned = inferlb.Outcome{Err: context.Canceled, Unanswered: true}
)

// Before a replica has answered a generation call, a call of it given up
// on with nothing back counts towards its run of abandoned calls when its
// caller waited at least as long as its peers' generation answers take:
// the longest of their peak-EWMAs, once two peers have one. One peer's
// answers are too few to stand for the fleet's; another service's answers
// are no generation's; the replica's own first answer ends the run, and
// its own EWMA is the measure from then on.
func TestAbandonedBeforeFirstAnswerTakesPeersAnswerTime(t *testing.T) {
	callAt, run := peerFleet(t, []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "b:80"}, {Addr: "c:80"}, {Addr: "d:80"}})
	const llm = inferlb.ServiceLLM

	callAt(0, llm, time.Minute, peerAbandoned)
	assert.Zero(t, run(0), "no peer has answered: nothing says how long answers take")

	callAt(1, llm, 2*time.Second, peerAnswered)
	callAt(0, llm, time.Minute, peerAbandoned)
	assert.Zero(t, run(0), "one peer's answers are too few")

	callAt(2, llm, 4*time.Second, peerAnswered)
	callAt(0, llm, 3*time.Second, peerAbandoned)
	assert.Zero(t, run(0), "a wait shorter than the longest peer's answers says nothing")
	callAt(0, llm, 4*time.Second, peerAbandoned)
	assert.EqualValues(t, 1, run(0), "a wait as long as every peer's answers counts")

	callAt(3, inferlb.ServiceEmbedding, time.Minute, peerAnswered)
	callAt(0, llm, 5*time.Second, peerAbandoned)
	assert.EqualValues(t, 2, run(0), "an embedding's latency is no generation's")

	callAt(0, llm, time.Second, peerAnswered)
	assert.Zero(t, run(0), "its answer ends the run")
	callAt(0, llm, 2*time.Second, peerAbandoned)
	assert.EqualValues(t, 1, run(0), "its own answer is the measure now, shorter than its peers'")
}

// Peers count only in the replica's pools: the endpoints serving its
// models. A small model's replicas answering in a second say nothing of
// how long a large model's generations take.
func TestAbandonedBeforeFirstAnswerTakesItsModelsPeers(t *testing.T) {
	model := func(addr, m string) inferlb.Endpoint {
		return inferlb.Endpoint{Addr: addr, Labels: map[string]string{"model": m}}
	}
	callAt, run := peerFleet(t, []inferlb.Endpoint{
		model("a:80", "big"), model("b:80", "small"), model("c:80", "small"), model("d:80", "big"), model("e:80", "big"),
	})
	const llm = inferlb.ServiceLLM

	callAt(1, llm, time.Second, peerAnswered)
	callAt(2, llm, time.Second, peerAnswered)
	callAt(0, llm, 10*time.Second, peerAbandoned)
	assert.Zero(t, run(0), "the small model's answers are no measure of the big one's")

	callAt(3, llm, 20*time.Second, peerAnswered)
	callAt(4, llm, 30*time.Second, peerAnswered)
	callAt(0, llm, 25*time.Second, peerAbandoned)
	assert.Zero(t, run(0), "shorter than the longest of its model's peers")
	callAt(0, llm, 30*time.Second, peerAbandoned)
	assert.EqualValues(t, 1, run(0))
}
