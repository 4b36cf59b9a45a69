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

// Tests written for the third mutation sample: each kills a mutant of the
// hung-replica rule (noteAbandoned, answeredSince, noteFirstToken,
// peerAnswerTime) that the earlier tests let through, and pins the
// behaviour the mutant broke.

// atPicker is a Balancer or a Membership: both pick an endpoint by serial.
type atPicker interface {
	PickAt(req *inferlb.Request, serial uint64) (balancer.Pick, error)
}

// hungRig is a Balancer over eps on a fake clock whose calls are held
// open until the test reports them.
type hungRig struct {
	t     *testing.T
	clock *testutil.Clock
	b     *balancer.Balancer
}

func newHungRig(t *testing.T, eps ...inferlb.Endpoint) *hungRig {
	t.Helper()
	r := &hungRig{t: t, clock: testutil.NewClock()}
	r.b = balancer.New(balancer.Options{Clock: r.clock, Rand: testutil.NewRand(1)})
	t.Cleanup(r.b.Close)
	require.NoError(t, r.b.Update(eps))
	return r
}

// gen starts a generation call on the endpoint of serial (dense, in order
// of first appearance) through m.
func (r *hungRig) gen(m atPicker, serial uint64) balancer.Pick {
	r.t.Helper()
	p, err := m.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
	require.NoError(r.t, err)
	require.Equal(r.t, serial, p.Serial())
	return p
}

// answered sends a generation call to serial that is answered after d.
func (r *hungRig) answered(m atPicker, serial uint64, d time.Duration) {
	r.t.Helper()
	p := r.gen(m, serial)
	r.clock.Advance(d)
	p.Done(inferlb.Outcome{})
}

func (r *hungRig) abandoned(id string) int64 {
	r.t.Helper()
	for _, s := range r.b.Stats() {
		if s.ID == id {
			return s.Abandoned
		}
	}
	r.t.Fatalf("no stats for %s", id)
	return 0
}

var (
	unanswered = inferlb.Outcome{Err: context.Canceled, Unanswered: true}
	// stoppedAfter is a stream its caller stopped after its first token,
	// ttft after its pick.
	stoppedAfter = func(ttft time.Duration) inferlb.Outcome {
		return inferlb.Outcome{Err: context.Canceled, TTFT: ttft}
	}
)

// An answer whose Done read the clock a moment ahead of the Done of a call
// given up on (goroutines racing, or a clock stepped back by less than
// the step tolerance, a second) is an answer all the same: the replica
// answered after the abandoned call was overdue, and that call is no sign
// of a hang. Kills answeredSince's tolerance dropped (ahead := nowNs): the
// replica then counted a run while it answered.
func TestAnswerStampedJustAheadStillEndsTheOverdueCount(t *testing.T) {
	r := newHungRig(t, inferlb.Endpoint{Addr: "a:80"})
	r.answered(r.b, 1, 10*time.Second) // its answers take 10 s
	t1 := r.clock.Now()
	x := r.gen(r.b, 1) // overdue at about t1+10s
	r.clock.Advance(9500 * time.Millisecond)
	r.answered(r.b, 1, time.Second) // answered at t1+10.5s, after x was overdue
	r.clock.Set(t1.Add(10 * time.Second))
	x.Done(unanswered) // a Done reading half a second behind the answer's
	assert.Zero(t, r.abandoned("a:80"), "the replica answered after the call was overdue")
}

