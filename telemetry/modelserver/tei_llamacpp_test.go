package modelserver_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// The TEI and llama.cpp fixtures are composed from the servers' sources
// (testdata/README.md), not recorded: each must at least be an exposition a
// Prometheus server would scrape without complaint.
func TestTEIAndLlamaCppFixturesAreValidExpositions(t *testing.T) {
	for _, file := range []string{"tei.txt", "llamacpp-kv-cache-ratio.txt", "llamacpp.txt"} {
		p := expfmt.NewTextParser(model.UTF8Validation)
		_, err := p.TextToMetricFamilies(bytes.NewReader(readFile(t, file)))
		require.NoError(t, err, file)
	}
}

func TestTEIAndLlamaCppEngines(t *testing.T) {
	assert.Equal(t, "tei", modelserver.TEI.String())
	assert.Equal(t, "llama.cpp", modelserver.LlamaCpp.String())
	// Added after Triton: the values of the older engines do not move.
	assert.Equal(t, modelserver.Triton+1, modelserver.TEI)
	assert.Equal(t, modelserver.TEI+1, modelserver.LlamaCpp)

	// The error for an exposition of no known engine names them.
	_, err := modelserver.Parse(strings.NewReader("process_cpu_seconds_total 12\n"))
	require.ErrorIs(t, err, modelserver.ErrUnknownEngine)
	assert.Contains(t, err.Error(), "TEI")
	assert.Contains(t, err.Error(), "llama.cpp")
}

func TestParseTEIAndLlamaCppInline(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		engine  modelserver.Engine
		want    map[string]float64
		partial bool
		err     string // a non-partial error containing this
	}{
		{
			// A collector that rewrites the namespace colon.
			name:   "llama.cpp, underscore namespace",
			in:     "llamacpp_requests_processing 1\nllamacpp_requests_deferred 2\n",
			engine: modelserver.LlamaCpp,
			want:   map[string]float64{"running": 1, "waiting": 2, "kv_cache_preallocated": 1},
		},
		{
			name: "llama.cpp, a NaN queue is dropped and counted, the rest kept",
			in: "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 3\n" +
				"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred NaN\n",
			engine:  modelserver.LlamaCpp,
			want:    map[string]float64{"running": 3, "kv_cache_preallocated": 1},
			partial: true,
		},
		{
			name:    "llama.cpp, a KV usage above 1 is a unit mistake, dropped and counted",
			in:      "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\nllamacpp:kv_cache_usage_ratio 63.7\n",
			engine:  modelserver.LlamaCpp,
			want:    map[string]float64{"running": 1, "waiting": 0, "kv_cache_preallocated": 1},
			partial: true,
		},
		{
			name:    "llama.cpp, a negative count is dropped and counted",
			in:      "llamacpp:requests_processing -1\nllamacpp:requests_deferred 4\n",
			engine:  modelserver.LlamaCpp,
			want:    map[string]float64{"waiting": 4, "kv_cache_preallocated": 1},
			partial: true,
		},
		{
			// Only throughput counters: nothing to route on, and the mark
			// alone is no reading.
			name:   "llama.cpp without its load gauges",
			in:     "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 91877\n",
			engine: modelserver.LlamaCpp,
			err:    "modelserver: llama.cpp exposition has none of the load metrics",
		},
		{
			// An average over the scrape window, not a count of requests:
			// not read as Running.
			name:   "llama.cpp's busy slots per decode is not a running count",
			in:     "llamacpp:n_busy_slots_per_decode 3.5\n",
			engine: modelserver.LlamaCpp,
			err:    "modelserver: llama.cpp exposition has none of the load metrics",
		},
		{
			name:   "TEI, every value malformed",
			in:     "# TYPE te_queue_size gauge\nte_queue_size NaN\n",
			engine: modelserver.TEI,
			err:    "modelserver: tei exposition: no load value usable: 1 values dropped (out of range or duplicate) (waiting=NaN)",
		},
		{
			name:    "TEI, a repeated queue series counts once",
			in:      "te_queue_size 7\nte_queue_size 7\n",
			engine:  modelserver.TEI,
			want:    map[string]float64{"waiting": 7},
			partial: true,
		},
		{
			// Counters and histograms only (a server that has queued
			// nothing since it started has not created the gauge yet).
			name:   "TEI without its queue gauge",
			in:     "# TYPE te_request_count counter\nte_request_count{method=\"single\"} 3\n",
			engine: modelserver.TEI,
			err:    "modelserver: tei exposition has none of the load metrics",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := modelserver.Parse(strings.NewReader(tt.in))
			partial := ""
			if tt.partial {
				partial = "1 values dropped"
			}
			checkParse(t, res, err, tt.engine, tt.err, partial, tt.want)
		})
	}
}

// llama-server allocates its whole KV cache (--ctx-size cells) when it
// creates its context, and its newer builds report no usage of it: its GPU
// memory is its configuration, and must not price it. TEI keeps no KV cache
// and is not marked: its memory, read beside it from DCGM, stays load.
func TestParseMarksLlamaCppAsPreallocating(t *testing.T) {
	res, err := modelserver.Parse(bytes.NewReader(readFile(t, "llamacpp.txt")))
	require.NoError(t, err)
	assert.True(t, res.Sample.Has.Has(telemetry.KVCachePreallocated))
	s := res.Sample
	s.Set(telemetry.GPUMemUsed, 23e9)
	s.Set(telemetry.GPUMemTotal, 24e9)
	_, ok := s.MemoryPressure()
	assert.False(t, ok, "llama.cpp priced by the KV cache it allocated at start")

	res, err = modelserver.Parse(bytes.NewReader(readFile(t, "tei.txt")))
	require.NoError(t, err)
	assert.False(t, res.Sample.Has.Has(telemetry.KVCachePreallocated))
	s = res.Sample
	s.Set(telemetry.GPUMemUsed, 23e9)
	s.Set(telemetry.GPUMemTotal, 24e9)
	u, ok := s.MemoryPressure()
	assert.True(t, ok)
	assert.InDelta(t, 23.0/24, u, 1e-12)
}
