package balancer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A Poller whose targets are named by host:port, publishing into a
// Balancer that knows its endpoints by their Addr with the scheme: every
// sample is dropped as unknown, and the Poller's OnError hears of it, with
// the IDs it should have used.
func TestPollerTellsOfTargetsTheBalancerDoesNotKnow(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	defer b.Close()
	addrs := []string{"http://10.0.0.5:8000", "http://10.0.0.6:8000", "http://10.0.0.7:8000", "http://10.0.0.8:8000"}
	var eps []inferlb.Endpoint
	for _, a := range addrs {
		eps = append(eps, inferlb.Endpoint{Addr: a})
	}
	require.NoError(t, b.Update(eps))

	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		var obs []telemetry.Observation
		for _, a := range addrs {
			s := telemetry.Sample{}
			s.Set(telemetry.Waiting, 3)
			obs = append(obs, telemetry.Observation{EndpointID: strings.TrimPrefix(a, "http://"), Sample: s})
		}
		return obs, nil
	})
	var errs []error
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()), "the round succeeds")
	require.True(t, p.Poll(t.Context()))

	require.Len(t, errs, 1, "once for the same mistake: %v", errs)
	var ue *telemetry.UnknownEndpointsError
	require.ErrorAs(t, errs[0], &ue)
	assert.ErrorIs(t, errs[0], telemetry.ErrUnknownEndpoint)
	assert.Equal(t, 4, ue.Dropped)
	assert.Equal(t, []string{"10.0.0.5:8000", "10.0.0.6:8000", "10.0.0.7:8000"}, ue.IDs)
	assert.Equal(t, addrs[:3], ue.Known, "the Balancer's endpoint keys, sorted")
	assert.Equal(t, `telemetry: 4 of 4 samples dropped: the Sink knows no endpoint "10.0.0.5:8000", "10.0.0.6:8000", "10.0.0.7:8000", ... `+
		`(it knows "http://10.0.0.5:8000", "http://10.0.0.6:8000", "http://10.0.0.7:8000", ...); `+
		`name each target by its endpoint's Endpoint.Key: the Endpoint.ID, else the Addr exactly as given, scheme included`,
		ue.Error(), "as README's Telemetry section quotes it")
	assert.EqualValues(t, 8, b.Telemetry().Stats().DroppedUnknown)
	assert.EqualValues(t, 8, p.Stats().Unknown)
	assert.Zero(t, p.Stats().Failures)
}

// Known reports whether the Balancer keeps samples for an ID: its
// endpoints' keys only; KnownIDs lists those keys, sorted and bounded.
func TestBalancerKnown(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	defer b.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "b", Addr: "10.0.0.6:8000"}, {Addr: "http://10.0.0.5:8000"}}))
	assert.True(t, b.Known("b"))
	assert.True(t, b.Known("http://10.0.0.5:8000"))
	assert.False(t, b.Known("10.0.0.6:8000"), "known by its ID, not its Addr")
	assert.False(t, b.Known("10.0.0.5:8000"), "its Addr is written with the scheme")
	assert.Equal(t, []string{"b", "http://10.0.0.5:8000"}, b.KnownIDs(3))
	assert.Equal(t, []string{"b"}, b.KnownIDs(1))
	assert.Empty(t, b.KnownIDs(0))
	assert.Zero(t, testing.AllocsPerRun(100, func() { b.Known("10.0.0.5:8000") }))

	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "b", Addr: "10.0.0.6:8000"}}))
	assert.False(t, b.Known("http://10.0.0.5:8000"), "an endpoint that left")
}

// A Poller reading Prometheus (promapi stamps each reading with its
// scrape's time) that scrapes once a minute, into a Balancer with the
// default 30 s TelemetryMaxAge: readings from the older scrapes arrive
// stale and route nothing. The Store counts them (ArrivedStale) and the
// Poller's OnError says so with the fix; with a TelemetryMaxAge above the
// scrape interval nothing is reported.
func TestPollerTellsOfSamplesTooOldForTheBalancer(t *testing.T) {
	for _, tt := range []struct {
		maxAge    time.Duration
		wantStale int
	}{{0, 1}, {2 * time.Minute, 0}} {
		t.Run(fmt.Sprint("TelemetryMaxAge ", tt.maxAge), func(t *testing.T) {
			clock := testutil.NewClock()
			b := balancer.New(balancer.Options{Clock: clock, TelemetryMaxAge: tt.maxAge})
			defer b.Close()
			require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "10.0.0.5:8000"}, {ID: "b", Addr: "10.0.0.6:8000"}}))
			src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
				var obs []telemetry.Observation
				for id, age := range map[string]time.Duration{"a": 50 * time.Second, "b": 10 * time.Second} {
					s := telemetry.Sample{Time: clock.Now().Add(-age)}
					s.Set(telemetry.Waiting, 3)
					obs = append(obs, telemetry.Observation{EndpointID: id, Sample: s})
				}
				return obs, nil
			})
			var errs []error
			p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
			require.NoError(t, err)
			require.True(t, p.Poll(t.Context()))
			assert.EqualValues(t, tt.wantStale, b.Telemetry().Stats().ArrivedStale)
			assert.EqualValues(t, tt.wantStale, p.Stats().Stale)
			if tt.wantStale == 0 {
				assert.Empty(t, errs)
				return
			}
			require.Len(t, errs, 1)
			var se *telemetry.StaleSamplesError
			require.ErrorAs(t, errs[0], &se)
			assert.Equal(t, telemetry.StaleSamplesError{Stale: 1, Published: 2, Oldest: 50 * time.Second, MaxAge: balancer.DefaultTelemetryMaxAge, Since: 1}, *se)
		})
	}
}

// A Poller that outlives the Balancer it publishes into (closed first)
// has every sample dropped: its OnError says the Sink is closed, not that
// the targets are misnamed, which would send the reader after the wrong
// mistake.
func TestPollerTellsOfAClosedBalancer(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "10.0.0.5:8000"}}))
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		s := telemetry.Sample{}
		s.Set(telemetry.Waiting, 3)
		return []telemetry.Observation{{EndpointID: "a", Sample: s}}, nil
	})
	var errs []error
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{Clock: clock, OnError: func(err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	require.Empty(t, errs, "known while open")

	b.Close()
	require.True(t, p.Poll(t.Context()))
	require.Len(t, errs, 1)
	var ue *telemetry.UnknownEndpointsError
	require.ErrorAs(t, errs[0], &ue)
	assert.True(t, ue.SinkClosed)
	assert.Equal(t, "telemetry: 1 of 1 samples dropped: the Sink is closed; stop the Poller (end Run's context and wait for it to return) before closing the Balancer it publishes into", ue.Error())
	assert.ErrorIs(t, errs[0], telemetry.ErrUnknownEndpoint)
}
