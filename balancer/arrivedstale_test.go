package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A reading already older than TelemetryMaxAge when it arrives (a
// Prometheus server scraping every 60 s read through promapi, with the
// default 30 s max age) is never used by the balancer, and was counted as
// Accepted: the user saw accepted samples climb while every endpoint was
// scored without telemetry. It is counted as ArrivedStale instead, and
// kept (it is still the newest reading of its field).
func TestPublishCountsASampleStaleOnArrival(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, TelemetryMaxAge: 30 * time.Second})
	id := endpoints(2)[0].Addr
	kv := func(at time.Time, v float64) telemetry.Sample {
		s := telemetry.Sample{Time: at}
		s.Set(telemetry.KVCacheUsage, v)
		return s
	}
	clock.Advance(time.Hour)
	b.Publish(id, kv(clock.Now().Add(-45*time.Second), 0.9)) // a scrape 45 s old
	st := b.Telemetry().Stats()
	assert.Zero(t, st.Accepted, "a reading the balancer will never read is not accepted")
	assert.EqualValues(t, 1, st.ArrivedStale)
	assert.True(t, b.Telemetry().Slot(id).Held().Has(telemetry.KVCacheUsage), "kept all the same")
	_, ok := b.Telemetry().Latest(id, clock.Now(), 30*time.Second)
	assert.False(t, ok, "and not read")

	b.Publish(id, kv(clock.Now().Add(-30*time.Second), 0.5)) // exactly the max age: still read
	b.Publish(id, kv(clock.Now().Add(-50*time.Second), 0.7)) // older than what is held
	st = b.Telemetry().Stats()
	assert.EqualValues(t, 1, st.Accepted)
	assert.EqualValues(t, 1, st.ArrivedStale)
	assert.EqualValues(t, 1, st.DroppedOld)

	// A negative TelemetryMaxAge never goes stale: nothing arrives stale.
	clock2 := testutil.NewClock()
	nb := newBalancer(t, 2, balancer.Options{Clock: clock2, TelemetryMaxAge: -1})
	clock2.Advance(time.Hour)
	nb.Publish(id, kv(clock2.Now().Add(-45*time.Minute), 0.9))
	assert.EqualValues(t, 1, nb.Telemetry().Stats().Accepted)
	assert.Zero(t, nb.Telemetry().Stats().ArrivedStale)
}

// Counting a sample stale on arrival costs Publish and PublishKnown no
// allocation: they allocate what the Store's merge does (one entry per
// merge, which readers load without locks), no more.
func TestPublishStaleCheckDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock})
	id := endpoints(2)[0].Addr
	clock.Advance(time.Hour)
	s := telemetry.Sample{Time: clock.Now()}
	s.Set(telemetry.Waiting, 1)
	old := telemetry.Sample{Time: clock.Now().Add(-time.Minute)} // merged, stale
	old.Set(telemetry.KVCacheUsage, 0.5)
	store := b.Telemetry()
	store.PublishKnown(id, s)
	merge := testing.AllocsPerRun(100, func() {
		s.Time, old.Time = s.Time.Add(time.Nanosecond), old.Time.Add(time.Nanosecond)
		store.PublishKnown(id, s)
		store.PublishKnown(id, old)
	})
	assert.Equal(t, 2.0, merge, "one entry per merge")
	assert.Equal(t, merge, testing.AllocsPerRun(100, func() {
		s.Time, old.Time = s.Time.Add(time.Nanosecond), old.Time.Add(time.Nanosecond)
		b.Publish(id, s)
		b.Publish(id, old)
	}))
	// PublishKnown counts by the max age the Balancer declared
	// (Store.ReadWithin), Publish by its own: both took the stale path.
	assert.EqualValues(t, 202, store.Stats().ArrivedStale, "the stale path was taken")
}

// A Poller publishing straight into the Store the Balancer reads (a Store
// shared by several Balancers, or b.Telemetry()) counted a reading already
// older than TelemetryMaxAge as Accepted: the user saw
// inferlb_telemetry_samples_total{result="accepted"} climb, and
// arrived_stale stay 0, while every endpoint was scored without
// telemetry. The Balancer declares its max age to the Store, which
// counts such a reading in ArrivedStale whichever way it came.
func TestPollerIntoTheStoreCountsAStaleArrival(t *testing.T) {
	clock := testutil.NewClock()
	clock.Advance(time.Hour)
	store := &telemetry.Store{Clock: clock}
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Telemetry: store, TelemetryMaxAge: 30 * time.Second})
	id := endpoints(2)[0].Addr
	at := clock.Now().Add(-45 * time.Second) // a Prometheus scrape 45 s old
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		s := telemetry.Sample{Time: at}
		s.Set(telemetry.KVCacheUsage, 0.9)
		return []telemetry.Observation{{EndpointID: id, Sample: s}}, nil
	})
	p, err := telemetry.NewPoller(src, store, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	require.True(t, p.Poll(context.Background()))
	st := store.Stats()
	assert.Zero(t, st.Accepted, "a reading the balancer will never read is not accepted")
	assert.EqualValues(t, 1, st.ArrivedStale)
	_, ok := b.Telemetry().Latest(id, clock.Now(), 30*time.Second)
	assert.False(t, ok, "and the balancer does not read it")

	at = clock.Now().Add(-10 * time.Second) // a fresh one is accepted
	require.True(t, p.Poll(context.Background()))
	assert.EqualValues(t, 1, store.Stats().Accepted)
	assert.EqualValues(t, 1, store.Stats().ArrivedStale)
}
