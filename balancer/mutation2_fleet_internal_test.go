package balancer

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/telemetry"
)

// fleetRig is a stayRig past its members' first scrapes (firstReadingDue),
// with helpers to publish load readings and read the fleet view.
func newFleetRig(t *testing.T, n int) *stayRig {
	t.Helper()
	r := newStayRig(t, n, Options{})
	r.clock.Advance(time.Hour)
	return r
}

// report publishes running calls (and an empty queue) for member i, now.
func (r *stayRig) report(i int, running float64) {
	s := telemetry.Sample{Time: r.clock.Now()}
	s.Set(telemetry.Running, running)
	s.Set(telemetry.Waiting, 0)
	r.b.Publish(r.g.members[i].id, s)
}

func (r *stayRig) sum() fleetSum {
	nowNs := r.clock.Now().UnixNano()
	st := r.g.eligibility(r.b.cfg, r.b.epoch.Load(), nowNs)
	return r.g.sumReported(r.b.cfg, st, r.clock.Now(), nil, nil)
}

func (r *stayRig) view() fleetSum {
	nowNs := r.clock.Now().UnixNano()
	st := r.g.eligibility(r.b.cfg, r.b.epoch.Load(), nowNs)
	return r.g.fleetLoad(r.b.cfg, st, r.clock.Now())
}

// A member's part of the total is its reading or this caller's own calls
// on it, whichever is more: a server's count lags, and this caller's calls
// there are load whatever it says.
func TestFleetTotalTakesOwnCallsAboveTheReading(t *testing.T) {
	r := newFleetRig(t, 4)
	for i := range 4 {
		r.report(i, 2)
	}
	r.g.members[0].inFlight.Store(5)
	v := r.sum()
	require.True(t, v.ok)
	assert.Equal(t, 5.0+3*2, v.total, "member 0 reports 2 running with 5 of this caller's calls on it")
}

// The reading is brought up to now with this caller's calls there since
// it (readingDelta).
func TestFleetTotalCountsCallsSinceTheReading(t *testing.T) {
	r := newFleetRig(t, 4)
	for i := range 4 {
		r.report(i, 5)
	}
	require.Equal(t, 20.0, r.sum().total)
	r.g.members[0].inFlight.Store(2) // two calls picked since the reading
	v := r.sum()
	assert.Equal(t, 5.0+2+3*5, v.total, "the two calls sent since the reading count")
}

// A member without a reading, while the members that report carry more
// than half the weight, is taken at the reporters' mean per unit of
// weight, or at this caller's own calls on it if more (fleetView).
func TestFleetTotalEstimatesAMemberWithoutAReading(t *testing.T) {
	for _, tc := range []struct {
		own  int64
		want float64
	}{
		{0, 12 + 4}, // the mean of 3 reporters at 4
		{6, 12 + 6}, // this caller's 6 calls on it
	} {
		t.Run(fmt.Sprintf("own %d", tc.own), func(t *testing.T) {
			r := newFleetRig(t, 4)
			for i := 1; i < 4; i++ {
				r.report(i, 4)
			}
			r.g.members[0].inFlight.Store(tc.own)
			v := r.sum()
			require.True(t, v.ok)
			assert.Equal(t, tc.want, v.total)
		})
	}
}

// A member without a reading that may not have been scraped yet
// (firstReadingDue) leaves the view without a total, whichever member it
// is: here the first member, listed at start-up, has none, and so has one
// added to the serving pool since (estimated at once on its own).
func TestFleetViewWaitsForAnyMemberNotScrapedYet(t *testing.T) {
	r := newStayRig(t, 4, Options{})
	eps := make([]inferlb.Endpoint, 5)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("e%d", i), Addr: fmt.Sprintf("e%d:1", i)}
	}
	require.NoError(t, r.b.Update(eps))
	r.g = r.b.def.snap.Load().all
	require.Equal(t, "e4", r.g.members[4].id)
	require.Zero(t, r.g.members[4].joined, "e4 joined a serving pool")
	require.NotZero(t, r.g.members[0].joined, "e0 was listed at start-up")
	r.clock.Advance(time.Second)
	for i := 1; i < 4; i++ {
		r.report(i, 4)
	}
	v := r.sum()
	assert.False(t, v.ok, "e0 may not have been scraped yet")
	assert.True(t, math.IsNaN(v.total))
}

