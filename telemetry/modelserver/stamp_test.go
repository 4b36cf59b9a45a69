package modelserver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// A Prometheus /federate endpoint (or a caching sidecar) serves what it
// scraped earlier, each sample with the time it was scraped. Read as fresh,
// a reading minutes old looked current.
const federated = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{instance="10.0.0.5:8000",model_name="m"} 3 1767225590250
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{instance="10.0.0.5:8000",model_name="m"} 7 1767225590250
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{instance="10.0.0.5:8000",model_name="m"} 0.5 1767225588000
`

func TestSourceStampsTheExpositionsOwnTime(t *testing.T) {
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "a", URL: serve(t, 200, federated)})}
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 1)
	assert.Equal(t, map[string]float64{"running": 3, "waiting": 7, "kv_cache_usage": 0.5}, fields(obs[0].Sample))
	assert.True(t, obs[0].Sample.Time.Equal(time.UnixMilli(1767225588000)),
		"the oldest of the samples' times, got %v", obs[0].Sample.Time)
}

// Polled, an exposition's time ahead of the Poller's clock is read as its
// now; one with a sample without a time is stamped as any other.
func TestPolledExpositionTimeIsBounded(t *testing.T) {
	now := time.UnixMilli(1767225589000) // before the samples' times
	clock := clockAt(now)
	mixed := federated + "vllm:num_requests_running{instance=\"10.0.0.6:8000\",model_name=\"m\"} 1\n"
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "ahead", URL: serve(t, 200, strings.ReplaceAll(federated, "1767225588000", "1767225599000"))},
		modelserver.Target{EndpointID: "mixed", URL: serve(t, 200, mixed)},
	)}
	obs, err := src.Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, obs, 2)
	assert.True(t, obs[0].Sample.Time.Equal(time.UnixMilli(1767225590250)), "its own time, got %v", obs[0].Sample.Time)
	assert.True(t, obs[1].Sample.Time.IsZero(), "a sample without a time: the Poller's, as before")

	store := &telemetry.Store{Clock: clock}
	p, err := telemetry.NewPoller(src, store, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	for _, id := range []string{"ahead", "mixed"} {
		s, ok := store.Latest(id, now, 0)
		require.True(t, ok, id)
		assert.True(t, s.Time.Equal(now), "%s: never later than the poll, got %v", id, s.Time)
	}
}

// A federated copy older than the Store's maximum age is stale when it
// arrives: the Store keeps it (it is the newest it has) and readers leave
// it out; one older than what the Store holds is dropped and counted.
func TestSourceOldExpositionIsStale(t *testing.T) {
	clock := clockAt(time.UnixMilli(1767225590250).Add(time.Hour))
	store := &telemetry.Store{Clock: clock}
	src := &modelserver.Source{Client: client(t), Targets: modelserver.Static(
		modelserver.Target{EndpointID: "a", URL: serve(t, 200, federated)})}
	p, err := telemetry.NewPoller(src, store, telemetry.PollerOptions{Clock: clock})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	_, fresh := store.Latest("a", clock.Now(), 30*time.Second)
	assert.False(t, fresh, "an hour-old reading is stale")
	old, ok := store.Latest("a", clock.Now(), 0)
	require.True(t, ok)
	assert.True(t, old.Time.Equal(time.UnixMilli(1767225588000)))

	s := telemetry.Sample{Time: clock.Now().Add(-time.Second)}
	s.Set(telemetry.Running, 4)
	s.Set(telemetry.Waiting, 1)
	s.Set(telemetry.KVCacheUsage, 0.2)
	store.Publish("a", s)
	require.True(t, p.Poll(t.Context()))
	got, fresh := store.Latest("a", clock.Now(), 30*time.Second)
	assert.True(t, fresh)
	assert.Equal(t, map[string]float64{"running": 4, "waiting": 1, "kv_cache_usage": 0.2}, fields(got), "the old copy does not replace a fresh reading")
	assert.Equal(t, uint64(1), store.Stats().DroppedOld)
}

func clockAt(t time.Time) *testutil.Clock {
	c := testutil.NewClock()
	c.Set(t)
	return c
}
