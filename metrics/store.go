package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/telemetry"
)

// StoreCollector is a prometheus.Collector over one telemetry Store: what
// became of the samples offered to it (kept, or dropped and why) and how many
// endpoints it tracks. Malformed and stale telemetry is dropped, never fatal,
// and this is where the drops show; so do the samples a Balancer kept but
// never reads, as they were older than its TelemetryMaxAge on arrival
// (result="arrived_stale"), whether they came through the Balancer or
// from a Poller publishing into the Store itself.
//
// A Store may be shared by several Balancers, so its counts are its own, not
// a Balancer's: register one StoreCollector per Store (for a Balancer's
// private Store, Balancer.Telemetry), and a sum over its series counts each
// sample once.
type StoreCollector struct {
	st *telemetry.Store

	samples, endpoints, partial *prometheus.Desc
}

var _ prometheus.Collector = (*StoreCollector)(nil)

// NewStoreCollector returns a Collector for st. storeName becomes the
// constant label store="..." (for a Balancer's private Store, the name its
// Collector has is a good choice).
func NewStoreCollector(st *telemetry.Store, storeName string) *StoreCollector {
	cl := prometheus.Labels{"store": storeName}
	return &StoreCollector{
		st: st,
		samples: prometheus.NewDesc("inferlb_telemetry_samples_total",
			"Telemetry samples offered to the store, by what happened to them.", []string{"result"}, cl),
		partial: prometheus.NewDesc("inferlb_telemetry_partial_samples_total",
			"Samples an adapter published with some fields left out as malformed (an HTTP load header or an ORCA report with a NaN, a negative count, a field that does not parse); their other fields count in inferlb_telemetry_samples_total as usual.", nil, cl),
		endpoints: prometheus.NewDesc("inferlb_telemetry_store_endpoints",
			"Endpoint IDs the store has a slot for: a Balancer's endpoints, read or not yet, and IDs published to the store directly. Past its MaxEndpoints, samples for an ID without a slot are dropped: dropped_full when published to the store directly (a Poller whose Sink is the store), dropped_unknown through a Balancer.", nil, cl),
	}
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.samples
	ch <- c.partial
	ch <- c.endpoints
}

// Collect implements prometheus.Collector.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.st.Stats()
	for _, r := range []struct {
		n      uint64
		result string
	}{
		{t.Accepted, "accepted"},
		{t.DroppedEmpty, "dropped_empty"},
		{t.DroppedOld, "dropped_old"},
		{t.DroppedFull, "dropped_full"},
		{t.DroppedUnknown, "dropped_unknown"},
		{t.ArrivedStale, "arrived_stale"},
	} {
		ch <- prometheus.MustNewConstMetric(c.samples, prometheus.CounterValue, float64(r.n), r.result)
	}
	ch <- prometheus.MustNewConstMetric(c.partial, prometheus.CounterValue, float64(t.Partial))
	ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(c.st.Len()))
}
