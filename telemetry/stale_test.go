package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// stamped is a Source whose samples carry their own times (a Prometheus
// server's scrapes, read through promapi): ages[id] before the clock's now.
func stamped(clock *testutil.Clock, ages map[string]time.Duration) telemetry.Source {
	return telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		var obs []telemetry.Observation
		for _, id := range []string{"a", "b", "c"} {
			if age, ok := ages[id]; ok {
				obs = append(obs, telemetry.Observation{EndpointID: id, Sample: sample(clock.Now().Add(-age), float64(telemetry.Waiting), 1)})
			}
		}
		return obs, nil
	})
}

// A Source whose readings arrive older than the Sink's max age (Prometheus
// scraping once a minute against the default 30 s) leaves the endpoints
// scored without telemetry. The Store counted it (ArrivedStale); the
// Poller's OnError says so too, with the age and the fix, at the first
// round and then at most every 10 minutes, counting those in between.
func TestPollerReportsStaleSamples(t *testing.T) {
	clock := testutil.NewClock()
	st := &telemetry.Store{Clock: clock}
	st.ReadWithin(30 * time.Second)
	ages := map[string]time.Duration{"a": 45 * time.Second, "b": 5 * time.Second, "c": 50 * time.Second}
	var errs []error
	p, err := telemetry.NewPoller(stamped(clock, ages), st, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)

	require.True(t, p.Poll(t.Context()), "stale samples do not fail the round")
	require.Len(t, errs, 1)
	var se *telemetry.StaleSamplesError
	require.ErrorAs(t, errs[0], &se)
	assert.ErrorIs(t, errs[0], telemetry.ErrStaleSamples)
	assert.Equal(t, telemetry.StaleSamplesError{Stale: 2, Published: 3, Oldest: 50 * time.Second, MaxAge: 30 * time.Second, Since: 2}, *se)
	assert.Equal(t, "telemetry: 2 of 3 samples arrived stale: the oldest was observed 50s before it was published, and the Sink ignores readings older than 30s; the endpoints they describe are scored without them: raise TelemetryMaxAge above the Source's scrape interval plus a round's duration, or have it scrape more often", se.Error())
	assert.EqualValues(t, 2, p.Stats().Stale)
	assert.EqualValues(t, 2, st.Stats().ArrivedStale, "the Poller and the Store agree")

	// Rounds within 10 minutes are counted, not reported.
	for range 39 { // 39 rounds 15 s apart: 9m45s
		clock.Advance(15 * time.Second)
		require.True(t, p.Poll(t.Context()))
	}
	assert.Len(t, errs, 1)
	assert.EqualValues(t, 80, p.Stats().Stale)

	clock.Advance(15 * time.Second) // 10 minutes after the report
	ages["c"] = 20 * time.Second
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 2)
	require.ErrorAs(t, errs[1], &se)
	assert.Equal(t, telemetry.StaleSamplesError{Stale: 1, Published: 3, Oldest: 45 * time.Second, MaxAge: 30 * time.Second, Since: 79}, *se)
	assert.Contains(t, se.Error(), "(79 stale since the last report)")
	assert.EqualValues(t, 81, p.Stats().Stale)
	assert.EqualValues(t, 81, st.Stats().ArrivedStale)
}

