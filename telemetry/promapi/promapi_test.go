package promapi_test

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func fields(s telemetry.Sample) map[string]float64 {
	out := map[string]float64{}
	for f := range telemetry.NumFields {
		if v, ok := s.Get(telemetry.Field(f)); ok {
			out[telemetry.Field(f).String()] = v
		}
	}
	return out
}

// fakeProm answers /api/v1/query with status and body and records the query.
func fakeProm(t *testing.T, status int, body string, gotQuery *string) *promapi.Source {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/prefix/api/v1/query", r.URL.Path)
		assert.Equal(t, http.MethodPost, r.Method)
		b, _ := io.ReadAll(r.Body)
		form, err := url.ParseQuery(string(b))
		assert.NoError(t, err)
		if gotQuery != nil {
			*gotQuery = form.Get("query")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	tr := &http.Transport{}
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	return &promapi.Source{URL: srv.URL + "/prefix/", Client: &http.Client{Transport: tr}}
}

func TestQueryCombinesFieldsInOneExpression(t *testing.T) {
	s := &promapi.Source{Queries: map[telemetry.Field]string{
		telemetry.KVCacheUsage: `max by (instance) (vllm:kv_cache_usage_perc)`,
		telemetry.Waiting:      `sum by (instance) (vllm:num_requests_waiting)`,
	}}
	assert.Equal(t,
		`label_replace((sum by (instance) (vllm:num_requests_waiting)), "inferlb_field", "waiting", "", "") or `+
			`label_replace((max by (instance) (vllm:kv_cache_usage_perc)), "inferlb_field", "kv_cache_usage", "", "")`,
		s.Query())
}

const okBody = `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"10.0.0.1:8000","inferlb_field":"waiting"},"value":[1767225600.5,"3"]},
 {"metric":{"instance":"10.0.0.1:8000","inferlb_field":"kv_cache_usage"},"value":[1767225600.5,"0.95"]},
 {"metric":{"instance":"10.0.0.2:8000","inferlb_field":"waiting"},"value":[1767225600.5,"0"]},
 {"metric":{"instance":"10.0.0.2:8000","job":"b","inferlb_field":"waiting"},"value":[1767225600.5,"2"]}
]}}`

func TestCollect(t *testing.T) {
	var q string
	src := fakeProm(t, 200, okBody, &q)
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	assert.Equal(t, src.Query(), q, "one request carries every field")
	eval := time.Unix(1767225600, 5e8)
	require.Len(t, obs, 2)
	assert.Equal(t, "10.0.0.1:8000", obs[0].EndpointID)
	assert.True(t, obs[0].Sample.Time.Equal(eval), "stamped with the evaluation time")
	assert.Equal(t, map[string]float64{"waiting": 3, "kv_cache_usage": 0.95}, fields(obs[0].Sample))
	assert.Equal(t, map[string]float64{"waiting": 2}, fields(obs[1].Sample), "duplicates: the largest wins")
}

func TestCollectEndpointIDFilter(t *testing.T) {
	src := fakeProm(t, 200, okBody, nil)
	src.EndpointID = func(v string) (string, bool) { return "ep-" + v, v == "10.0.0.2:8000" }
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 1)
	assert.Equal(t, "ep-10.0.0.2:8000", obs[0].EndpointID)
}

func TestCollectSkipsBadSeries(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"NaN"]},
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,"+Inf"]},
 {"metric":{"instance":"a","inferlb_field":"kv_cache_usage"},"value":[1767225600,"95"]},
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"-1"]},
 {"metric":{"inferlb_field":"waiting"},"value":[1767225600,"1"]},
 {"metric":{"instance":"a","inferlb_field":"bogus"},"value":[1767225600,"1"]},
 {"metric":{"instance":"a","inferlb_field":"running"},"value":["x","1"]},
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,2]},
 {"metric":{"instance":"b","inferlb_field":"running"},"value":[1767225600,"4"]}
]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "promapi: 8 series skipped; first: waiting for a: value NaN")
	require.Len(t, obs, 1)
	assert.Equal(t, "b", obs[0].EndpointID)
	assert.Equal(t, map[string]float64{"running": 4}, fields(obs[0].Sample))
}

