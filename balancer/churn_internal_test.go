package balancer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A service runs for weeks while its fleet's pods are replaced thousands
// of times, each with a new ID, new model labels and a new data-parallel
// engine name, and while its callers send model and tenant names nobody
// serves. Every table keyed by endpoint ID or group name must hold the
// current fleet only: the endpoints, the telemetry slots, each
// membership's durable group counters and its model groups; request data
// must add nothing.
func TestChurnKeepsEveryTableToTheCurrentFleet(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	b := New(Options{Clock: clock, Rand: testutil.NewRand(1), StickyTTL: time.Minute, TenantShardSize: 2, SpillMemory: time.Minute})
	side, err := b.NewMembership()
	require.NoError(t, err)
	var kv telemetry.Sample
	kv.Set(telemetry.KVCacheUsage, 0.5)
	const rounds, size = 2_000, 4
	for r := range rounds {
		eps := make([]inferlb.Endpoint, size)
		for i := range eps {
			id := fmt.Sprintf("pod-%d-%d", r, i)
			eps[i] = inferlb.Endpoint{ID: id, Addr: id + ":8000", Labels: map[string]string{
				"model": fmt.Sprintf("llama-v%d,shared", r), "dp_group": fmt.Sprintf("node-%d-%d", r, i/2)}}
		}
		require.NoError(t, b.Update(eps))
		require.NoError(t, side.Update(eps[size/2:]))
		if r%100 == 0 { // another adapter comes and goes
			m, err := b.NewMembership()
			require.NoError(t, err)
			require.NoError(t, m.Update([]inferlb.Endpoint{{ID: fmt.Sprintf("grpc-%d", r)}, eps[0]}))
			m.Close()
		}
		kv.Time = clock.Now()
		b.Publish(eps[0].ID, kv)
		for _, model := range []string{"shared", fmt.Sprintf("nobody-serves-%d", r)} {
			req := inferlb.Request{Service: inferlb.ServiceLLM, Model: model, Tenant: fmt.Sprintf("tenant-%d", r), AffinityKey: uint64(r) | 1, PromptTokens: 10}
			if p, err := b.Pick(&req); err == nil {
				p.Done(inferlb.Outcome{})
			}
		}
		clock.Advance(time.Second)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Lengths, not Len: a table that grew would be printed whole.
	assert.Equal(t, size, len(b.eps), "endpoints")
	assert.Equal(t, size, b.cfg.store.Len(), "telemetry slots")
	// One: the whole group's, which the current model's and "shared"'s
	// are, as every endpoint serves both (groups of the same members are
	// one).
	assert.Equal(t, 1, len(b.def.loads), "group counters")
	assert.Equal(t, 1, len(side.loads), "another membership's group counters")
	assert.Equal(t, 2, len(b.def.snap.Load().byModel), "model groups")
	assert.Equal(t, size, len(b.def.groupsOf))
	for _, e := range b.eps {
		assert.Len(t, *e.dpPeers.Load(), 2, "an engine's ranks are this fleet's")
	}
}
