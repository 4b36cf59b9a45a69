package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TransportStatser is what TransportCollector reads: an
// *httpbalancer.Transport.
type TransportStatser interface {
	Stats() httpbalancer.TransportStats
}

// TransportCollector is a prometheus.Collector over one HTTP Transport's
// own counts: calls sent again after the server closed an idle connection
// under them, and calls failed over to another endpoint. Its Balancer's
// view is a Collector's (NewCollector); inferlb_retries_total there counts
// the retry budget's answers to every adapter on that Balancer, these
// count this Transport's calls.
type TransportCollector struct {
	t TransportStatser

	resends, failovers *prometheus.Desc
}

var _ prometheus.Collector = (*TransportCollector)(nil)

// NewTransportCollector returns a Collector for t. transportName becomes
// the constant label transport="..." (for example the tier: "llm",
// "embedding").
func NewTransportCollector(t TransportStatser, transportName string) *TransportCollector {
	cl := prometheus.Labels{"transport": transportName}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("inferlb_http_"+name, help, nil, cl)
	}
	return &TransportCollector{
		t: t,
		resends: d("idle_close_resends_total",
			"Calls sent again to the same endpoint because the server closed the keep-alive connection they were put on while it was idle (net/http's \"server closed idle connection\"); a steady rate means the client's IdleConnTimeout is above the servers' keep-alive timeout."),
		failovers: d("failovers_total", "Calls retried on another endpoint after failing before any response, or after an answer that the endpoint does not serve their model or that they are longer than its context window (one count per retry)."),
	}
}

// Describe implements prometheus.Collector.
func (c *TransportCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.resends
	ch <- c.failovers
}

// Collect implements prometheus.Collector.
func (c *TransportCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.t.Stats()
	ch <- prometheus.MustNewConstMetric(c.resends, prometheus.CounterValue, float64(s.Resends))
	ch <- prometheus.MustNewConstMetric(c.failovers, prometheus.CounterValue, float64(s.Failovers))
}