// An endpoint with several series for a field (a query without an
// aggregation: one per data-parallel engine) takes the largest; when one of
// them is bad it gives none, as the largest of the rest may understate it.
// Its other fields, and the other endpoints, stand; an endpoint left with
// no field has no observation.
func TestCollectWithholdsAFieldOneOfWhoseSeriesIsBad(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","engine":"0","inferlb_field":"waiting"},"value":[1767225600,"3"]},
 {"metric":{"instance":"a","engine":"1","inferlb_field":"waiting"},"value":[1767225600,"NaN"]},
 {"metric":{"instance":"a","inferlb_field":"kv_cache_usage"},"value":[1767225600,"0.5"]},
 {"metric":{"instance":"b","engine":"0","inferlb_field":"waiting"},"value":[1767225600,"2"]},
 {"metric":{"instance":"b","engine":"1","inferlb_field":"waiting"},"value":[1767225600,"5"]},
 {"metric":{"instance":"c","engine":"0","inferlb_field":"waiting"},"value":[1767225600,"-4"]},
 {"metric":{"instance":"c","engine":"1","inferlb_field":"waiting"},"value":[1767225600,"1"]}
]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	got := map[string]map[string]float64{}
	for _, o := range obs {
		got[o.EndpointID] = fields(o.Sample)
	}
	assert.Equal(t, map[string]map[string]float64{
		"a": {"kv_cache_usage": 0.5},
		"b": {"waiting": 5},
	}, got)
}

// Prometheus (and Thanos or Mimir answering in part) may say "success"
// with warnings: the series that came are used, and the round is partial.
func TestCollectWarningsMakeAPartialResult(t *testing.T) {
	body := `{"status":"success","warnings":["remote read: store unavailable, partial response"],
"data":{"resultType":"vector","result":[{"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"3"]}]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "store unavailable")
	require.Len(t, obs, 1)
	assert.Equal(t, map[string]float64{"waiting": 3}, fields(obs[0].Sample))
}

func TestCollectErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"bad promql", 400, `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected <by>"}`,
			"promapi: query failed (HTTP 400, bad_data): 1:5: parse error"},
		{"overloaded", 503, `{"status":"error","errorType":"unavailable","error":"too many queries"}`,
			"promapi: query failed (HTTP 503, unavailable): too many queries"},
		{"error with null data", 422, `{"status":"error","errorType":"execution","error":"too many samples","data":null}`,
			"promapi: query failed (HTTP 422, execution): too many samples"},
		{"proxy error page", 502, `<html>bad gateway</html>`, "promapi: query: HTTP 502"},
		{"not json", 200, `hello`, "promapi: decoding response"},
		{"truncated json", 200, `{"status":"success","data":{"resultType":"vector","result":[`, "promapi: decoding response"},
		{"odd status", 200, `{"status":"pending"}`, `promapi: response status "pending"`},
		{"matrix", 200, `{"status":"success","data":{"resultType":"matrix","result":[]}}`, `promapi: query returned a "matrix"`},
		{"bad data", 200, `{"status":"success","data":{"resultType":"vector","result":{}}}`, "promapi: decoding query data"},
		// An object key that is not a string is no JSON.
		{"number as key", 200, `{"status":"success",7:{}}`, "promapi: decoding response"},
		{"number as key in data", 200, `{"status":"success","data":{"resultType":"vector",7:[]}}`, "promapi: decoding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := fakeProm(t, tt.status, tt.body, nil)
			obs, err := src.Collect(t.Context())
			require.Error(t, err)
			assert.NotErrorIs(t, err, telemetry.ErrPartial)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "POST "+src.URL+"api/v1/query", "where the answer came from")
			assert.Empty(t, obs)
		})
	}
}

