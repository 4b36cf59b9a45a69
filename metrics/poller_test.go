package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	tu "github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/metrics"
	"github.com/inferlb/inferlb/telemetry"
)

// TestPollerCollectorExportsRounds: a Poller's rounds, successes and
// failures, and the samples it published and skipped, show as metrics.
func TestPollerCollectorExportsRounds(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:1"}}))
	fail := true
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		if fail {
			return nil, errors.New("scrape refused")
		}
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, 0.5)
		return []telemetry.Observation{{EndpointID: "a:1", Sample: s}, {Sample: s}}, nil // the second has no ID
	})
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	c := metrics.NewPollerCollector(p, "vllm")
	ctx := context.Background()

	p.Poll(ctx)
	p.Poll(ctx)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_telemetry_poll_consecutive_failures Failed rounds in a row now (0 after a success); the Poller backs off while it grows.
# TYPE inferlb_telemetry_poll_consecutive_failures gauge
inferlb_telemetry_poll_consecutive_failures{poller="vllm"} 2
# HELP inferlb_telemetry_poll_failures_total Rounds that failed with no usable result, timeouts that left none included.
# TYPE inferlb_telemetry_poll_failures_total counter
inferlb_telemetry_poll_failures_total{poller="vllm"} 2
# HELP inferlb_telemetry_poll_published_total Samples handed to the Poller's Sink (a Balancer or a telemetry Store).
# TYPE inferlb_telemetry_poll_published_total counter
inferlb_telemetry_poll_published_total{poller="vllm"} 0
`), "inferlb_telemetry_poll_consecutive_failures", "inferlb_telemetry_poll_failures_total", "inferlb_telemetry_poll_published_total"))

	fail = false
	p.Poll(ctx)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_telemetry_poll_consecutive_failures Failed rounds in a row now (0 after a success); the Poller backs off while it grows.
# TYPE inferlb_telemetry_poll_consecutive_failures gauge
inferlb_telemetry_poll_consecutive_failures{poller="vllm"} 0
# HELP inferlb_telemetry_poll_published_total Samples handed to the Poller's Sink (a Balancer or a telemetry Store).
# TYPE inferlb_telemetry_poll_published_total counter
inferlb_telemetry_poll_published_total{poller="vllm"} 1
# HELP inferlb_telemetry_poll_rounds_total Rounds the Poller ran (Source.Collect calls).
# TYPE inferlb_telemetry_poll_rounds_total counter
inferlb_telemetry_poll_rounds_total{poller="vllm"} 3
# HELP inferlb_telemetry_poll_skipped_total Observations dropped for having no endpoint ID or no field.
# TYPE inferlb_telemetry_poll_skipped_total counter
inferlb_telemetry_poll_skipped_total{poller="vllm"} 1
`), "inferlb_telemetry_poll_consecutive_failures", "inferlb_telemetry_poll_published_total", "inferlb_telemetry_poll_rounds_total", "inferlb_telemetry_poll_skipped_total"))
	require.Equal(t, 10, testutil.CollectAndCount(c))
}

// statsFunc is a PollerStatser over fixed counters.
type statsFunc func() telemetry.PollerStats

func (f statsFunc) Stats() telemetry.PollerStats { return f() }

// TestPollerCollectorExportsEarlyRounds: the rounds a Poller ran early,
// after its Sink dropped readings, show apart from its rounds, so the
// extra load on the Source is seen.
func TestPollerCollectorExportsEarlyRounds(t *testing.T) {
	c := metrics.NewPollerCollector(statsFunc(func() telemetry.PollerStats {
		return telemetry.PollerStats{Rounds: 9, Early: 4}
	}), "dcgm")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_telemetry_poll_early_rounds_total Rounds run ahead of the Poller's Interval because its Sink dropped readings (a reconnect, a failure exclusion); at most one per MinInterval.
# TYPE inferlb_telemetry_poll_early_rounds_total counter
inferlb_telemetry_poll_early_rounds_total{poller="dcgm"} 4
# HELP inferlb_telemetry_poll_rounds_total Rounds the Poller ran (Source.Collect calls).
# TYPE inferlb_telemetry_poll_rounds_total counter
inferlb_telemetry_poll_rounds_total{poller="dcgm"} 9
`), "inferlb_telemetry_poll_early_rounds_total", "inferlb_telemetry_poll_rounds_total"))
}

// TestPollerCollectorExportsUnknownSamples: samples the Balancer dropped
// as unknown (targets named by host:port, endpoints known by their Addr
// with the scheme) show per Poller.
func TestPollerCollectorExportsUnknownSamples(t *testing.T) {
	clock := tu.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	defer b.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "http://10.0.0.5:8000"}, {Addr: "http://10.0.0.6:8000"}}))
	src := telemetry.SourceFunc(func(context.Context) ([]telemetry.Observation, error) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.KVCacheUsage, 0.5)
		return []telemetry.Observation{{EndpointID: "http://10.0.0.5:8000", Sample: s}, {EndpointID: "10.0.0.6:8000", Sample: s}}, nil
	})
	p, err := telemetry.NewPoller(src, b, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	c := metrics.NewPollerCollector(p, "vllm")
	p.Poll(context.Background())
	p.Poll(context.Background())
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_telemetry_poll_published_total Samples handed to the Poller's Sink (a Balancer or a telemetry Store).
# TYPE inferlb_telemetry_poll_published_total counter
inferlb_telemetry_poll_published_total{poller="vllm"} 4
# HELP inferlb_telemetry_poll_unknown_total Published samples the Sink (a Balancer) dropped for an endpoint ID it does not know: targets named otherwise than the endpoints' keys (Endpoint.Key), or endpoints that left while scraped.
# TYPE inferlb_telemetry_poll_unknown_total counter
inferlb_telemetry_poll_unknown_total{poller="vllm"} 2
`), "inferlb_telemetry_poll_published_total", "inferlb_telemetry_poll_unknown_total"))
}

// TestPollerCollectorExportsStaleSamples: samples that arrived older than
// the Balancer's TelemetryMaxAge show per Poller.
func TestPollerCollectorExportsStaleSamples(t *testing.T) {
	c := metrics.NewPollerCollector(statsFunc(func() telemetry.PollerStats {
		return telemetry.PollerStats{Published: 9, Stale: 7}
	}), "prometheus")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_telemetry_poll_stale_total Published samples already older than the Sink's TelemetryMaxAge as they were published (a Balancer ignores them): a Source that scrapes less often than the max age, such as Prometheus at its default 1m read through promapi.
# TYPE inferlb_telemetry_poll_stale_total counter
inferlb_telemetry_poll_stale_total{poller="prometheus"} 7
`), "inferlb_telemetry_poll_stale_total"))
}
