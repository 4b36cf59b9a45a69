package modelserver_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// A server's /metrics with many series this package does not read (vLLM's
// histograms per LoRA adapter, a sidecar's own, a wrong URL) costs about
// its body, not a metric object per series.
func TestParseCostFollowsTheBodyNotItsSeries(t *testing.T) {
	var b bytes.Buffer
	b.Write(readFile(t, "vllm-v1-two-engines.txt"))
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "vllm:e2e_request_latency_seconds_bucket{le=\"%d\",model_name=\"lora-%d\"} 1\n", i%30, i)
	}
	var res modelserver.Result
	var err error
	n := testutil.Allocated(func() { res, err = modelserver.Parse(bytes.NewReader(b.Bytes())) })
	require.NoError(t, err)
	assert.Equal(t, modelserver.VLLM, res.Engine)
	assert.Equal(t, map[string]float64{"running": 14, "waiting": 4, "kv_cache_usage": 0.87, "prefix_cache_hit_rate": 0.5}, fields(res.Sample))
	t.Logf("%d MiB allocated for a %d MiB body", n>>20, b.Len()>>20)
	assert.Less(t, n, 6*uint64(b.Len()))
}

// Series of a metric this package reads are bounded too: past the limit
// they are dropped, counted, and the result is partial.
func TestParseBoundsTheSeriesItReads(t *testing.T) {
	var b bytes.Buffer
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"%d\"} 1\n", i)
	}
	var res modelserver.Result
	var err error
	n := testutil.Allocated(func() { res, err = modelserver.Parse(bytes.NewReader(b.Bytes())) })
	require.ErrorIs(t, err, telemetry.ErrPartial)
	w, ok := res.Sample.Get(telemetry.Waiting)
	assert.True(t, ok)
	t.Logf("waiting %v, %d MiB allocated for a %d MiB body: %v", w, n>>20, b.Len()>>20, err)
	assert.Less(t, n, 4*uint64(b.Len())+32<<20, "the body's copies and a bounded number of series")
}

// The engine is told from any metric of its namespace, not only from the
// ones this package reads.
func TestParseDetectsTheEngineFromMetricsItDoesNotRead(t *testing.T) {
	res, err := modelserver.Parse(bytes.NewReader([]byte("# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 5\n")))
	assert.Equal(t, modelserver.VLLM, res.Engine)
	require.Error(t, err)
	assert.NotErrorIs(t, err, modelserver.ErrUnknownEngine)
	assert.ErrorContains(t, err, "none of the load metrics")
}
