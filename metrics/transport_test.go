package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/metrics"
)

type transportStats httpbalancer.TransportStats

func (s transportStats) Stats() httpbalancer.TransportStats { return httpbalancer.TransportStats(s) }

// A Transport's counts show as counters labelled with its name. (The
// httpbalancer tests make the counts with real idle-close races.)
func TestTransportCollectorExportsCounts(t *testing.T) {
	c := metrics.NewTransportCollector(transportStats{Resends: 7, Failovers: 3}, "embedding")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP inferlb_http_failovers_total Calls retried on another endpoint after failing before any response, or after an answer that the endpoint does not serve their model or that they are longer than its context window (one count per retry).
# TYPE inferlb_http_failovers_total counter
inferlb_http_failovers_total{transport="embedding"} 3
# HELP inferlb_http_idle_close_resends_total Calls sent again to the same endpoint because the server closed the keep-alive connection they were put on while it was idle (net/http's "server closed idle connection"); a steady rate means the client's IdleConnTimeout is above the servers' keep-alive timeout.
# TYPE inferlb_http_idle_close_resends_total counter
inferlb_http_idle_close_resends_total{transport="embedding"} 7
`)))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
