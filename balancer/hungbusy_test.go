package balancer_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// mixedGenerations is a non-streamed generation of 30 s to 5 minutes:
// nothing comes back until it is done.
func mixedGenerations(r *rand.Rand) (time.Duration, time.Duration) {
	return 30*time.Second + time.Duration(r.Int64N(int64(270*time.Second))), 0
}

// stopAThirdLate is a user stopping about a third of the calls at 20-95%
// of their length: often after longer than the replica's recent answers
// took.
func stopAThirdLate(r *rand.Rand, _ string, length, _ time.Duration) time.Duration {
	if r.IntN(3) == 0 {
		return length * time.Duration(20+r.IntN(76)) / 100
	}
	return 0
}

// silentFrom is when TestBusyFleetsLateStopsOfLongGenerationsKeepTheirShare
// starts counting picks made while a replica is silent: past its first
// minutes, while a replica's few answers are the shortest of its first
// calls, and its later ones, as long as its answers have taken, run
// longer (with 1,000 keys two replicas were silent at 18 and 14 picks
// in the run's first five minutes; 159 and 92 picks in the whole
// run without and with keys as a run counted any call as long as its
// answers took).
var silentFrom = 10 * time.Minute

// A busy fleet of healthy replicas (a call every 0.5-1.5 s) serving mixed
// non-streamed generations of 30 s to 5 minutes, whose users stop a third
// of them at 20-95% of their length with nothing back: two such stops in
// a row after a replica's last answer, each longer than its answers'
// peak-EWMA, made a run. From the tenth minute of an hour to its end, the
// replicas were silent at 82 picks (23, 4, 31 and 24), 53 with 1,000
// session keys, and b:80 drew 880 calls in the hour where it drew 920
// with the stops not marked unanswered; with a:80 joining the fleet 20
// minutes in, 33 picks (a:80 at 17 of them) and 81 with keys (a:80 at
// 40). A replica that answered other calls while the stopped one was
// overdue is not hung: none is silent, and each draws what it drew
// without them (within a call or two with keys from the start: the
// first minutes' runs).
func TestBusyFleetsLateStopsOfLongGenerationsKeepTheirShare(t *testing.T) {
	t.Parallel()
	for _, join := range []time.Duration{0, 20 * time.Minute} {
		for _, keys := range []int{0, 1000} {
			var draws [2]map[string]int
			var silent [2]map[string]int
			for i, unanswered := range []bool{false, true} {
				silent[i] = map[string]int{}
				_, draws[i] = runHungLLM(t, hungRun{seconds: 3600, call: mixedGenerations, keys: keys, joinAt: join, silent: silent[i], count: silentFrom,
					every: func(r *rand.Rand) time.Duration {
						return 500*time.Millisecond + time.Duration(r.Int64N(int64(time.Second)))
					},
					cancel: func(r *rand.Rand, addr string, length, ttft time.Duration) (time.Duration, bool) {
						return stopAThirdLate(r, addr, length, ttft), unanswered
					}})
			}
			t.Logf("a:80 joins at %v, %d keys: answered %v, unanswered %v; picks while silent: %v", join, keys, draws[0], draws[1], silent[1])
			assert.Empty(t, silent[1], "a:80 joins at %v, %d keys: picks made while a healthy replica was silent", join, keys)
			for addr, n := range draws[0] {
				assert.InDelta(t, n, draws[1][addr], float64(n)/100, "a:80 joins at %v, %d keys: %s's draws with the stops unanswered, against answered", join, keys, addr)
			}
		}
	}
}

// overdueFleet is a Balancer over one replica on a fake clock whose
// generation answers take 10 s (one answered), with pick, which sends it a
// generation call, and run, its run of abandoned calls
// (EndpointStats.Abandoned).
func overdueFleet(t *testing.T) (clock *testutil.Clock, pick func() balancer.Pick, run func() int64) {
	t.Helper()
	clock = testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
	pick = func() balancer.Pick {
		t.Helper()
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		return p
	}
	run = func() int64 { return b.Stats()[0].Abandoned }
	first := pick()
	clock.Advance(10 * time.Second)
	first.Done(inferlb.Outcome{})
	return clock, pick, run
}