// A time to first token past any plausible one (a bad report, beyond
// maxObserved) is ignored: it does not replace the first token the
// replica really sent, which still answers for the calls overdue before
// it. Kills noteFirstToken's bound dropped: the absurd time, far ahead of
// the clock, then stood in for the real one and answered nothing, and a
// call given up on while the replica was streaming counted towards a run.
func TestAbsurdTimeToFirstTokenKeepsTheRealOne(t *testing.T) {
	r := newHungRig(t, inferlb.Endpoint{Addr: "a:80"})
	r.answered(r.b, 1, 10*time.Second)
	x := r.gen(r.b, 1) // overdue 10 s on
	r.clock.Advance(5 * time.Second)
	s := r.gen(r.b, 1)
	r.clock.Advance(15 * time.Second)
	s.Done(stoppedAfter(6 * time.Second)) // its first token came 11 s after x's pick
	bad := r.gen(r.b, 1)
	bad.Done(stoppedAfter(time.Duration(1) << 51)) // 26 days: a bad report
	x.Done(unanswered)
	assert.Zero(t, r.abandoned("a:80"), "a first token came after the call was overdue")
}

// A first token stamped before the clock stepped back (an hour ahead of
// the readings since) gives way to a later real one: the replica's
// answers after the step still answer for its overdue calls. Kills
// noteFirstToken's keeping the latest time however far ahead (cur >= at
// alone): the stale stamp then hid every real first token until the clock
// caught up, and calls given up on while the replica streamed counted.
func TestFirstTokenAfterAClockStepBackReplacesTheStaleOne(t *testing.T) {
	r := newHungRig(t, inferlb.Endpoint{Addr: "a:80"})
	r.answered(r.b, 1, 10*time.Second)
	before := r.clock.Now()
	r.clock.Advance(time.Hour)
	s1 := r.gen(r.b, 1)
	r.clock.Advance(2 * time.Second)
	s1.Done(stoppedAfter(time.Second))        // a first token an hour ahead of what follows
	r.clock.Set(before.Add(20 * time.Second)) // the clock steps back an hour
	x := r.gen(r.b, 1)
	r.clock.Advance(5 * time.Second)
	s2 := r.gen(r.b, 1)
	r.clock.Advance(10 * time.Second)
	s2.Done(stoppedAfter(6 * time.Second)) // first token 11 s after x's pick
	x.Done(unanswered)
	assert.Zero(t, r.abandoned("a:80"), "a first token came after the call was overdue")
}

// A stream stopped after its first token answered at that token, not at
// its stop: an engine that sent a first token and then hung answered
// nothing after it, and a call overdue after that token counts towards a
// run. Kills noteFirstToken stamping the stop (at := nowNs): the hung
// replica's stopped stream then read as an answer after every call
// overdue before the stop, and the hang went uncounted.
func TestFirstTokenAnswersAtItsTimeNotAtTheStop(t *testing.T) {
	r := newHungRig(t, inferlb.Endpoint{Addr: "a:80"})
	r.answered(r.b, 1, 10*time.Second)
	x := r.gen(r.b, 1) // overdue 10 s on
	s := r.gen(r.b, 1)
	r.clock.Advance(30 * time.Second)
	s.Done(stoppedAfter(time.Second)) // its token 1 s on; nothing since
	x.Done(unanswered)
	assert.EqualValues(t, 1, r.abandoned("a:80"), "nothing came back after the call was overdue")
}

