package balancer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// prefer fills one scoring.State for each candidate in turn. A candidate
// with fresh telemetry but no load reading (only GPU memory: its model
// server's scrape failed while DCGM's worked) must not be scored with the
// other candidate's calls-since-reading, whichever is scored first.
func TestPreferScoresEachCandidateOnItsOwn(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "a", Addr: "a:1", Weight: 2}, {ID: "b", Addr: "b:1"}}))
	g := b.def.snap.Load().all
	ia, ib := 0, 1
	require.Equal(t, "a", g.members[ia].id)
	var sa, sb telemetry.Sample
	sa.Time, sb.Time = clock.Now(), clock.Now()
	sa.Set(telemetry.Running, 0)
	sb.Set(telemetry.GPUMemUsed, 40e9) // 50%: neutral
	sb.Set(telemetry.GPUMemTotal, 80e9)
	b.Publish("a", sa)
	b.Publish("b", sb)
	now := clock.Now()
	var st scoring.State
	g.members[ia].state(b.cfg, now, inferlb.ServiceLLM, g.weights[ia], &st) // a's reading is seen at in-flight 0
	g.members[ia].inFlight.Add(10)
	g.members[ib].inFlight.Add(3)
	// a: (10 + 1) / 2 = 5.5; b: (3 + 1) / 1 = 4, in either order.
	req := &inferlb.Request{Service: inferlb.ServiceLLM}
	require.False(t, b.prefer(req, g, ib, ia, now, false), "a is not cheaper than b")
	require.True(t, b.prefer(req, g, ia, ib, now, false), "b is cheaper than a")
}