var stoppedUnanswered = inferlb.Outcome{Err: context.Canceled, Unanswered: true}

// A generation call its user stops with nothing back counts towards the
// replica's run of abandoned calls only when the replica answered no call
// once it was overdue (its wait past the time the replica's answers
// take): one that answered another meanwhile was working, and the
// stopped call was merely long. An answer before the call was overdue,
// or before its pick, clears nothing.
func TestAbandonedCallAnsweredPastIsNoRun(t *testing.T) {
	clock, pick, run := overdueFleet(t)
	advance := clock.Advance
	x1, x2 := pick(), pick() // at 10 s: overdue from 20 s
	advance(5 * time.Second)
	y := pick()
	advance(6 * time.Second)
	y.Done(inferlb.Outcome{}) // at 21 s, 11 s long: answers now take 11 s
	advance(10 * time.Second)
	x1.Done(stoppedUnanswered)
	x2.Done(stoppedUnanswered)
	assert.Zero(t, run(), "the replica answered a call while these were overdue")

	w1, w2 := pick(), pick() // at 31 s, after its last answer
	advance(11 * time.Second)
	w1.Done(stoppedUnanswered)
	w2.Done(stoppedUnanswered)
	assert.EqualValues(t, 2, run(), "nothing answered since their pick, and they waited as long as answers take")
}

// A stream's first token is an answer: a replica whose engine hangs
// sends none (its API server sends the stream's headers all the same).
// A stream its user stopped after its first token came while other calls
// were overdue clears them; one whose first token came before they were
// overdue does not.
func TestAbandonedCallPastAFirstTokenIsNoRun(t *testing.T) {
	clock, pick, run := overdueFleet(t)
	advance := clock.Advance
	x1, x2 := pick(), pick() // at 10 s: overdue from 20 s
	early := pick()
	advance(2 * time.Second)
	early.Done(inferlb.Outcome{Err: context.Canceled, TTFT: time.Second}) // its first token at 11 s
	advance(13 * time.Second)
	s := pick() // at 25 s
	advance(2 * time.Second)
	s.Done(inferlb.Outcome{Err: context.Canceled, TTFT: time.Second}) // its first token at 26 s, stopped at 27 s
	advance(10 * time.Second)
	x1.Done(stoppedUnanswered)
	x2.Done(stoppedUnanswered)
	assert.Zero(t, run(), "a stream's first token came while these were overdue")

	w1, w2 := pick(), pick() // at 37 s
	stream := pick()
	advance(time.Second)
	stream.Done(inferlb.Outcome{Err: context.Canceled, TTFT: time.Second}) // its first token at 38 s, before they are overdue (47 s)
	advance(10 * time.Second)
	w1.Done(stoppedUnanswered)
	w2.Done(stoppedUnanswered)
	assert.EqualValues(t, 2, run(), "a first token before they were overdue clears nothing")
}

// Times stamped before the clock stepped back are no answers: a replica
// whose stream's first token came an hour ahead of the stepped-back clock
// counts its calls abandoned since.
func TestAbandonedAfterAClockStepBackCounts(t *testing.T) {
	clock, pick, run := overdueFleet(t)
	s := pick()
	clock.Advance(2 * time.Second)
	s.Done(inferlb.Outcome{Err: context.Canceled, TTFT: time.Second})
	clock.Set(clock.Now().Add(-time.Hour))

	x1, x2 := pick(), pick()
	clock.Advance(11 * time.Second)
	x1.Done(stoppedUnanswered)
	x2.Done(stoppedUnanswered)
	assert.EqualValues(t, 2, run(), "the replica's answer and first token are an hour ahead of the clock")
}
