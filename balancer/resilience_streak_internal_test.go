package balancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// streakFleet is a Balancer of two endpoints, "a" and "b", that may hold
// one of them out (MaxEjectedFraction 0.5). With b tripped, a breaker of a
// that opens is capped, kept in rotation, until b recovers. Its report
// reaches the breaker's mutex for every outcome, excluded ones too: only a
// closed breaker's take the lock-free path.
type streakFleet struct {
	t      *testing.T
	b      *Balancer
	clock  *testutil.Clock
	events []Event
}

func newStreakFleet(t *testing.T) *streakFleet {
	f := &streakFleet{t: t, clock: testutil.NewClock()}
	f.b = New(Options{
		Clock: f.clock, Rand: testutil.NewRand(1), OutlierInterval: -1, PanicThreshold: -1,
		MaxEjectedFraction: 0.5,
		OnEvent:            func(ev Event) { f.events = append(f.events, ev) },
	})
	t.Cleanup(f.b.Close)
	require.NoError(t, f.b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}}))
	return f
}

// tripB trips b's breaker: no room for a's.
func (f *streakFleet) tripB() {
	f.t.Helper()
	for range DefaultBreakerFailures {
		f.call("b", inferlb.Outcome{Err: errFailed})
	}
	require.Equal(f.t, EventTripped, f.events[len(f.events)-1].Kind)
	f.events = nil
}

func (f *streakFleet) call(id string, o inferlb.Outcome) {
	f.t.Helper()
	serial, ok := f.b.Serial(id)
	require.True(f.t, ok)
	p, err := f.b.PickAt(&inferlb.Request{}, serial)
	require.NoError(f.t, err)
	require.Equal(f.t, id, p.ID())
	p.Done(o)
}

func (f *streakFleet) stats(id string) EndpointStats {
	f.t.Helper()
	for _, s := range f.b.Stats() {
		if s.ID == id {
			return s
		}
	}
	require.FailNow(f.t, "no stats", id)
	return EndpointStats{}
}

func (f *streakFleet) kinds() []EventKind {
	var k []EventKind
	for _, ev := range f.events {
		k = append(k, ev.Kind)
	}
	return k
}

// capA fails a's calls until its breaker opens, capped.
func (f *streakFleet) capA() {
	f.t.Helper()
	for range DefaultBreakerFailures {
		f.call("a", inferlb.Outcome{Err: errFailed})
	}
	require.Equal(f.t, []EventKind{EventCapped}, f.kinds())
}

// recoverB passes b's probes once its exclusion is over: room for a trip
// of a again.
func (f *streakFleet) recoverB() {
	f.t.Helper()
	f.clock.Advance(DefaultEjectionTime)
	for range DefaultBreakerProbes {
		f.call("b", inferlb.Outcome{})
	}
	require.Equal(f.t, EventRecovered, f.events[len(f.events)-1].Kind)
}

// trip fails a's next call, which trips its breaker now that there is
// room, and returns the trip's event.
func (f *streakFleet) trip() Event {
	f.t.Helper()
	n := len(f.events)
	f.call("a", inferlb.Outcome{Err: errFailed})
	require.Len(f.t, f.events, n+1)
	ev := f.events[n]
	require.Equal(f.t, EventTripped, ev.Kind)
	require.Equal(f.t, "a", ev.Endpoint)
	return ev
}

// Excluded outcomes say nothing about health, also while a's breaker is
// capped and its reports take the mutex: a cancelled call (an overloaded
// answer, a client error) in a run of failures does not end the run, and
// the trip that ends it, once there is room, tells the detection time
// from the run's first failure. Noted as a success, the cancellation started
// the run over at the next failure, and the trip told 10s for a run 12s
// long.
func TestExcludedOutcomesDoNotEndTheStreakOfACappedBreaker(t *testing.T) {
	for _, excluded := range []inferlb.Outcome{{Err: context.Canceled}, {Overloaded: true}, {ClientError: true}} {
		f := newStreakFleet(t)
		f.tripB()
		f.capA() // the run begins: failures at 0s
		f.clock.Advance(time.Second)
		f.call("a", excluded)
		f.clock.Advance(time.Second)
		f.call("a", inferlb.Outcome{Err: errFailed}) // capped again at 2s
		f.recoverB()                                 // 12s
		ev := f.trip()
		assert.Equal(t, 12*time.Second, ev.Detection, "%+v in the run", excluded)
		assert.Equal(t, 12*time.Second, f.stats("a").LastDetection)
	}
}

