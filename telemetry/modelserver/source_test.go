package modelserver_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve starts a server that answers every request with status and body,
// closed at the end of the test.
func serve(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Contains(t, r.Header.Get("Accept"), "text/plain")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func client(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestSourceCollect(t *testing.T) {
	good := serve(t, 200, string(readFile(t, "vllm-v1-two-engines.txt")))
	partial := serve(t, 200, string(readFile(t, "triton-merged-truncated.txt")))
	down := serve(t, 503, "overloaded")
	notMetrics := serve(t, 200, "<html>hello</html>")
	huge := serve(t, 200, "vllm:num_requests_running 1\n"+strings.Repeat("# padding\n", 500))

	src := &modelserver.Source{
		Client:       client(t),
		MaxBodyBytes: 4096,
		Parallelism:  2,
		Targets: modelserver.Static(
			modelserver.Target{EndpointID: "good", URL: good},
			modelserver.Target{EndpointID: "partial", URL: partial},
			modelserver.Target{EndpointID: "down", URL: down},
			modelserver.Target{EndpointID: "html", URL: notMetrics},
			modelserver.Target{EndpointID: "huge", URL: huge},
		),
	}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), `modelserver: 3 of 5 targets failed ("down", "html", "huge"), 1 partial ("partial"); first: endpoint "down"`)
	assert.Contains(t, err.Error(), `endpoint "down"`)
	assert.Contains(t, err.Error(), "503")

	got := map[string]map[string]float64{}
	for _, o := range obs {
		assert.True(t, o.Sample.Time.IsZero(), "the poller stamps the time")
		got[o.EndpointID] = fields(o.Sample)
	}
	assert.Equal(t, map[string]map[string]float64{
		"good": {"running": 14, "waiting": 4, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5},
		"partial": {
			"waiting": 5, "gpu_util": 0.5, "gpu_power_w": 250.5,
			"gpu_mem_used_bytes": 77309411328, "gpu_mem_total_bytes": 85899345920,
		},
	}, got)

	// A target whose exposition was only partly readable is reported too,
	// also when every target answered.
	src.Targets = modelserver.Static(
		modelserver.Target{EndpointID: "good", URL: good},
		modelserver.Target{EndpointID: "partial", URL: partial},
	)
	obs, err = src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), `0 of 2 targets failed, 1 partial ("partial"); first: endpoint "partial"`)
	assert.Len(t, obs, 2)
}

// A server listed twice (two spellings of its URL, or two endpoints that
// share its metrics) is fetched once a round, and each target gets the
// sample; a failure counts for each target it leaves without one.
func TestSourceScrapesEachURLOnce(t *testing.T) {
	var hits atomic.Int32
	body := readFile(t, "vllm-v1-two-engines.txt")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	down := serve(t, 503, "overloaded")
	src := &modelserver.Source{
		Client: client(t),
		Targets: modelserver.Static(
			modelserver.Target{EndpointID: "a", URL: srv.URL + "/metrics"},
			modelserver.Target{EndpointID: "b", URL: strings.Replace(srv.URL, "http://", "HTTP://", 1) + "/metrics#x"},
			modelserver.Target{EndpointID: "c", URL: down},
			modelserver.Target{EndpointID: "d", URL: down},
		),
	}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), `2 of 4 targets failed ("c", "d"), 0 partial; first: endpoint "c"`)
	assert.EqualValues(t, 1, hits.Load(), "one fetch for both spellings")
	require.Len(t, obs, 2)
	assert.Equal(t, "a", obs[0].EndpointID)
	assert.Equal(t, "b", obs[1].EndpointID)
	assert.Equal(t, fields(obs[0].Sample), fields(obs[1].Sample))
	assert.NotEmpty(t, fields(obs[1].Sample))
}

func TestSourceAllFail(t *testing.T) {
	src := &modelserver.Source{
		Client: client(t),
		Targets: modelserver.Static(
			modelserver.Target{EndpointID: "a", URL: serve(t, 500, "")},
			modelserver.Target{EndpointID: "b", URL: "http://127.0.0.1:1/metrics"}, // nothing listens on port 1
		),
	}
	obs, err := src.Collect(t.Context())
	require.Error(t, err)
	assert.NotErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "modelserver: all 2 targets failed")
	assert.Empty(t, obs)
}