// A Source.URL that is not Prometheus' (a Grafana, a login page, an
// ingress's default backend) answers a web page. The error said
// "promapi: decoding response: invalid character '<' looking for beginning
// of value", naming neither the URL nor what came back. It names both,
// the URL without its password.
func TestCollectErrorNamesTheURLAndAWebPagesContentType(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><html><title>Grafana</title></html>")
	}))
	tr := &http.Transport{}
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	u := strings.Replace(srv.URL, "http://", "http://reader:s3cr3t@", 1)
	_, err := (&promapi.Source{URL: u, Client: &http.Client{Transport: tr}}).Collect(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "promapi: decoding response")
	assert.Contains(t, err.Error(), "POST http://reader:xxxxx@"+strings.TrimPrefix(srv.URL, "http://")+"/api/v1/query")
	assert.Contains(t, err.Error(), `answered Content-Type "text/html; charset=utf-8", not Prometheus' application/json`)
	assert.NotContains(t, err.Error(), "s3cr3t")
}

// The combined query is an `or` of the fields' queries, and while no
// server is scraped yet (a fleet starting, a new Prometheus) every one is
// empty. Prometheus 2.0 answered such an `or` with "result": null, and
// frontends still answer some empty results so (Google's managed
// Prometheus frontend an aggregation over nothing). That is no series,
// not an error: a
// failed round would count a failure and back the Poller off, so it would
// notice the fleet's first readings up to a minute late.
func TestCollectNullResultIsEmpty(t *testing.T) {
	obs, err := fakeProm(t, 200, `{"status":"success","data":{"resultType":"vector","result":null}}`, nil).Collect(t.Context())
	require.NoError(t, err)
	assert.Empty(t, obs)
}

func TestCollectConfigErrors(t *testing.T) {
	_, err := (&promapi.Source{}).Collect(t.Context())
	assert.ErrorContains(t, err, "promapi: Source.URL is empty")
	_, err = (&promapi.Source{URL: "http://x", Queries: map[telemetry.Field]string{}}).Collect(t.Context())
	assert.ErrorContains(t, err, "promapi: Source.Queries is empty")
	_, err = (&promapi.Source{URL: "http://x", Queries: map[telemetry.Field]string{telemetry.Field(200): "up"}}).Collect(t.Context())
	assert.ErrorContains(t, err, "not a telemetry field")
	_, err = (&promapi.Source{URL: "http://x", Queries: map[telemetry.Field]string{telemetry.Waiting: " "}}).Collect(t.Context())
	assert.ErrorContains(t, err, "promapi: Source.Queries[waiting] is empty")
	_, err = (&promapi.Source{URL: "http://127.0.0.1:1"}).Collect(t.Context())
	assert.ErrorContains(t, err, "promapi: query: ")
	// DefaultQueries keep "instance" only: every series would be skipped.
	_, err = telemetry.NewPoller(&promapi.Source{URL: "http://x", EndpointLabel: "pod"}, &telemetry.Store{}, telemetry.PollerOptions{})
	assert.ErrorContains(t, err, `promapi: Source.EndpointLabel is "pod", but DefaultQueries`)
	assert.NoError(t, (&promapi.Source{URL: "http://x", EndpointLabel: "pod", Queries: map[telemetry.Field]string{telemetry.Waiting: "sum by (pod) (q)"}}).Validate())
	assert.NoError(t, (&promapi.Source{URL: "http://x", EndpointLabel: "instance"}).Validate())
	// Nor do DefaultTimestamps, which the doc offers for custom queries.
	assert.ErrorContains(t, (&promapi.Source{URL: "http://x", EndpointLabel: "pod",
		Queries:    map[telemetry.Field]string{telemetry.Waiting: "sum by (pod) (q)"},
		Timestamps: map[telemetry.Field]string{telemetry.Waiting: promapi.DefaultTimestamps()[telemetry.Waiting]}}).Validate(),
		`promapi: Source.Timestamps[waiting] is DefaultTimestamps', which keeps only "instance", but Source.EndpointLabel is "pod"`)

	// A URL Go cannot parse fails every round: NewPoller says so, naming
	// the field, and neither error quotes the URL's password (url.Parse's
	// own error does, and OnError logs it).
	bad := &promapi.Source{URL: "http://reader:s3cr3t@prometheus:nine"}
	_, err = telemetry.NewPoller(bad, &telemetry.Store{}, telemetry.PollerOptions{})
	require.ErrorContains(t, err, "promapi: Source.URL is not a URL")
	assert.NotContains(t, err.Error(), "s3cr3t")
	_, err = bad.Collect(t.Context())
	require.ErrorContains(t, err, "promapi: Source.URL is not a URL")
	assert.NotContains(t, err.Error(), "s3cr3t")
}

