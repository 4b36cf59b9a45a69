package promapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

// scrapedAt is the scrape the canned answers below read: ten seconds
// before their first evaluation.
var scrapedAt = time.Unix(1767225590, 250e6)

// polledProm answers the default query as Prometheus does between two
// scrapes: the same values, scraped at scrapedAt, under an evaluation time
// one second later on each request.
func polledProm(t *testing.T) *promapi.Source {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		eval := 1767225600 + n.Add(1)
		series := `{"metric":{"instance":"a","inferlb_field":"running"},"value":[EVAL,"7"]},
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[EVAL,"2"]}`
		if strings.Contains(string(b), "timestamp") { // the fix's query asks for the scrape time
			series += `,{"metric":{"instance":"a","inferlb_time":"running"},"value":[EVAL,"1767225590.25"]},
 {"metric":{"instance":"a","inferlb_time":"waiting"},"value":[EVAL,"1767225590.25"]}`
		}
		series = strings.ReplaceAll(series, "EVAL", strconv.FormatInt(eval, 10))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[`+series+`]}}`)
	}))
	tr := &http.Transport{}
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	return &promapi.Source{URL: srv.URL, Client: &http.Client{Transport: tr}}
}

// Polled more often than Prometheus scrapes, the Source read one scrape
// several times and stamped each read with a new evaluation time: a Store
// took every poll for a new reading, and the balancer, which counts the
// calls sent since a reading by its time, forgot them on every poll.
func TestPollsOfOneScrapeAreOneReading(t *testing.T) {
	src := polledProm(t)
	var store telemetry.Store
	store.Clock = fixedClock(time.Unix(1767225610, 0))
	p, err := telemetry.NewPoller(src, &store, telemetry.PollerOptions{Clock: store.Clock})
	require.NoError(t, err)
	var seen []time.Time
	for range 3 {
		require.True(t, p.Poll(t.Context()))
		seen = append(seen, time.Unix(0, store.Slot("a").Observed(telemetry.Running)))
	}
	for i, at := range seen {
		assert.True(t, at.Equal(scrapedAt), "poll %d: running observed at %v, want the scrape's %v", i, at, scrapedAt)
	}
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

// Each field takes the time its own series were scraped: a model server
// and its node's dcgm-exporter, scraped by separate jobs, come as two
// observations of one endpoint, which a Store merges field by field.
func TestCollectStampsEachFieldWithItsScrapeTime(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600.5,"7"]},
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600.5,"2"]},
 {"metric":{"instance":"a","inferlb_field":"gpu_util"},"value":[1767225600.5,"0.4"]},
 {"metric":{"instance":"a","inferlb_time":"running"},"value":[1767225600.5,"1767225590.25"]},
 {"metric":{"instance":"a","inferlb_time":"waiting"},"value":[1767225600.5,"1767225590.25"]},
 {"metric":{"instance":"a","inferlb_time":"gpu_util"},"value":[1767225600.5,"1767225597"]},
 {"metric":{"instance":"b","inferlb_field":"running"},"value":[1767225600.5,"1"]},
 {"metric":{"instance":"b","inferlb_time":"running"},"value":[1767225600.5,"1767225595"]},
 {"metric":{"instance":"b","inferlb_time":"running"},"value":[1767225600.5,"1767225593"]},
 {"metric":{"instance":"c","inferlb_field":"running"},"value":[1767225600.5,"2"]},
 {"metric":{"instance":"c","inferlb_time":"running"},"value":[1767225600.5,"1767229999"]},
 {"metric":{"instance":"d","inferlb_field":"running"},"value":[1767225600.5,"3"]},
 {"metric":{"instance":"e","inferlb_time":"running"},"value":[1767225600.5,"1767225590"]}
]}}`
	var q string
	src := fakeProm(t, 200, body, &q)
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	assert.Contains(t, q, `label_replace((min by (instance) (timestamp(`, "the default query asks for the scrape times")
	eval := time.Unix(1767225600, 500e6)
	type got struct {
		id     string
		at     time.Time
		fields map[string]float64
	}
	var all []got
	for _, o := range obs {
		all = append(all, got{o.EndpointID, o.Sample.Time.UTC(), fields(o.Sample)})
	}
	assert.Equal(t, []got{
		{"a", time.Unix(1767225597, 0).UTC(), map[string]float64{"gpu_util": 0.4}}, // its first field's time stays in place
		{"b", time.Unix(1767225593, 0).UTC(), map[string]float64{"running": 1}},    // the oldest of its series
		{"c", eval.UTC(), map[string]float64{"running": 2}},                        // never later than the evaluation
		{"d", eval.UTC(), map[string]float64{"running": 3}},                        // no time: the evaluation's
		{"a", scrapedAt.UTC(), map[string]float64{"running": 7, "waiting": 2}},     // other times come after
	}, all, "e, with a time and no value, has no observation")

	var store telemetry.Store
	store.Clock = fixedClock(eval)
	for _, o := range obs {
		store.Publish(o.EndpointID, o.Sample)
	}
	slot := store.Slot("a")
	assert.Equal(t, scrapedAt.UnixNano(), slot.Observed(telemetry.Running))
	assert.Equal(t, time.Unix(1767225597, 0).UnixNano(), slot.Observed(telemetry.GPUUtil))
}

