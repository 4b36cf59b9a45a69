package promtext_test

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Metrics endpoints behind basic auth are scraped with the credentials in
// the URL (http://user:password@host/metrics). Fetch's errors go to
// PollerOptions.OnError, which logs them: they named the URL as given,
// password and all. They must name it as net/http's own errors do, with
// the password redacted.
func TestFetchErrorsRedactThePassword(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write([]byte(strings.Repeat("x", 100)))
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	base := strings.Replace(srv.URL, "http://", "http://scraper:s3cr3t@", 1)

	for _, path := range []string{"/metrics", "/big"} {
		_, err := promtext.Fetch(t.Context(), client, base+path, 10)
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "s3cr3t")
		assert.Contains(t, err.Error(), "scraper:xxxxx@", "the URL is still named")
	}
}

// A URL Go cannot parse (a port that is not a number, a control character)
// fails before any request, and url.Parse's error quotes the URL as given:
// Fetch named it so, password and all. A Targets function may hand a Source
// such a URL at any round (NewPoller validates only the targets of its
// time), and the error goes to OnError's log.
func TestFetchErrorsRedactThePasswordOfAnUnparsableURL(t *testing.T) {
	for _, raw := range []string{
		"http://scraper:s3cr3t@node-1:ninety/metrics",
		"http://scraper:s3cr3t@node-1:9400/met\x7frics",
	} {
		_, err := promtext.Fetch(t.Context(), nil, raw, 0)
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "s3cr3t")
		assert.Contains(t, err.Error(), "xxxxx@node-1", "the URL is still named")
	}
}

// The largest limit is no limit worth having, and a caller that wants
// none sets it (MaxBodyBytes: math.MaxInt64). Fetch read maxBytes+1 bytes
// to tell a body at the limit from one past it, which overflowed to a
// negative count: every body came back empty, with no error, and every
// scrape failed as an exposition without metrics.
func TestFetchLargestLimitReadsTheBody(t *testing.T) {
	const body = "vllm:num_requests_running 3\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	got, err := promtext.Fetch(t.Context(), &http.Client{Transport: tr}, srv.URL, math.MaxInt64)
	require.NoError(t, err)
	assert.Equal(t, body, string(got))
}
