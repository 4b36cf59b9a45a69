package balancer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/telemetry"
)

func stickyPick(t *testing.T, b *Balancer, req inferlb.Request) string {
	t.Helper()
	p, err := b.Pick(&req)
	require.NoError(t, err)
	id := p.ID()
	p.Done(inferlb.Outcome{})
	return id
}

// A key stuck to the group's first member (index 0) stays there as one
// stuck to any other does: after a scale-out that gives the key's ring
// position to the new endpoint, the session keeps its warm endpoint.
func TestStickyKeyOfTheFirstMemberSurvivesAScaleOut(t *testing.T) {
	r := newStayRig(t, 4, Options{StickyTTL: time.Minute})
	ring := func(n int) *cache.Placement {
		ms := make([]cache.Member, n)
		for i := range ms {
			ms[i] = cache.Member{ID: fmt.Sprintf("e%d", i), Weight: 1}
		}
		return cache.NewPlacement(ms, 77)
	}
	before, after := ring(4), ring(5)
	key := uint64(0)
	for k := uint64(1); k < 100_000 && key == 0; k++ {
		w, v := before.Walk(k), after.Walk(k)
		m, _ := w.Next()
		n, _ := v.Next()
		if m == 0 && n == 4 {
			key = k
		}
	}
	require.NotZero(t, key, "no key moves from e0 to e4")
	require.Equal(t, "e0", r.g.members[0].id)
	req := inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}
	require.Equal(t, "e0", stickyPick(t, r.b, req))

	eps := make([]inferlb.Endpoint, 5)
	for i := range eps {
		eps[i] = inferlb.Endpoint{ID: fmt.Sprintf("e%d", i), Addr: fmt.Sprintf("e%d:1", i)}
	}
	require.NoError(t, r.b.Update(eps))
	r.clock.Advance(time.Second)
	assert.Equal(t, "e0", stickyPick(t, r.b, req), "the session left its sticky endpoint for the key's new owner")
	g := r.b.def.snap.Load().all
	w := g.placement.Walk(key)
	m, _ := w.Next()
	require.Equal(t, "e4", g.members[m].id, "the key's new owner")
}

// A sticky endpoint whose KV cache is nearly full (pressureSpill) does not
// hold the key: the walk relieves it to a clearly emptier neighbour, as it
// does an owner so pressured.
func TestStickyEndpointUnderPressureLetsTheKeyGo(t *testing.T) {
	r := newStayRig(t, 4, Options{StickyTTL: time.Minute})
	req := inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: stayKey}
	home := r.g.members[r.order[0]].id
	require.Equal(t, home, stickyPick(t, r.b, req))
	for i, e := range r.g.members {
		s := telemetry.Sample{Time: r.clock.Now()}
		s.Set(telemetry.Waiting, 0)
		s.Set(telemetry.KVCacheUsage, 0.2)
		if i == r.order[0] {
			s.Set(telemetry.KVCacheUsage, 0.97)
		}
		r.b.Publish(e.id, s)
	}
	got := stickyPick(t, r.b, req)
	assert.NotEqual(t, home, got, "the key stayed on its sticky endpoint at 97% KV cache")
	assert.Equal(t, 1, r.rankOf(got), "relief is the next endpoint in the key's order")
}

// The sticky table is keyed by the affinity key (and model), not by the
// tenant: another tenant's call with the same key (two tenants' sessions
// both named "s1") must stay in its own shard, not follow the key to the
// endpoint the first tenant's call went to.
func TestStickyEndpointOutsideTheTenantsShardIsNotTaken(t *testing.T) {
	r := newStayRig(t, 8, Options{StickyTTL: time.Minute, TenantShardSize: 2})
	shardOf := func(tenant string) map[string]bool {
		got := map[string]bool{}
		for k := uint64(1); k <= 64; k++ {
			got[stickyPick(t, r.b, inferlb.Request{Service: inferlb.ServiceLLM, Tenant: tenant, AffinityKey: k << 32})] = true
		}
		require.Len(t, got, 2, "tenant %s's shard", tenant)
		return got
	}
	const key = 99
	first := stickyPick(t, r.b, inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "a", AffinityKey: key})
	other := ""
	var in map[string]bool
	for i := range 50 {
		tn := fmt.Sprintf("t%d", i)
		if s := shardOf(tn); !s[first] {
			other, in = tn, s
			break
		}
	}
	require.NotEmpty(t, other, "no tenant's shard leaves out %s", first)
	got := stickyPick(t, r.b, inferlb.Request{Service: inferlb.ServiceLLM, Tenant: other, AffinityKey: key})
	assert.True(t, in[got], "tenant %s's call went to %s, outside its shard %v", other, got, in)
}
