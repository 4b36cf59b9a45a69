package httpbalancer_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/metrics"
)

// Idle-close resends and failovers are counted per Transport and show in
// a Prometheus scrape (metrics.NewTransportCollector): a steady rate of
// resends says the client keeps idle connections longer than the servers
// do. Made here by the real race on loopback: first a resend that the
// endpoint then serves, then one refused there (the server is shutting
// down) that fails over.
func TestIdleCloseResendsAndFailoversAreCounted(t *testing.T) {
	race, a, b, res, tr := raceFleet(t, 2, httpbalancer.Options{})
	collector := metrics.NewTransportCollector(tr, "llm")
	client := &http.Client{Transport: tr}
	post(t, client, chatBody(1, false)) // leaves an idle connection to a
	require.False(t, (<-res.c).Resent)
	assert.Equal(t, httpbalancer.TransportStats{}, tr.Stats())

	race.armed.Store(true)
	post(t, client, chatBody(2, false))
	require.EqualValues(t, 1, race.raced.Load(), "the race happened")
	require.True(t, (<-res.c).Resent)
	assert.EqualValues(t, 2, a.hits.Load(), "a served the call sent again")
	assert.Equal(t, httpbalancer.TransportStats{Resends: 1}, tr.Stats())

	require.NoError(t, a.srv.Listener.Close()) // shutting down: its last connection is idle
	race.armed.Store(true)
	post(t, client, chatBody(3, false))
	require.EqualValues(t, 2, race.raced.Load(), "the race happened again")
	refused, onB := <-res.c, <-res.c
	require.True(t, refused.Resent)
	require.True(t, refused.FailedOver)
	require.Equal(t, "b", onB.Endpoint)
	assert.EqualValues(t, 1, b.hits.Load())
	assert.Equal(t, httpbalancer.TransportStats{Resends: 2, Failovers: 1}, tr.Stats())

	require.NoError(t, testutil.CollectAndCompare(collector, strings.NewReader(`
# HELP inferlb_http_failovers_total Calls retried on another endpoint after failing before any response, or after an answer that the endpoint does not serve their model or that they are longer than its context window (one count per retry).
# TYPE inferlb_http_failovers_total counter
inferlb_http_failovers_total{transport="llm"} 1
# HELP inferlb_http_idle_close_resends_total Calls sent again to the same endpoint because the server closed the keep-alive connection they were put on while it was idle (net/http's "server closed idle connection"); a steady rate means the client's IdleConnTimeout is above the servers' keep-alive timeout.
# TYPE inferlb_http_idle_close_resends_total counter
inferlb_http_idle_close_resends_total{transport="llm"} 2
`)))
}
