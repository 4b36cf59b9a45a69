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
	_, weight := sh.share(b.cfg, g, b.cfg.nowNs(), 1, false, nil)
	assert.Equal(t, 1.0, weight, "the weight the shard's load is shared among: its one awake member's")
}

// The group's view of which members sleep is cached for fleetViewTTL: a
// member that woke within it is still counted asleep there, and with every
// other member asleep the weight its load is shared among came to 0 (or a
// rounding sliver above it). At 0 the bound fell back to the whole group's
// weight, and the only awake member, carrying every call, was held to half
// of them; at a sliver its share had no bound. It keeps at least its own
// weight.
func TestWokenMemberKeepsItsOwnWeightInAStaleView(t *testing.T) {
	clock := testutil.NewClock()
	b := New(Options{AffinitySeed: 0x5eed, Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "ep-0"}, {ID: "ep-1"}}))
	g := b.def.snap.Load().groupFor("")
	asleep := func(id string, v float64) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Asleep, v)
		b.Publish(id, s)
	}
	asleep(g.members[0].id, 1)
	asleep(g.members[1].id, 1)
	now := clock.Now()
	st := g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano())
	v := g.fleetLoad(b.cfg, st, now) // cached: both asleep
	require.Equal(t, 2.0, v.asleep)
	asleep(g.members[0].id, 0) // ep-0 wakes within the view's TTL

	serial, ok := b.Serial(g.members[0].id)
	require.True(t, ok)
	for range 3 {
		p, err := b.PickAt(&inferlb.Request{}, serial)
		require.NoError(t, err)
		t.Cleanup(func() { p.Done(inferlb.Outcome{}) })
	}
	require.Equal(t, 2.0, g.fleetLoad(b.cfg, g.eligibility(b.cfg, b.epoch.Load(), now.UnixNano()), now).asleep, "the view is still the cached one")
	r := b.withinBound(&inferlb.Request{AffinityKey: 1}, g, 0, now, nil, nil)
	assert.True(t, r.in, "the one awake member carries every call: 4 of 4 is within its bound")
}