func TestCollectSkipsBadTimestamps(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"running"},"value":[1767225600,"7"]},
 {"metric":{"instance":"a","inferlb_time":"running"},"value":[1767225600,"-5"]},
 {"metric":{"instance":"a","inferlb_time":"running"},"value":[1767225600,"NaN"]},
 {"metric":{"instance":"a","inferlb_time":"running"},"value":[1767225600,"1e300"]},
 {"metric":{"instance":"a","inferlb_time":"bogus"},"value":[1767225600,"1767225590"]},
 {"metric":{"instance":"a","inferlb_time":"running","inferlb_field":"running"},"value":[1767225600,"1767225590"]},
 {"metric":{"inferlb_time":"running"},"value":[1767225600,"1767225590"]}
]}}`
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "promapi: 6 series skipped; first: running time for a: value -5 (not a time in Unix seconds)")
	require.Len(t, obs, 1)
	assert.True(t, obs[0].Sample.Time.Equal(time.Unix(1767225600, 0)), "no usable time: the evaluation's")
}

func TestQueryWithTimestamps(t *testing.T) {
	s := &promapi.Source{
		Queries:    map[telemetry.Field]string{telemetry.Waiting: `sum by (instance) (vllm:num_requests_waiting)`},
		Timestamps: map[telemetry.Field]string{telemetry.Waiting: `min by (instance) (timestamp(vllm:num_requests_waiting))`},
	}
	assert.Equal(t,
		`label_replace((sum by (instance) (vllm:num_requests_waiting)), "inferlb_field", "waiting", "", "") or `+
			`label_replace((min by (instance) (timestamp(vllm:num_requests_waiting))), "inferlb_time", "waiting", "", "")`,
		s.Query())
	s.Timestamps = nil
	assert.NotContains(t, s.Query(), "inferlb_time", "Queries of one's own have no timestamps unless given")
	s.Queries = nil
	s.Timestamps = map[telemetry.Field]string{}
	assert.NotContains(t, s.Query(), "inferlb_time", "an empty map turns the default ones off")
	assert.Len(t, promapi.DefaultTimestamps(), len(promapi.DefaultQueries()), "every default field has its time")
}

func TestCollectTimestampsConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  promapi.Source
		want string
	}{
		{"not a field", promapi.Source{Timestamps: map[telemetry.Field]string{telemetry.Field(200): "x"}},
			"promapi: Source.Timestamps has Field(200), which is not a telemetry field"},
		{"empty", promapi.Source{Timestamps: map[telemetry.Field]string{telemetry.Running: " "}},
			"promapi: Source.Timestamps[running] is empty"},
		{"no query", promapi.Source{
			Queries:    map[telemetry.Field]string{telemetry.Running: "up"},
			Timestamps: map[telemetry.Field]string{telemetry.Waiting: "timestamp(up)", telemetry.Running: "timestamp(up)"}},
			"promapi: Source.Timestamps[waiting] stamps a field with no query in Source.Queries"},
		{"no default query", promapi.Source{Timestamps: map[telemetry.Field]string{telemetry.GPUTemp: "timestamp(up)"}},
			"promapi: Source.Timestamps[gpu_temp_c] stamps a field with no query in Source.Queries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.src.URL = "http://127.0.0.1:1" // never reached
			_, err := tc.src.Collect(t.Context())
			assert.EqualError(t, err, tc.want)
		})
	}
}