func TestSourceNoTargets(t *testing.T) {
	obs, err := (&modelserver.Source{}).Collect(t.Context())
	assert.NoError(t, err)
	assert.Empty(t, obs)
}

// TestSourceTargetRemovedMidRound: a round scrapes the list Targets gave at
// its start, so a target removed while it runs is scraped and returned once
// more; the next round does not scrape it.
func TestSourceTargetRemovedMidRound(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	var leaving atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if leaving.Add(1) == 1 {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte("vllm:num_requests_waiting 3\n"))
	}))
	t.Cleanup(srv.Close)
	staying := serve(t, 200, "vllm:num_requests_waiting 1\n")

	var mu sync.Mutex
	targets := []modelserver.Target{{EndpointID: "leaving", URL: srv.URL + "/metrics"}, {EndpointID: "staying", URL: staying}}
	src := &modelserver.Source{Client: client(t), Targets: func() []modelserver.Target {
		mu.Lock()
		defer mu.Unlock()
		return targets
	}}
	ids := func(obs []telemetry.Observation) []string {
		var out []string
		for _, o := range obs {
			out = append(out, o.EndpointID)
		}
		return out
	}

	type result struct {
		obs []telemetry.Observation
		err error
	}
	done := make(chan result)
	go func() {
		obs, err := src.Collect(t.Context())
		done <- result{obs, err}
	}()
	<-arrived
	mu.Lock()
	targets = []modelserver.Target{{EndpointID: "staying", URL: staying}} // a new list: the round holds the old one
	mu.Unlock()
	close(release)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, []string{"leaving", "staying"}, ids(r.obs))

	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"staying"}, ids(obs))
	assert.Equal(t, int64(1), leaving.Load(), "not scraped again")
}

// A server (or a sidecar merging servers' /metrics) that dies while it
// writes a body without a length ends the response with the connection: the
// client sees a clean end of a shorter body. When the cut fell inside the
// last value, "vllm:num_requests_waiting 128.0" arrived as "... 12" and was
// read as a queue of 12: a wrong reading, not a missing one, and taken for
// a good round. The text format ends every line with a line feed, so a last
// line without one is dropped and counted, and the round is partial.
func TestSourceDropsAnUnterminatedLastLine(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if !assert.NoError(t, err) {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n" +
			"vllm:num_requests_running{model_name=\"m\"} 3.0\n" +
			"vllm:num_requests_waiting{model_name=\"m\"} 12") // of 128.0: the connection dies here
		_ = buf.Flush()
	}))
	t.Cleanup(srv.Close)
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(modelserver.Target{EndpointID: "a", URL: srv.URL + "/metrics"})}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "1 lines skipped")
	require.Len(t, obs, 1)
	assert.Equal(t, map[string]float64{"running": 3}, fields(obs[0].Sample), "the cut value is not read")
}

// Validate checks the targets Targets returns when the Poller is built; one
// it returns later without an EndpointID must fail alone, as Validate's
// doc says, and be reported. It was scraped, and its sample, which names
// no endpoint, went to the Poller, which skipped it without a word:
// telemetry missing for a server, and nothing in OnError's log to say why.
func TestSourceTargetWithoutEndpointIDFailsAlone(t *testing.T) {
	var scrapes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scrapes.Add(1)
		_, _ = w.Write(readFile(t, "vllm-v1-two-engines.txt"))
	}))
	t.Cleanup(srv.Close)
	alone := strings.Replace(srv.URL, "http://", "http://scraper:s3cr3t@", 1) + "/metrics"

	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "a", URL: srv.URL + "/metrics"},
		modelserver.Target{URL: alone},
	)}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "1 of 2 targets failed")
	assert.Contains(t, err.Error(), "target 1")
	assert.Contains(t, err.Error(), "EndpointID is empty")
	assert.NotContains(t, err.Error(), "s3cr3t")
	require.Len(t, obs, 1)
	assert.Equal(t, "a", obs[0].EndpointID)
	assert.Equal(t, int32(1), scrapes.Load(), "a target without an ID is not scraped")

	src.Targets = modelserver.Static(modelserver.Target{URL: alone})
	obs, err = src.Collect(t.Context())
	require.ErrorContains(t, err, "EndpointID is empty")
	assert.NotErrorIs(t, err, telemetry.ErrPartial, "nothing usable: the round failed")
	assert.Empty(t, obs)
}

