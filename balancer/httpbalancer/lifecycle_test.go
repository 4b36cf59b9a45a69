package httpbalancer_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// cannedResponse is a Base that closes the request body and answers 200
// with body and the given header.
func cannedResponse(h http.Header, body string) baseFunc {
	return func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusOK, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
}

func chatRequest(t *testing.T, i int) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
	require.NoError(t, err)
	return req
}

// TestBaseWithNeitherResponseNorError: a Base that breaks the RoundTripper
// contract with (nil, nil) fails the call, as http.Client does, instead of
// panicking with the pick never reported (the endpoint one call busier for
// good).
func TestBaseWithNeitherResponseNorError(t *testing.T) {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, nil
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base:      base,
	})
	var err error
	require.NotPanics(t, func() { _, err = tr.RoundTrip(chatRequest(t, 1)) })
	require.ErrorContains(t, err, "nil response")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestMalformedLoadReportIsCounted: an endpoint-load-metrics header with
// nothing readable in it (here, a huge one) changes no telemetry and is
// counted as a dropped sample, as malformed telemetry is elsewhere.
func TestMalformedLoadReportIsCounted(t *testing.T) {
	h := http.Header{}
	h.Set("Endpoint-Load-Metrics", "TEXT "+strings.Repeat("named_metrics.kv_cache_usage_perc=garbage,", 10000))
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}},
		Base:      cannedResponse(h, "{}"),
	})
	resp, err := tr.RoundTrip(chatRequest(t, 1))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	st := tr.Balancer().Telemetry().Stats()
	assert.EqualValues(t, 1, st.DroppedEmpty, "%+v", st)
	assert.Zero(t, st.Accepted)
	assert.Equal(t, 1, int(statsByID(tr.Balancer())["a"].Successes), "a bad report is not the call's failure")
}

// TestMalformedRequestBlamesNoEndpoint: a request net/http refuses to send
// (a header value with a line break, as a gateway copying a client's input
// into a header makes, or a header name that is not a token) fails the
// call without counting against any endpoint and without a failover: it
// used to fail twice per call, once per endpoint tried, so a client
// sending a few dozen of them opened healthy endpoints' breakers.
func TestMalformedRequestBlamesNoEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a, b)})
	client := &http.Client{Transport: tr}
	for i := range 40 {
		req := chatRequest(t, i)
		if i%2 == 0 {
			req.Header.Set("X-User", "evil\r\nInjected: 1")
		} else {
			req.Header["X User"] = []string{"x"}
		}
		_, err := client.Do(req)
		require.Error(t, err)
	}
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
		assert.False(t, s.BreakerOpen, id)
		assert.Zero(t, s.InFlight, id)
	}
	assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
	assert.Zero(t, a.hits.Load()+b.hits.Load())
}
