package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// The affinity bound shares the load among the members taking calls by
// the weight they take calls at: a ramping member's is its weight times
// its slow-start factor, as draws and its keys are admitted. Counted at
// full weight, a member that joined a fleet of three and may take a tenth
// of a share lowered every other member's fair share by almost a quarter,
// so owners at the fleet's mean load were past the bound (1.25 x 3.1/4 =
// 0.97 of it) and their keys spilled to cold caches for the whole ramp.
func TestBoundSharesLoadByRampedWeight(t *testing.T) {
	clock := testutil.NewClock()
	b, eps := rampingFourth(t, balancer.Options{Clock: clock, Rand: testutil.NewRand(35)})
	home := eps[0].Addr
	// The load a ramped fleet carries: the old members about the same, the
	// joiner about a tenth of that.
	var held []balancer.Pick
	for id, n := range map[string]int{home: 10, eps[1].Addr: 10, eps[2].Addr: 8, eps[3].Addr: 1} {
		serial, ok := b.Serial(id)
		require.True(t, ok)
		for range n {
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	plain := affine(t, 4, balancer.Options{})
	const keys = 300
	kept := 0
	for k, n := uint64(1), 0; n < keys; k++ {
		key := k * 0x9e3779b97f4a7c15
		if owner(t, plain, key) != home {
			continue
		}
		n++
		if owner(t, b, key) == home {
			kept++
		}
	}
	// 11 calls, counting the next, against a fair share of 30/3.1 = 9.7:
	// within ceil(1.25 x 9.7) = 13.
	assert.Equal(t, keys, kept, "an owner about the mean of the ramped fleet keeps its keys")
	req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 12345}
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		clock.Advance(150 * time.Millisecond) // the ramped weights are summed again
		p, err := b.Pick(req)
		if err != nil {
			panic(err)
		}
		p.Done(inferlb.Outcome{})
	}), "a pick during a ramp does not allocate")
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
}

// The same within a tenant's shard, whose load the bound shares among the
// shard's members.
func TestShardBoundSharesLoadByRampedWeight(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(36), TenantShardSize: 4})
	shard := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme"}, 400)
	require.Len(t, shard, 4)
	const keys = 300
	req := func(k uint64) *inferlb.Request {
		return &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "acme", AffinityKey: k * 0x9e3779b97f4a7c15}
	}
	// The keys of one shard member, found before anything ramps.
	var home string
	for id := range shard {
		home = id
		break
	}
	var mine []uint64
	for k := uint64(1); len(mine) < keys; k++ {
		if p, err := b.Pick(req(k)); assert.NoError(t, err) {
			if p.ID() == home {
				mine = append(mine, k)
			}
			p.Done(inferlb.Outcome{})
		}
	}
	loads := map[string]int{home: 10}
	for id := range shard {
		switch {
		case id == home:
		case len(loads) == 1:
			loads[id] = 10
		case len(loads) == 2:
			loads[id] = 8
		default:
			loads[id] = 1
			require.True(t, b.SetReady(id, false))
			require.True(t, b.SetReady(id, true)) // back from an outage: it ramps
			require.InDelta(t, balancer.DefaultSlowStartMin, stat(t, b, id).RampFactor, 1e-9)
		}
	}
	var held []balancer.Pick
	for id, n := range loads {
		serial, ok := b.Serial(id)
		require.True(t, ok)
		for range n {
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
			require.NoError(t, err)
			held = append(held, p)
		}
	}
	kept := 0
	for _, k := range mine {
		p, err := b.Pick(req(k))
		require.NoError(t, err)
		if p.ID() == home {
			kept++
		}
		p.Done(inferlb.Outcome{})
	}
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	assert.Equal(t, keys, kept, "an owner about the mean of its ramped shard keeps its keys")
}