// vLLM answers OpenMetrics to a scraper that asks for it, or from behind a
// proxy that does. Cut short at a line boundary (a connection closed
// mid-body without a length, a proxy's size limit), such a body has no
// unfinished line to betray it, only a missing "# EOF": it was read as the
// text format, and a replica cut before its num_requests_waiting and
// kv_cache_usage_perc lines was published with 14 running and nothing
// queued, as a whole reading. Served as OpenMetrics, it is now a failed
// scrape: counted, none of it read, the other targets unaffected. The text
// format has no end marker, so the same bytes served as text are read.
func TestSourceRejectsOpenMetricsCutShort(t *testing.T) {
	whole := readFile(t, "vllm-v1-two-engines-openmetrics.txt")
	i := bytes.Index(whole, []byte("# HELP vllm:num_requests_waiting"))
	require.Positive(t, i)
	cut := whole[:i]
	serveAs := func(contentType string, body []byte) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contentType)
			_, _ = w.Write(body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/metrics"
	}
	const openMetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8"
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "cut", URL: serveAs(openMetrics, cut)},
		modelserver.Target{EndpointID: "whole", URL: serveAs(openMetrics, whole)},
	)}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "1 of 2 targets failed")
	assert.Contains(t, err.Error(), `endpoint "cut"`)
	assert.Contains(t, err.Error(), "# EOF")
	require.Len(t, obs, 1)
	assert.Equal(t, "whole", obs[0].EndpointID)
	assert.Equal(t, map[string]float64{"running": 14, "waiting": 4, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5}, fields(obs[0].Sample))

	src.Targets = modelserver.Static(modelserver.Target{EndpointID: "cut", URL: serveAs(openMetrics, cut)})
	obs, err = src.Collect(t.Context())
	require.ErrorContains(t, err, "all 1 targets failed")
	assert.Empty(t, obs)

	src.Targets = modelserver.Static(modelserver.Target{EndpointID: "text", URL: serveAs("text/plain; version=0.0.4", cut)})
	obs, err = src.Collect(t.Context())
	require.NoError(t, err, "a text exposition has no end to miss")
	require.Len(t, obs, 1)
	assert.Equal(t, map[string]float64{"running": 14}, fields(obs[0].Sample))
}

// A round's error goes to OnError's log, and read "telemetry: partial
// result: modelserver: 1 of 3 targets failed, 1 partial; first: endpoint
// "a": modelserver: scrape: ..." and, for a target read in part,
// "...; first: endpoint "b": telemetry: partial result: modelserver: vllm
// exposition ...": each prefix twice. A target's error no longer repeats
// them, and errors.Is still finds ErrPartial through it.
func TestCollectErrorSaysEachPrefixOnce(t *testing.T) {
	good := "vllm:num_requests_waiting 1\n"
	cut := "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_us"
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "good", URL: serve(t, http.StatusOK, good)},
		modelserver.Target{EndpointID: "cut", URL: serve(t, http.StatusOK, cut)},
	)}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Len(t, obs, 2)
	assert.Equal(t, 1, strings.Count(err.Error(), "modelserver: "), err.Error())
	assert.Equal(t, 1, strings.Count(err.Error(), "partial result"), err.Error())
	assert.Contains(t, err.Error(), `first: endpoint "cut": vllm exposition partly read`)

	src.Targets = modelserver.Static(
		modelserver.Target{EndpointID: "good", URL: serve(t, http.StatusOK, good)},
		modelserver.Target{EndpointID: "down", URL: serve(t, http.StatusInternalServerError, "")},
	)
	_, err = src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Equal(t, 1, strings.Count(err.Error(), "modelserver: "), err.Error())
	assert.Contains(t, err.Error(), `first: endpoint "down": scrape: GET `)
}