// A URL without a scheme (the host:port of Prometheus' own flags) parses,
// as a scheme "prometheus" with an opaque part: Validate passed it, and
// every round failed with net/http's "unsupported protocol scheme", where
// NewPoller promises to name the field at fault before any round.
func TestValidateRejectsAURLThatIsNotHTTP(t *testing.T) {
	for _, raw := range []string{"prometheus:9090", "localhost:9090", "ftp://prometheus:9090", "http://", "http:///api", "https://reader:s3cr3t@/x"} {
		_, err := telemetry.NewPoller(&promapi.Source{URL: raw}, &telemetry.Store{}, telemetry.PollerOptions{})
		require.ErrorContains(t, err, "promapi: Source.URL", raw)
		assert.NotContains(t, err.Error(), "s3cr3t")
	}
	for _, raw := range []string{"http://prometheus:9090", "HTTPS://prometheus/prefix/", "http://[::1]:9090"} {
		assert.NoError(t, (&promapi.Source{URL: raw}).Validate(), raw)
	}
}

func TestCollectBodyLimit(t *testing.T) {
	src := fakeProm(t, 200, okBody, nil)
	src.MaxBodyBytes = 64
	_, err := src.Collect(t.Context())
	assert.ErrorContains(t, err, "promapi: response larger than 64 bytes")
}

// MaxBodyBytes at math.MaxInt64 (no limit worth having) overflowed the
// reader's limit+1 to a negative count: nothing was read and every round
// failed with "response larger than 9223372036854775807 bytes".
// A URL with a query of its own (a Thanos querier's ?dedup=true) gets the
// API's path before that query, which the server receives: the path was
// appended after it ("?dedup=true/api/v1/query"), so every round asked the
// URL's own path with a broken parameter.
func TestURLWithAQuery(t *testing.T) {
	var path, dedup string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, dedup = r.URL.Path, r.URL.Query().Get("dedup")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, okBody)
	}))
	tr := &http.Transport{}
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	src := &promapi.Source{URL: srv.URL + "/thanos?dedup=true", Client: &http.Client{Transport: tr}}
	require.NoError(t, src.Validate())
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	assert.Len(t, obs, 2)
	assert.Equal(t, "/thanos/api/v1/query", path)
	assert.Equal(t, "true", dedup)
}

func TestCollectLargestBodyLimit(t *testing.T) {
	src := fakeProm(t, 200, okBody, nil)
	src.MaxBodyBytes = math.MaxInt64
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	assert.Len(t, obs, 2)
}

// A KVCachePreallocated query (TGI servers, which reserve their KV cache
// and report no usage of it) reads 1; any other value says nothing the
// field means and is skipped and counted, not kept as a "yes" nor dropped
// with nothing said.
func TestCollectKVCachePreallocated(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"kv_cache_preallocated"},"value":[1767225600,"1"]},
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,"4"]},
 {"metric":{"instance":"b","inferlb_field":"kv_cache_preallocated"},"value":[1767225600,"0"]},
 {"metric":{"instance":"b","inferlb_field":"running"},"value":[1767225600,"2"]}
]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "promapi: 1 series skipped; first: kv_cache_preallocated for b: value 0 (out of the field's range)")
	require.Len(t, obs, 2)
	assert.Equal(t, map[string]float64{"running": 4, "kv_cache_preallocated": 1}, fields(obs[0].Sample))
	assert.Equal(t, map[string]float64{"running": 2}, fields(obs[1].Sample))
}
