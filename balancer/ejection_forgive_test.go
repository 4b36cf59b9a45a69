package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// ejectionRun drives outlier detection over four endpoints, one of them
// (bad) the only one that ever fails, with every evaluation at the end of
// an OutlierInterval (the defaults: 10 s, 20 calls to be judged).
type ejectionRun struct {
	t     *testing.T
	b     *balancer.Balancer
	clock *testutil.Clock
	rec   *recorder
	ids   []string // ids[0] is bad
}

func newEjectionRun(t *testing.T) *ejectionRun {
	t.Helper()
	r := &ejectionRun{t: t, clock: testutil.NewClock(), rec: &recorder{}}
	r.b = newBalancer(t, 4, balancer.Options{
		Clock: r.clock, Rand: testutil.NewRand(3), OnEvent: r.rec.record, Scorers: constantScorers(),
		BreakerFailures: -1, PanicThreshold: -1,
	})
	for _, ep := range endpoints(4) {
		r.ids = append(r.ids, ep.Addr)
	}
	r.call(r.ids[1], false) // the first evaluation: the next is an interval on
	return r
}

func (r *ejectionRun) call(id string, failed bool) {
	r.t.Helper()
	serial, ok := r.b.Serial(id)
	require.True(r.t, ok)
	p, err := r.b.PickAt(&inferlb.Request{}, serial)
	require.NoError(r.t, err)
	require.Equal(r.t, id, p.ID(), "not held out")
	var o inferlb.Outcome
	if failed {
		o.Err = errDown
	}
	p.Done(o)
}

// interval runs one OutlierInterval of traffic, 20 calls to each healthy
// endpoint and badCalls to bad (every other one failing when failing),
// and ends with the call that has it judged.
func (r *ejectionRun) interval(badCalls int, failing bool) {
	r.t.Helper()
	const rounds = 20
	for i := range rounds {
		for _, id := range r.ids[1:] {
			r.call(id, false)
		}
		if i < badCalls {
			r.call(r.ids[0], failing && i%2 == 0)
		}
		r.clock.Advance(balancer.DefaultOutlierInterval / rounds)
	}
	r.call(r.ids[1], false)
}

// quiet runs d (a multiple of OutlierInterval) of light traffic: one call
// to each endpoint per interval, too few for anyone to be judged.
func (r *ejectionRun) quiet(d time.Duration) {
	r.t.Helper()
	for range d / balancer.DefaultOutlierInterval {
		r.clock.Advance(balancer.DefaultOutlierInterval)
		for _, id := range r.ids {
			r.call(id, false)
		}
	}
}

// ejected runs an interval in which bad fails every other call and
// returns how long the ejection that ends it holds bad out; then it runs
// healthy intervals (bad out) until bad is back.
func (r *ejectionRun) ejected() time.Duration {
	r.t.Helper()
	n := countKind(r.rec, balancer.EventEjected)
	r.interval(20, true)
	require.Equal(r.t, n+1, countKind(r.rec, balancer.EventEjected), "bad is ejected: %v", r.rec.kinds())
	ev := r.rec.last()
	require.Equal(r.t, r.ids[0], ev.Endpoint)
	held := ev.Until.Sub(ev.At)
	for r.clock.Now().Before(ev.Until) {
		r.interval(0, false)
	}
	return held
}

// TestOutlierEjectionIsForgivenInGoodStanding: an endpoint's consecutive
// ejections started over only when an evaluation judged it healthy, and
// one with too few calls per interval (OutlierMinRequests) is never
// judged. Ejected once, then given light traffic for a day, its next
// ejection held it out twice as long (then four times...) as if it had
// just flapped.
func TestOutlierEjectionIsForgivenInGoodStanding(t *testing.T) {
	r := newEjectionRun(t)
	require.Equal(t, balancer.DefaultEjectionTime, r.ejected())
	r.quiet(24 * time.Hour)
	assert.Equal(t, balancer.DefaultEjectionTime, r.ejected(), "a day in good standing since: it starts over")
}

// TestFlappingOutlierEjectionStillDoubles: an endpoint that fails again
// within an interval or two of returning (one interval of light traffic,
// not judged, then failing) is held out twice as long each time, up to
// MaxEjectionTime; the doublings past the cap lengthen nothing, so good
// standing forgives from the cap: five ejections' spans at the cap (10
// minutes) bring it back to EjectionTime, however long it flapped.
func TestFlappingOutlierEjectionStillDoubles(t *testing.T) {
	r := newEjectionRun(t)
	var got []time.Duration
	for range 8 {
		got = append(got, r.ejected())
		r.quiet(balancer.DefaultOutlierInterval)
	}
	s := time.Second
	assert.Equal(t, []time.Duration{10 * s, 20 * s, 40 * s, 80 * s, 120 * s, 120 * s, 120 * s, 120 * s}, got)

	r.quiet(2*balancer.DefaultMaxEjectionTime - balancer.DefaultOutlierInterval)
	assert.Equal(t, 80*s, r.ejected(), "two spans in good standing forgive two doublings")
	r.quiet(4 * 80 * s)
	assert.Equal(t, balancer.DefaultEjectionTime, r.ejected(), "four spans of the last ejection forgive the rest")
}

// TestOutlierGoodStandingAfterAClockStepBack: good standing since an
// ejection counts from a clock step back (the return, then ahead of the
// clock, is mended to the step), as a breaker's does: ten good minutes
// after the step forgive the ejection, and a failure right after the step
// is a flap, held out twice as long, not for the step's length.
func TestOutlierGoodStandingAfterAClockStepBack(t *testing.T) {
	r := newEjectionRun(t)
	require.Equal(t, balancer.DefaultEjectionTime, r.ejected())
	r.clock.Advance(-time.Hour)
	r.quiet(10 * time.Minute)
	assert.Equal(t, balancer.DefaultEjectionTime, r.ejected(), "ten good minutes after the step: it starts over")

	r.clock.Advance(-time.Hour)
	r.call(r.ids[1], false) // the step is noticed
	assert.Equal(t, 2*balancer.DefaultEjectionTime, r.ejected(), "a flap across the step still doubles")
}
