package dcgm_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// A Prometheus /federate endpoint (or a caching sidecar) serves what it
// scraped earlier, each sample with the time it was scraped: an endpoint
// whose GPUs' values all carry one takes the oldest, not the fetch's time.
const federatedGPUs = `DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a-0",Hostname="node-a"} 900 1767225590250
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a-0",Hostname="node-a"} 100 1767225590250
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-a-1",Hostname="node-a"} 40 1767225588000
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-b-0",Hostname="node-b"} 500 1767225590250
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-b-0",Hostname="node-b"} 500
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-c-0",Hostname="node-c"} 500 1767225599000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-c-0",Hostname="node-c"} 500 1767225599000
`

func TestSourceStampsTheExpositionsOwnTime(t *testing.T) {
	e := newExporter(t, federatedGPUs, false)
	src := &dcgm.Source{Client: client(t), URLs: []string{e.url},
		Map: dcgm.ByHost(map[string]string{"a": "node-a", "b": "node-b", "c": "node-c"})}
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	at := map[string]time.Time{}
	for _, o := range obs {
		at[o.EndpointID] = o.Sample.Time
	}
	require.Len(t, at, 3)
	assert.True(t, at["a"].Equal(time.UnixMilli(1767225588000)), "the oldest of its GPUs' values: %v", at["a"])
	assert.True(t, at["b"].IsZero(), "a value without a time: the Poller's, as before: %v", at["b"])
	assert.True(t, at["c"].Equal(time.UnixMilli(1767225599000)), "its own time: %v", at["c"])

	// Polled, a time ahead of the Poller's clock is read as its now.
	now := fixedClock(time.UnixMilli(1767225595000))
	store := &telemetry.Store{Clock: now}
	p, err := telemetry.NewPoller(src, store, telemetry.PollerOptions{Clock: now})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	c, ok := store.Latest("c", now.Now(), 0)
	require.True(t, ok)
	assert.True(t, c.Time.Equal(now.Now()), "never later than the poll: %v", c.Time)
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func TestAggregateTimeNeedsEveryGPUsTime(t *testing.T) {
	at := time.UnixMilli(1767225590250)
	gpus := []dcgm.GPU{
		{UUID: "0", Host: "h", UtilPercent: 10, Has: 1 << dcgm.Util, Time: at},
		{UUID: "1", Host: "h", UtilPercent: 20, Has: 1 << dcgm.Util, Time: at.Add(-time.Second)},
		{UUID: "2", Host: "u", UtilPercent: 20, Has: 1 << dcgm.Util, Time: at},
		{UUID: "3", Host: "u", UtilPercent: 30, Has: 1 << dcgm.Util},
		{UUID: "4", Host: "u", UtilPercent: 40, Has: 1 << dcgm.Util, Time: at},
	}
	obs := dcgm.Aggregate(gpus, dcgm.ByHost(map[string]string{"timed": "h", "untimed": "u"}))
	require.Len(t, obs, 2)
	assert.True(t, obs[0].Sample.Time.Equal(at.Add(-time.Second)), "the oldest GPU's: %v", obs[0].Sample.Time)
	assert.True(t, obs[1].Sample.Time.IsZero(), "one GPU without a time: none: %v", obs[1].Sample.Time)
}
