package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTelemetryExample runs the example end to end at a small scale, so a
// change that breaks it fails CI: every call succeeds; with the scraped
// /metrics the sleeping replica gets no call (the Balancer sends a sleeper
// none while an awake endpoint can take it) and the full one few (it wins
// only a draw whose other candidate sleeps); the idle ones take the rest;
// and targets named by host:port have all their samples dropped as
// unknown, which the Poller reports through OnError and the output says.
func TestTelemetryExample(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a second of real time")
	}
	var out strings.Builder
	var mu sync.Mutex
	var reported []error
	cfg := config{calls: 40, workers: 4, onError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err)
	}}
	res, err := run(context.Background(), &out, cfg)
	t.Log("\n" + out.String())
	require.NoError(t, err)

	for _, policy := range []string{"without telemetry", "with /metrics"} {
		var sum int64
		for _, n := range res.calls[policy] {
			sum += n
		}
		assert.Equal(t, int64(cfg.calls), sum, "%s: %v", policy, res.calls[policy])
	}
	with := res.calls["with /metrics"]
	assert.Zero(t, with["vllm-2"], "calls to the sleeping replica: %v", with)
	assert.LessOrEqual(t, with["vllm-1"], int64(cfg.calls/10), "calls to the full replica: %v", with)
	assert.Positive(t, with["vllm-0"], "%v", with)
	assert.Positive(t, with["vllm-3"], "%v", with)

	assert.Equal(t, uint64(4), res.dropped)
	assert.Contains(t, out.String(), "4 of 4 samples dropped as unknown, none used.")
	var ue *telemetry.UnknownEndpointsError
	require.ErrorAs(t, res.unknown, &ue, "the Poller's OnError heard of the unknown IDs")
	assert.Equal(t, 4, ue.Dropped)
	assert.Len(t, ue.IDs, 3)
	for _, id := range ue.IDs {
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, id)
	}
	assert.Equal(t, []string{"vllm-0", "vllm-1", "vllm-2"}, ue.Known)
	assert.Contains(t, out.String(), `(it knows "vllm-0", "vllm-1", "vllm-2", ...); name each target by its endpoint's Endpoint.Key`)
	for _, name := range []string{"vllm-0", "vllm-1", "vllm-2", "vllm-3"} {
		assert.Contains(t, out.String(), name)
	}
	// The scrapes into the live Balancer report nothing: a Poller still
	// running when its Transport closes publishes into a Balancer that
	// knows no endpoint any more, and its OnError blames the targets' names.
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, reported, "errors the Pollers reported")
}

// TestTelemetryExampleStopsPollingBeforeClose runs a batch short enough
// that the Poller's Run is still in its first round when the batch ends:
// the Poller must stop before its Transport closes, or it publishes into a
// closed Balancer, which knows no endpoint, and OnError blames the
// targets' names.
func TestTelemetryExampleStopsPollingBeforeClose(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	cfg := config{calls: 1, workers: 1, onError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err)
	}}
	_, err := run(context.Background(), io.Discard, cfg)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, reported, "errors the Pollers reported")
}
