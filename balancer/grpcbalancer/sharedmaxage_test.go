package grpcbalancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
)

// A policy that owns its Balancer refuses an ORCA out-of-band interval
// longer than balancer.telemetryMaxAge: every report would be ignored as
// stale before the next came. On a shared Balancer (NewBuilder) the check
// was skipped, as the Balancer's age was not visible: "interval": "45s"
// against the default 30s was accepted, and each endpoint's out-of-band
// load was unknown a third of the time. The check now reads the shared
// Balancer's age, whatever it is set to.
func TestParseConfigChecksORCAIntervalAgainstASharedBalancer(t *testing.T) {
	config := func(interval string) []byte {
		return []byte(`{"orca": {"outOfBand": true, "interval": "` + interval + `"}}`)
	}
	for _, tt := range []struct {
		maxAge   time.Duration // the shared Balancer's Options.TelemetryMaxAge
		interval string
		want     string // substring of the error; "" for none
	}{
		{0, "45s", "orca.interval: 45s is longer than the shared Balancer's TelemetryMaxAge (30s"},
		{0, "30s", ""},
		{10 * time.Second, "15s", "orca.interval: 15s is longer than the shared Balancer's TelemetryMaxAge (10s"},
		{10 * time.Second, "5s", ""},
		// Past what a policy's own Balancer would take by default: the
		// shared one's age is what counts.
		{time.Minute, "45s", ""},
		{-1, "1h", ""}, // a Balancer that never ignores a reading
	} {
		b := core.New(core.Options{TelemetryMaxAge: tt.maxAge})
		_, err := grpcbalancer.NewBuilder("inferlb-shared-maxage", b).ParseConfig(config(tt.interval))
		b.Close()
		if tt.want == "" {
			assert.NoError(t, err, "TelemetryMaxAge %v, interval %s", tt.maxAge, tt.interval)
			continue
		}
		require.Error(t, err, "TelemetryMaxAge %v, interval %s", tt.maxAge, tt.interval)
		assert.Contains(t, err.Error(), "inferlb: service config field "+tt.want)
	}

	// Without outOfBand no stream runs, and the interval is not checked.
	b := core.New(core.Options{TelemetryMaxAge: 10 * time.Second})
	defer b.Close()
	_, err := grpcbalancer.NewBuilder("inferlb-shared-maxage", b).ParseConfig([]byte(`{"orca": {"interval": "1m"}}`))
	assert.NoError(t, err)
}
