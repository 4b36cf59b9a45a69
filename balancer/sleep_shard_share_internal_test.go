package balancer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A tenant's shard shares its load among its members that can take calls
// (the affinity bound's fair share within the shard). Its sleeping members
// take none, but their weight counted: with 3 of a shard of 4 asleep, the
// awake one's bound was a quarter of the calls it carried, and the
// tenant's keys spilled off their owner.
func TestShardShareLeavesOutSleepers(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{AffinitySeed: 0x5eed, TenantShardSize: 4, Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	eps := make([]inferlb.Endpoint, 8)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("ep-%d", i)}
	}
	require.NoError(t, b.Update(eps))
	g := b.def.snap.Load().groupFor("")
	var sh shard
	require.True(t, b.tenantShard(&inferlb.Request{Tenant: "acme"}, g, &sh))
	require.Equal(t, 4, sh.n)
	for k, m := range sh.members[:sh.n] {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Asleep, 0)
		if k > 0 {
			s.Set(telemetry.Asleep, 1)
		}
		b.Publish(g.members[m].id, s)
	}
	_, weight := sh.share(b.cfg, g, b.cfg.nowNs(), 1)
	assert.Equal(t, 1.0, weight, "the weight the shard's load is shared among: its one awake member's")
}
