package grpcbalancer

import (
	"errors"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// full is the last report of a replica about to restart: its KV cache
// full, a long queue.
var full = &v3orcapb.OrcaLoadReport{
	ApplicationUtilization: 0.97,
	NamedMetrics:           map[string]float64{"kv_cache_usage": 0.95, "num_requests_waiting": 30},
}

// llmPick picks an LLM call and returns where it went.
func llmPick(h *harness) (string, balancer.PickResult) {
	h.t.Helper()
	return h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat"})
}

// sendReport completes a call on a with report in its trailer.
func sendReport(t *testing.T, h *harness, a string, report *v3orcapb.OrcaLoadReport) {
	t.Helper()
	for range 1000 {
		got, res := llmPick(h)
		di := sent
		if got == a {
			di.ServerLoad = report
		}
		res.Done(di)
		if got == a {
			return
		}
	}
	t.Fatalf("no pick reached %s", a)
}

// A backend that restarts (its SubConn leaves READY, and a new process
// answers the reconnect) is a new, idle process. The last per-call report
// of the old one (KV cache 95%, 30 waiting) priced it as full: it lost
// every comparison, so no call went there to bring a fresh report, and it
// sat idle until the report aged out (telemetryMaxAge, 30 s by default)
// while its peers queued. The reconnect expires what the old process
// reported, as weighted round robin forgets its weights on READY.
func TestReconnectExpiresTheOldProcessReport(t *testing.T) {
	for _, path := range []string{"graceful", "through TRANSIENT_FAILURE"} {
		t.Run(path, func(t *testing.T) {
			clk := testutil.NewClock()
			b := core.New(core.Options{Clock: clk, Rand: testutil.NewRand(3)})
			t.Cleanup(b.Close)
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Gen/": "llm"}}`, 3)
			sendReport(t, h, addr(0), full)
			tel := stats(t, b, addr(0)).Telemetry
			require.True(t, tel.Has.Has(telemetry.KVCacheUsage), "the report was not applied")

			clk.Advance(2 * time.Second) // the restart
			sc := h.subConn(addr(0))
			sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
			if path != "graceful" {
				sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
				sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: errors.New("connection refused")})
			}
			for h.cc.ConnectAll() > 0 {
			}
			require.True(t, stats(t, b, addr(0)).Ready)

			tel = stats(t, b, addr(0)).Telemetry
			for _, f := range []telemetry.Field{telemetry.KVCacheUsage, telemetry.Waiting, telemetry.AppUtil} {
				assert.False(t, tel.Has.Has(f), "%v of the old process still priced the new one", f)
			}
			n := 0
			for range 300 {
				got, res := llmPick(h)
				res.Done(sent)
				if got == addr(0) {
					n++
				}
			}
			assert.Greater(t, n, 10, "the restarted replica took %d of 300 calls", n)

			// The new process's reports count at once.
			clk.Advance(time.Millisecond)
			sendReport(t, h, addr(0), &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_usage": 0.1}})
			tel = stats(t, b, addr(0)).Telemetry
			kv, ok := tel.Get(telemetry.KVCacheUsage)
			assert.True(t, ok)
			assert.Equal(t, 0.1, kv)
		})
	}
}

// The first connection of a channel to an endpoint expires nothing: on a
// shared Balancer, what a Poller (or another channel) published about it
// describes the process this connection reaches. A reconnect does expire
// it, whoever published it, and leaves the GPU's own readings.
func TestFirstConnectKeepsTelemetryAReconnectExpiresIt(t *testing.T) {
	clk := testutil.NewClock()
	b := core.New(core.Options{Clock: clk})
	t.Cleanup(b.Close)
	s := telemetry.Sample{Time: clk.Now()}
	s.Set(telemetry.KVCacheUsage, 0.5)
	s.Set(telemetry.GPUTemp, 70)
	s.Set(telemetry.GPUMemUsed, 70e9) // the old process's allocation
	b.Telemetry().Publish(addr(0), s) // a Poller's reading, before the channel exists
	clk.Advance(time.Second)

	h := newHarness(t, registerShared(b), `{}`, 1)
	tel := stats(t, b, addr(0)).Telemetry
	assert.True(t, tel.Has.Has(telemetry.KVCacheUsage), "the first connection expired a poller's reading")

	h.subConn(addr(0)).SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	for h.cc.ConnectAll() > 0 {
	}
	tel = stats(t, b, addr(0)).Telemetry
	assert.False(t, tel.Has.Has(telemetry.KVCacheUsage), "a reconnect kept the old process's KV-cache usage")
	assert.False(t, tel.Has.Has(telemetry.GPUMemUsed), "a reconnect kept the old process's GPU memory")
	assert.True(t, tel.Has.Has(telemetry.GPUTemp), "a reconnect expired the GPU's own reading")

	// An endpoint that leaves the resolver and comes back connects anew.
	h.update(2)
	for h.cc.ConnectAll() > 0 {
	}
	h.updateEndpoints(endpoints(2)[1:])
	h.lb().mu.Lock()
	assert.NotContains(t, h.lb().connected, addr(0), "a removed endpoint stays in connected")
	h.lb().mu.Unlock()
}
