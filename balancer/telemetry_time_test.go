package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A sample stamped by a clock that runs ahead of the balancer's (a report
// carrying the server's own observation time, as Sample.Time asks for) is
// read as observed now, as a telemetry.Poller reads one: kept at its own
// time it would win over every fresher reading for as long as that clock is
// ahead, and stay fresh that much past TelemetryMaxAge.
func TestPublishReadsAFutureSampleAsNow(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock})
	id := endpoints(2)[0].Addr
	kv := func(at time.Time, v float64) telemetry.Sample {
		s := telemetry.Sample{Time: at}
		s.Set(telemetry.KVCacheUsage, v)
		return s
	}
	b.Publish(id, kv(clock.Now().Add(time.Minute), 0.95)) // a server clock a minute fast
	clock.Advance(time.Second)
	b.Publish(id, kv(clock.Now(), 0.3)) // a fresher local reading
	s, ok := b.Telemetry().Latest(id, clock.Now(), balancer.DefaultTelemetryMaxAge)
	got, _ := s.Get(telemetry.KVCacheUsage)
	assert.True(t, ok)
	assert.Equal(t, 0.3, got, "the newer reading replaces the one stamped ahead")

	b.Publish(id, kv(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), 0.95)) // past int64 nanoseconds too
	clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
	_, ok = b.Telemetry().Latest(id, clock.Now(), balancer.DefaultTelemetryMaxAge)
	assert.False(t, ok, "and it goes stale on the balancer's clock")
}
