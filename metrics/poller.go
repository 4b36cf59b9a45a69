package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/telemetry"
)

// PollerStatser is what PollerCollector reads: a *telemetry.Poller.
type PollerStatser interface {
	Stats() telemetry.PollerStats
}

// PollerCollector is a prometheus.Collector over one telemetry Poller, so a
// scrape target that is down, slow or partly broken shows on a dashboard
// and not only through PollerOptions.OnError: a Balancer routing on stale
// telemetry routes as if it had none (stale readings are neutral), which is
// safe but worth knowing.
type PollerCollector struct {
	p PollerStatser

	rounds, failures, timeouts, partial, published, skipped, unknown, stale, early, consecutive *prometheus.Desc
}

var _ prometheus.Collector = (*PollerCollector)(nil)

// NewPollerCollector returns a Collector for p. pollerName becomes the
// constant label poller="..." (for example the Source: "vllm", "dcgm").
func NewPollerCollector(p PollerStatser, pollerName string) *PollerCollector {
	cl := prometheus.Labels{"poller": pollerName}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("inferlb_telemetry_poll_"+name, help, nil, cl)
	}
	return &PollerCollector{
		p:           p,
		rounds:      d("rounds_total", "Rounds the Poller ran (Source.Collect calls)."),
		failures:    d("failures_total", "Rounds that failed with no usable result, timeouts that left none included."),
		timeouts:    d("timeouts_total", "Rounds cut short by the Poller's Timeout, failed or partial (the targets that answered waited for one that did not)."),
		partial:     d("partial_total", "Rounds that returned observations with a partial-result error: some targets failed or were read in part (lines or values dropped) while others answered."),
		published:   d("published_total", "Samples handed to the Poller's Sink (a Balancer or a telemetry Store)."),
		skipped:     d("skipped_total", "Observations dropped for having no endpoint ID or no field."),
		unknown:     d("unknown_total", "Published samples the Sink (a Balancer) dropped for an endpoint ID it does not know: targets named otherwise than the endpoints' keys (Endpoint.Key), or endpoints that left while scraped."),
		stale:       d("stale_total", "Published samples already older than the Sink's TelemetryMaxAge as they were published (a Balancer ignores them): a Source that scrapes less often than the max age, such as Prometheus at its default 1m read through promapi."),
		early:       d("early_rounds_total", "Rounds run ahead of the Poller's Interval because its Sink dropped readings (a reconnect, a failure exclusion); at most one per MinInterval."),
		consecutive: d("consecutive_failures", "Failed rounds in a row now (0 after a success); the Poller backs off while it grows."),
	}
}

// Describe implements prometheus.Collector.
func (c *PollerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rounds, c.failures, c.timeouts, c.partial, c.published, c.skipped, c.unknown, c.stale, c.early, c.consecutive} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PollerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.rounds, s.Rounds)
	counter(c.failures, s.Failures)
	counter(c.timeouts, s.Timeouts)
	counter(c.partial, s.Partial)
	counter(c.published, s.Published)
	counter(c.skipped, s.Skipped)
	counter(c.unknown, s.Unknown)
	counter(c.stale, s.Stale)
	counter(c.early, s.Early)
	ch <- prometheus.MustNewConstMetric(c.consecutive, prometheus.GaugeValue, float64(s.ConsecutiveFailures))
}