// Fresh samples, samples from a Source whose clock runs ahead (read as
// now), and samples for an ID the Sink drops as unknown are not stale; nor
// is anything published into a Store no reader declared a max age for, or
// whose readers keep every field.
func TestPollerStaleOnlyWhatTheSinkKeepsAndIgnores(t *testing.T) {
	clock := testutil.NewClock()
	poll := func(t *testing.T, sink telemetry.Sink, ages map[string]time.Duration) ([]error, telemetry.PollerStats) {
		var errs []error
		p, err := telemetry.NewPoller(stamped(clock, ages), sink, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
		require.NoError(t, err)
		require.True(t, p.Poll(t.Context()))
		return errs, p.Stats()
	}
	t.Run("fresh and ahead", func(t *testing.T) {
		st := &telemetry.Store{Clock: clock}
		st.ReadWithin(30 * time.Second)
		errs, stats := poll(t, st, map[string]time.Duration{"a": 30 * time.Second, "b": -time.Hour})
		assert.Empty(t, errs)
		assert.Zero(t, stats.Stale)
	})
	t.Run("unknown", func(t *testing.T) {
		k := newKnownSink("a")
		k.st.Clock = clock
		k.st.ReadWithin(30 * time.Second)
		errs, stats := poll(t, agingKnown{k}, map[string]time.Duration{"a": time.Second, "b": time.Hour})
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], telemetry.ErrUnknownEndpoint)
		assert.False(t, errors.Is(errs[0], telemetry.ErrStaleSamples))
		assert.Zero(t, stats.Stale)
		assert.EqualValues(t, 1, stats.Unknown)
	})
	for name, declare := range map[string]func(*telemetry.Store){
		"no reader declared":  func(*telemetry.Store) {},
		"a reader keeps them": func(st *telemetry.Store) { st.ReadWithin(30 * time.Second); st.ReadWithin(0) },
	} {
		t.Run(name, func(t *testing.T) {
			st := &telemetry.Store{Clock: clock}
			declare(st)
			assert.Zero(t, st.TelemetryMaxAge())
			errs, stats := poll(t, st, map[string]time.Duration{"a": time.Hour})
			assert.Empty(t, errs)
			assert.Zero(t, stats.Stale)
		})
	}
}

// agingKnown is a KnownSink over a Store that declares the Store's max age.
type agingKnown struct{ *knownSink }

func (a agingKnown) TelemetryMaxAge() time.Duration { return a.st.TelemetryMaxAge() }

var _ telemetry.AgingSink = agingKnown{}

// A Store's max age is the largest its readers declared.
func TestStoreTelemetryMaxAge(t *testing.T) {
	var st telemetry.Store
	st.ReadWithin(10 * time.Second)
	st.ReadWithin(time.Minute)
	st.ReadWithin(20 * time.Second)
	assert.Equal(t, time.Minute, st.TelemetryMaxAge())
}

// A Source that stamps a missing timestamp as the Unix epoch (time.Unix(0,
// 0), not the zero Time) hands over samples the Store drops as without a
// usable time (DroppedEmpty). They are not stale readings: reporting them
// so, 56 years old, with "raise TelemetryMaxAge" as the fix, sends the
// operator the wrong way, and PollerStats.Stale would disagree with the
// Store's ArrivedStale.
func TestPollerDoesNotCountUnusableTimesAsStale(t *testing.T) {
	clock := testutil.NewClock()
	st := &telemetry.Store{Clock: clock}
	st.ReadWithin(30 * time.Second)
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		return []telemetry.Observation{
			{EndpointID: "a", Sample: sample(time.Unix(0, 0), float64(telemetry.Waiting), 1)},
			{EndpointID: "b", Sample: sample(clock.Now().Add(-time.Second), float64(telemetry.Waiting), 1)},
		}, nil
	})
	var errs []error
	p, err := telemetry.NewPoller(src, st, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	assert.Empty(t, errs)
	assert.Zero(t, p.Stats().Stale)
	assert.Equal(t, p.Stats().Stale, st.Stats().ArrivedStale, "the Poller and the Store agree")
	assert.EqualValues(t, 1, st.Stats().DroppedEmpty)
}

// A wall clock stepped back (an NTP correction) must not hold the next
// report back until the clock has caught up with the last one's time plus
// 10 minutes: the round after the step reports, and the 10 minutes run
// from there.
func TestPollerStaleReportAfterClockSteppedBack(t *testing.T) {
	clock := testutil.NewClock()
	st := &telemetry.Store{Clock: clock}
	st.ReadWithin(30 * time.Second)
	var errs []error
	p, err := telemetry.NewPoller(stamped(clock, map[string]time.Duration{"a": time.Minute}), st, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 1)

	clock.Advance(-time.Hour)
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 2, "reported after the step back")
	var se *telemetry.StaleSamplesError
	require.ErrorAs(t, errs[1], &se)
	assert.EqualValues(t, 1, se.Since)

	clock.Advance(time.Minute)
	require.True(t, p.Poll(t.Context()))
	assert.Len(t, errs, 2, "then at most once every 10 minutes again")
	clock.Advance(9 * time.Minute)
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 3)
	require.ErrorAs(t, errs[2], &se)
	assert.EqualValues(t, 2, se.Since)
}