// firstReadingDue: a member listed at start-up waits for its first scrape
// for a telemetry max-age (DefaultTelemetryMaxAge when readings never go
// stale), and not while the clock reads before its listing (stepped back).
func TestFirstReadingDueWindow(t *testing.T) {
	r := newStayRig(t, 1, Options{})
	now := r.clock.Now().UnixNano()
	e := &endpoint{joined: now - int64(time.Second)}
	c := *r.b.cfg
	c.telemetryMaxAge = 0
	assert.True(t, firstReadingDue(&c, e, now), "readings never stale: the default max-age applies")
	assert.False(t, firstReadingDue(&c, e, now+int64(DefaultTelemetryMaxAge)))
	e.joined = now + int64(time.Hour)
	assert.False(t, firstReadingDue(r.b.cfg, e, now), "a clock before the listing (stepped back)")
}

// A server reporting more requests than maxReportedLoad in all, each count
// within telemetry.MaxRequests, is no reading.
func TestReportedLoadBoundsTheSum(t *testing.T) {
	var s telemetry.Sample
	s.Set(telemetry.Running, telemetry.MaxRequests)
	s.Set(telemetry.Waiting, telemetry.MaxRequests)
	require.True(t, s.Has.Has(telemetry.Running) && s.Has.Has(telemetry.Waiting))
	_, ok := reportedLoad(&s)
	assert.False(t, ok, "2 x MaxRequests running and queued")
	s.Set(telemetry.Waiting, 0)
	l, ok := reportedLoad(&s)
	assert.True(t, ok)
	assert.Equal(t, float64(telemetry.MaxRequests), l)
}

// A sleeping member's calls are aside: the members in rotation do not
// share them.
func TestFleetViewPutsASleepersCallsAside(t *testing.T) {
	r := newFleetRig(t, 4)
	s := telemetry.Sample{Time: r.clock.Now()}
	s.Set(telemetry.Asleep, 1)
	r.b.Publish(r.g.members[0].id, s)
	for i := 1; i < 4; i++ {
		r.report(i, 4)
	}
	r.g.members[0].inFlight.Store(3)
	v := r.sum()
	assert.Equal(t, 1.0, v.asleep)
	assert.Equal(t, int64(3), v.aside, "the sleeper's calls")
	assert.Equal(t, 12.0, v.total)
}

// The view is reused for fleetViewTTL from when it was computed, and no
// longer; nor after the epoch moved (a member's standing changed), nor at
// a clock that reads before it was computed (stepped back).
func TestFleetViewCache(t *testing.T) {
	setup := func(t *testing.T) *stayRig {
		r := newFleetRig(t, 4)
		for i := range 4 {
			r.report(i, 4)
		}
		require.Equal(t, 16.0, r.view().total)
		for i := range 4 {
			r.report(i, 8) // a new scrape, at the same time
		}
		return r
	}
	t.Run("within the TTL", func(t *testing.T) {
		r := setup(t)
		r.clock.Advance(fleetViewTTL - 1)
		assert.Equal(t, 16.0, r.view().total, "reused within the TTL")
	})
	t.Run("at the TTL", func(t *testing.T) {
		r := setup(t)
		r.clock.Advance(fleetViewTTL)
		assert.Equal(t, 32.0, r.view().total, "a new scrape shows after fleetViewTTL")
	})
	t.Run("a tenth of a second", func(t *testing.T) {
		// fleetViewTTL's doc: "a new scrape shows within a tenth of a
		// second", well under a scrape interval.
		r := setup(t)
		r.clock.Advance(100 * time.Millisecond)
		assert.Equal(t, 32.0, r.view().total)
	})
	t.Run("epoch", func(t *testing.T) {
		r := setup(t)
		r.b.epoch.Add(1)
		assert.Equal(t, 32.0, r.view().total, "recomputed when the epoch moves")
	})
	t.Run("clock stepped back", func(t *testing.T) {
		r := setup(t)
		r.clock.Set(r.clock.Now().Add(-time.Hour))
		for i := range 4 {
			r.report(i, 8)
		}
		assert.Equal(t, 32.0, r.view().total, "a view from the future is not reused")
	})
}