// Nor do they begin a run: a's capped breaker, half-open after a success
// (the run ended), sees a cancelled call at 2s and its next failure at
// 5s; the run that trips it, at 17s, began at 5s. Noted as a failure, the
// cancellation began it, and the trip told 15s.
func TestExcludedOutcomesDoNotBeginAStreakOfACappedBreaker(t *testing.T) {
	for _, excluded := range []inferlb.Outcome{{Err: context.Canceled}, {Overloaded: true}, {ClientError: true}} {
		f := newStreakFleet(t)
		f.tripB()
		f.capA()
		f.clock.Advance(time.Second)
		f.call("a", inferlb.Outcome{}) // ends the run; one success of the probes' three
		f.clock.Advance(time.Second)
		f.call("a", excluded)
		f.clock.Advance(3 * time.Second)
		f.call("a", inferlb.Outcome{Err: errFailed}) // capped again at 5s: the run begins
		f.clock.Advance(2 * time.Second)
		f.recoverB() // 17s
		ev := f.trip()
		assert.Equal(t, 12*time.Second, ev.Detection, "%+v before the run", excluded)
	}
}

// A capped breaker that is half-open (a success ended the run of
// failures) trips on one failure once there is room: a run that began
// with the failure that ends it, detected at once. EndpointStats says so
// (LastDetection 0), not the detection time of a's trip before. The
// streak is noted before the breaker hears of the failure: noted after,
// the trip found no run and left LastDetection at 4s.
func TestATripOnTheFirstFailureOfItsRunIsDetectedAtOnce(t *testing.T) {
	f := newStreakFleet(t)
	for range DefaultBreakerFailures { // a trips at 4s, 4s after its run began
		f.call("a", inferlb.Outcome{Err: errFailed})
		f.clock.Advance(time.Second)
	}
	require.Equal(t, 4*time.Second, f.events[0].Detection)
	require.Equal(t, 4*time.Second, f.stats("a").LastDetection)
	f.clock.Advance(DefaultEjectionTime)
	for range DefaultBreakerProbes {
		f.call("a", inferlb.Outcome{})
	}
	require.Equal(t, EventRecovered, f.events[len(f.events)-1].Kind)

	f.tripB()
	f.capA()
	f.call("a", inferlb.Outcome{}) // ends the run; one success of the probes' three
	f.recoverB()
	ev := f.trip()
	assert.Zero(t, ev.Detection)
	assert.Zero(t, f.stats("a").LastDetection)
}

// A probe's failure that meets a new breaker generation once it holds the
// breaker's mutex (its peers passed meanwhile: a recovered) is a
// straggler, and ignored: it begins no run of failures either. Noted
// before the generation check, it began one that the closed breaker did
// not count, and the trip of a's next run, 4s long, told 7s.
func TestAStragglerBeginsNoStreak(t *testing.T) {
	f := newStreakFleet(t)
	for range DefaultBreakerFailures {
		f.call("a", inferlb.Outcome{Err: errFailed})
	}
	require.Equal(t, []EventKind{EventTripped}, f.kinds())
	serial, ok := f.b.Serial("a")
	require.True(t, ok)
	pick := func() *Pick {
		p, err := f.b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		require.Equal(t, "a", p.ID())
		return &p
	}
	f.clock.Advance(DefaultEjectionTime)
	var probes []*Pick
	for range DefaultBreakerProbes {
		probes = append(probes, pick())
	}
	f.clock.Advance(DefaultEjectionTime) // the probes are overdue: one more
	straggler := pick()
	passed := false
	f.b.beforeBrMu = func() {
		if !passed {
			passed = true
			for _, p := range probes {
				p.Done(inferlb.Outcome{})
			}
		}
	}
	straggler.Done(inferlb.Outcome{Err: errFailed})
	f.b.beforeBrMu = nil
	require.Equal(t, []EventKind{EventTripped, EventRecovered}, f.kinds(), "the straggler is ignored")

	f.clock.Advance(3 * time.Second)
	for i := range DefaultBreakerFailures {
		if i > 0 {
			f.clock.Advance(time.Second)
		}
		f.call("a", inferlb.Outcome{Err: errFailed})
	}
	require.Equal(t, []EventKind{EventTripped, EventRecovered, EventTripped}, f.kinds())
	assert.Equal(t, 4*time.Second, f.events[2].Detection)
}
