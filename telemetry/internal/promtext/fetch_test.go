package promtext_test

import (
	"bytes"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
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

// An OpenMetrics exposition ends with "# EOF". Served as OpenMetrics and cut
// short at a line boundary (a connection closed mid-body without a length,
// a proxy's size limit), a body has no unfinished line to betray it: Fetch
// returned it, Parse read it as the text format, and a vLLM exposition cut
// before its num_requests_waiting lines read as a server with no queue.
// Such a body is an error; the same bytes under the text format's type, or
// under none, are not (the text format has no end marker), and a whole
// OpenMetrics body is returned as served.
func TestFetchRejectsOpenMetricsWithoutEOF(t *testing.T) {
	whole, err := os.ReadFile("testdata/vllm-v1-two-engines-openmetrics.txt")
	require.NoError(t, err)
	i := bytes.Index(whole, []byte("# HELP vllm:num_requests_waiting"))
	require.Positive(t, i)
	cut := whole[:i] // ends with a line feed: no line is left unfinished

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := whole
		if r.URL.Query().Get("cut") != "" {
			body = cut
		}
		if ct := r.URL.Query().Get("ct"); ct != "none" {
			w.Header().Set("Content-Type", ct)
		} else {
			w.Header()["Content-Type"] = nil // no sniffing either
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	get := func(ct string, cut bool) ([]byte, error) {
		u := srv.URL + "/metrics?" + url.Values{"ct": {ct}, "cut": {map[bool]string{true: "1"}[cut]}}.Encode()
		return promtext.Fetch(t.Context(), client, u, 0)
	}

	for _, ct := range []string{
		"application/openmetrics-text; version=1.0.0; charset=utf-8",
		"application/openmetrics-text; version=0.0.1",
		"Application/OpenMetrics-Text",
		"application/openmetrics-text; version=1.0.0;", // a stray semicolon
	} {
		body, err := get(ct, true)
		require.ErrorIs(t, err, promtext.ErrNoEOF, "Content-Type %q", ct)
		assert.Nil(t, body)
		assert.Contains(t, err.Error(), "/metrics")
		assert.Contains(t, err.Error(), "Content-Type")

		body, err = get(ct, false)
		require.NoError(t, err, "Content-Type %q", ct)
		assert.Equal(t, whole, body)
	}
	for _, ct := range []string{"text/plain; version=0.0.4; charset=utf-8", "none"} {
		body, err := get(ct, true)
		require.NoError(t, err, "Content-Type %q", ct)
		assert.Equal(t, cut, body)
	}
}

// A metrics URL that answers with a web page (an ingress's default page, a
// login page behind a redirect, a server's index for a URL without its
// /metrics path) was read as an exposition with no metric in it: the
// Sources said "no ... metrics found", and when the page's last line had no
// line feed, that the body "may be cut short", which points at a truncated
// scrape instead of the wrong page. Fetch fails such a body, saying it is a
// web page and naming the URL, its Content-Type and where a redirect led.
// An exposition, whatever its Content-Type, is returned as served.
func TestFetchRejectsAWebPage(t *testing.T) {
	expo := []byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/nginx":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>"))
		case "/metrics":
			http.Redirect(w, r, "/login?next=/metrics", http.StatusFound)
		case "/login":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte("\n  <html><body>Sign in</body></html>\n"))
		case "/xml":
			w.Header()["Content-Type"] = nil
			_, _ = w.Write([]byte("\ufeff<?xml version=\"1.0\"?><Error>AccessDenied</Error>"))
		default: // an exposition served under a wrong type
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write(expo)
		}
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	for path, want := range map[string][]string{
		"/nginx":   {srv.URL + "/nginx", `"text/html"`},
		"/metrics": {srv.URL + "/metrics", `"text/html; charset=utf-8"`, "redirected to " + srv.URL + "/login?next=/metrics"},
		"/xml":     {srv.URL + "/xml", `Content-Type ""`},
	} {
		body, err := promtext.Fetch(t.Context(), client, srv.URL+path, 0)
		require.ErrorIs(t, err, promtext.ErrMarkup, path)
		assert.Nil(t, body)
		for _, w := range want {
			assert.Contains(t, err.Error(), w, path)
		}
		assert.NotContains(t, err.Error(), "cut short", path)
		if path != "/metrics" {
			assert.NotContains(t, err.Error(), "redirected", path)
		}
	}
	body, err := promtext.Fetch(t.Context(), client, srv.URL+"/expo", 0)
	require.NoError(t, err)
	assert.Equal(t, expo, body)
}
