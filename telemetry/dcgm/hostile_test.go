package dcgm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// A target that is not a dcgm-exporter (a wrong URL, a node exporter, a
// kube-state-metrics on a big cluster) answers with up to MaxBodyBytes of
// series this package does not read. Parsing them all into metric objects
// cost 25 times the body: a few such targets scraped in parallel took
// gigabytes. The cost must follow the body, not the series in it.
func TestParseCostFollowsTheBodyNotItsSeries(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(page("node-a", 100))
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "kube_pod_info{namespace=\"ns\",pod=\"pod-%d\",node=\"node-a\"} 1\n", i)
	}
	var gpus []dcgm.GPU
	var err error
	n := testutil.Allocated(func() { gpus, err = dcgm.ParseMetrics(bytes.NewReader(b.Bytes())) })
	require.NoError(t, err)
	require.Len(t, gpus, 1)
	t.Logf("%d MiB allocated for a %d MiB body", n>>20, b.Len()>>20)
	assert.Less(t, n, 6*uint64(b.Len()))
}

// Series of the metrics this package reads are bounded too: past
// promtext's limit they are dropped and counted, and the GPUs read so far
// come back as a partial result.
func TestParseBoundsTheSeriesItReads(t *testing.T) {
	var b bytes.Buffer
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_TEMP{gpu=\"%d\",UUID=\"GPU-%d\",Hostname=\"node-a\"} 50\n", i, i)
	}
	var gpus []dcgm.GPU
	var err error
	n := testutil.Allocated(func() { gpus, err = dcgm.ParseMetrics(bytes.NewReader(b.Bytes())) })
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.NotEmpty(t, gpus)
	assert.Len(t, gpus, promtext.MaxSamples)
	t.Logf("%d GPUs, %d MiB allocated for a %d MiB body: %v", len(gpus), n>>20, b.Len()>>20, err)
	assert.Less(t, n, 4*uint64(b.Len())+32<<20, "the body's copies and at most MaxSamples series")
}