// A replica listed by two memberships takes its peers' answer time from
// any of its pools with enough answering peers (minAnswerPeers), whatever
// the order of the memberships: one pool with none does not hide the
// other's. Kills peerAnswerTime reading only the last pool's count
// (enough = n >= minAnswerPeers): a replica hung from the start, listed by
// a second membership whose other member had not answered yet, then
// counted no call.
func TestPeerAnswerTimeFromAnyOfTheReplicasPools(t *testing.T) {
	for _, tc := range []struct {
		name        string
		first, more []inferlb.Endpoint // the default membership's and another's
		answering   func(r *hungRig, m *balancer.Membership) atPicker
		serial      map[string]uint64 // dense, in order of first appearance
	}{
		{
			name:      "answering peers in the first membership",
			first:     []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "b:80"}, {Addr: "c:80"}},
			more:      []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "d:80"}},
			answering: func(r *hungRig, _ *balancer.Membership) atPicker { return r.b },
			serial:    map[string]uint64{"a:80": 1, "b:80": 2, "c:80": 3},
		},
		{
			name:      "answering peers in the second membership",
			first:     []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "d:80"}},
			more:      []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "b:80"}, {Addr: "c:80"}},
			answering: func(_ *hungRig, m *balancer.Membership) atPicker { return m },
			serial:    map[string]uint64{"a:80": 1, "b:80": 3, "c:80": 4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newHungRig(t, tc.first...)
			m, err := r.b.NewMembership()
			require.NoError(t, err)
			t.Cleanup(m.Close)
			require.NoError(t, m.Update(tc.more))
			serial := func(addr string) uint64 { return tc.serial[addr] }
			peers := tc.answering(r, m)
			r.answered(peers, serial("b:80"), 4*time.Second)
			r.answered(peers, serial("c:80"), 4*time.Second)
			x := r.gen(r.b, serial("a:80"))
			r.clock.Advance(5 * time.Second)
			x.Done(unanswered)
			assert.EqualValues(t, 1, r.abandoned("a:80"), "it waited longer than its peers' answers take")
		})
	}
}

// A call routed to a known endpoint (PickAt, as the adapters' retries and
// resumed sessions route) measures its wait as a pick does: across a
// forward step of the wall clock, by the monotonic clock too, so the step
// is no wait. Kills PickAt leaving the pick's monotonic reading unset: the
// wait then read as all the monotonic time since the clock's start (1.3 s
// here, longer than the replica's answers), two generation calls stopped
// 100 ms after the pick made a run, and an embedding's raised its
// endpoint's latency.
func TestForwardClockStepIsNoWaitForAPickAt(t *testing.T) {
	clock := testutil.NewMonoClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
	pick := func(svc inferlb.Service) balancer.Pick {
		t.Helper()
		p, err := b.PickAt(&inferlb.Request{Service: svc}, 1)
		require.NoError(t, err)
		require.Equal(t, "a:80", p.ID())
		return p
	}
	gen := pick(inferlb.ServiceLLM)
	clock.Advance(time.Second)
	gen.Done(inferlb.Outcome{}) // a generation takes a second
	emb := pick(inferlb.ServiceEmbedding)
	clock.Advance(200 * time.Millisecond)
	emb.Done(inferlb.Outcome{}) // an embedding 200 ms

	calls := []balancer.Pick{pick(inferlb.ServiceLLM), pick(inferlb.ServiceLLM), pick(inferlb.ServiceEmbedding)}
	clock.Advance(100 * time.Millisecond)
	clock.Step(time.Hour)
	for _, p := range calls {
		p.Done(unanswered)
	}
	s := b.Stats()[0]
	assert.EqualValues(t, 3, s.Unanswered)
	assert.Zero(t, s.Abandoned, "run of abandoned generation calls")
	assert.Equal(t, 200*time.Millisecond, s.ServiceLatency[inferlb.ServiceEmbedding], "embedding latency")
}

// Only an answer after a call became overdue clears it: a call picked
// with it and answered in the replica's usual time, at the very instant
// the other became overdue, says nothing of the time after, in which the
// replica answered nothing. Kills answeredSince taking an answer at ns
// (at >= ns) for one after it.
func TestAnswerAtTheOverdueInstantIsNotAfterIt(t *testing.T) {
	r := newHungRig(t, inferlb.Endpoint{Addr: "a:80"})
	r.answered(r.b, 1, 10*time.Second) // its answers take 10 s
	x, y := r.gen(r.b, 1), r.gen(r.b, 1)
	r.clock.Advance(10 * time.Second)
	y.Done(inferlb.Outcome{}) // 10 s: x is overdue now
	r.clock.Advance(10 * time.Second)
	x.Done(unanswered)
	assert.EqualValues(t, 1, r.abandoned("a:80"), "nothing came back after the call was overdue")
}
