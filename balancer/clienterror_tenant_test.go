package balancer_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// tenantRun drives calls of several tenants over a fleet on a fake clock.
type tenantRun struct {
	t      *testing.T
	b      *balancer.Balancer
	clock  *testutil.Clock
	svc    inferlb.Service
	tenant func(n int) string // the n-th call's tenant
	// refuse says whether addr refuses the n-th call (a 401 in 1 ms);
	// others are served in 20 ms.
	refuse func(addr, tenant string, n int) bool
	// tell: the answers name the call's tenant (Outcome.Tenant), as the
	// adapters' do.
	tell bool
	// key, when set, is the n-th call's affinity key.
	key func(n int) uint64
	n   int
}

// tenantCounts are a run's calls per tenant and endpoint, and refusals.
type tenantCounts struct {
	drew    map[string]map[string]int // tenant -> addr -> calls
	refused map[string]int            // tenant -> calls refused
	calls   map[string]int            // tenant -> calls
}

func newTenantRun(t *testing.T, opts balancer.Options, addrs ...string) *tenantRun {
	t.Helper()
	clock := testutil.NewClock()
	opts.Clock = clock
	b := balancer.New(opts)
	t.Cleanup(b.Close)
	require.NoError(t, b.Update(addrEndpoints(addrs...)))
	return &tenantRun{t: t, b: b, clock: clock, svc: inferlb.ServiceEmbedding, tell: true}
}

// rounds sends rounds of perRound concurrent calls, ending each in order
// of its latency, and counts them.
func (r *tenantRun) rounds(rounds, perRound int) tenantCounts {
	r.t.Helper()
	got := tenantCounts{drew: map[string]map[string]int{}, refused: map[string]int{}, calls: map[string]int{}}
	type out struct {
		p      balancer.Pick
		lat    time.Duration
		ce     bool
		tenant string
	}
	for range rounds {
		outs := make([]out, 0, perRound)
		for range perRound {
			tn := r.tenant(r.n)
			req := &inferlb.Request{Service: r.svc, Tenant: tn}
			if r.key != nil {
				req.AffinityKey = r.key(r.n)
			}
			p, err := r.b.Pick(req)
			require.NoError(r.t, err)
			addr := p.Endpoint().Addr
			ce := r.refuse(addr, tn, r.n)
			lat := 20 * time.Millisecond
			if ce {
				lat = time.Millisecond
				got.refused[tn]++
			}
			r.n++
			if got.drew[tn] == nil {
				got.drew[tn] = map[string]int{}
			}
			got.drew[tn][addr]++
			got.calls[tn]++
			outs = append(outs, out{p, lat, ce, tn})
		}
		slices.SortStableFunc(outs, func(a, b out) int { return int(a.lat - b.lat) })
		var at time.Duration
		for _, o := range outs {
			r.clock.Advance(o.lat - at)
			at = o.lat
			oc := inferlb.Outcome{Latency: o.lat, ClientError: o.ce}
			if r.tell {
				oc.Tenant = o.tenant
			}
			o.p.Done(oc)
		}
	}
	return got
}

// others sums the calls of every tenant but skip on addr, and in all.
func (c tenantCounts) others(skip, addr string) (on, all int) {
	for tn, m := range c.drew {
		if tn == skip {
			continue
		}
		on += m[addr]
		all += c.calls[tn]
	}
	return on, all
}

// raceSkips reports whether a case of a heavy tenant run is left out under
// the race detector: one goroutine picks and answers, so the detector has
// nothing to check in it, and these runs took minutes of the package's
// -race time (96 s for TestTenantRefusedOnOneReplicaPassesItOverForThatTenantOnly
// alone). The pass without -race (README) runs every case.
func raceSkips(t *testing.T, name string) bool {
	t.Helper()
	if testutil.Race {
		t.Logf("%s: left to the pass without -race", name)
	}
	return testutil.Race
}

// tenantMix returns tenant A's calls in pctA of every hundred, spread evenly,
// and B..E's in turn otherwise. (The names are constants: formatting one
// for each call was 3% of the heaviest tenant tests under -race.)
func tenantMix(pctA int) func(n int) string {
	return func(n int) string {
		if (n+1)*pctA/100 != n*pctA/100 {
			return "A"
		}
		return [...]string{"B", "C", "D", "E"}[n%4]
	}
}

// During a key rollout tenant A's key is not on replica r0 yet: r0
// answers A's calls 401 in a millisecond and everyone else's well, as do
// r1..r3. With one share of client errors per endpoint and nothing else,
// the answer depended on A's part of the traffic: at 10% of the calls
// r0's share stayed below the gap and A's calls failed at about 1 in 4
// (embedding, 2,000 calls a second for 60 s: 2,979 of 12,000); at 30%
// r0 came and went (6,889 of 36,000 failed, the others drew 19% of their
// calls on r0); at 60% r0 was shunned for everyone, A lost 277 of 72,000
// and the other tenants drew 0.4% of their calls on r0 (213 of 48,000)
// instead of a quarter. With the answers naming the tenant
// (Outcome.Tenant), r0 refuses 7 to 13 of A's calls in the first 10 s,
// while the run builds up, and then takes none but probes (at most 15 of
// 72,000 refused, a few per ErrorDecay); the others draw r0 as a peer: a
// quarter of their calls or more, as A's load is off it. Without the
// tenant named, the figures are as they were.
func TestTenantRefusedOnOneReplicaPassesItOverForThatTenantOnly(t *testing.T) {
	t.Parallel()
	for _, svc := range []inferlb.Service{inferlb.ServiceEmbedding, inferlb.ServiceLLM} {
		for _, pct := range []int{10, 30, 60} {
			for _, perRound := range []int{4, 40} {
				for _, tell := range []bool{false, true} {
					if perRound == 40 && raceSkips(t, fmt.Sprintf("%s, A %d%%, 2000 calls a second, tenant named %v", svc, pct, tell)) {
						continue
					}
					r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(uint64(pct))}, "r0", "r1", "r2", "r3")
					r.svc, r.tell, r.tenant = svc, tell, tenantMix(pct)
					r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
					first := r.rounds(500, perRound) // 10 s
					got := r.rounds(3000, perRound)
					on, all := got.others("A", "r0")
					name := fmt.Sprintf("%s, A %d%% of %d calls a second, tenant named %v", svc, pct, perRound*50, tell)
					t.Logf("%s: A refused %d in the first 10 s, then %d of %d; the others drew %d of %d on r0",
						name, first.refused["A"], got.refused["A"], got.calls["A"], on, all)
					if tell {
						assert.LessOrEqual(t, first.refused["A"], 30, name)
						assert.LessOrEqual(t, got.refused["A"], 20, name)
						assert.Greater(t, on, all/5, name)
						continue
					}
					// How it was, and is without the tenant named: A's
					// calls fail on r0, or r0 is shunned for everyone.
					if pct == 60 {
						assert.Less(t, on, all/50, name)
					} else {
						assert.Greater(t, got.refused["A"], got.calls["A"]/10, name)
					}
				}
			}
		}
	}
}

// A tenant's own bad calls (a malformed body answered 400), refused by
// whichever replica they meet, are no replica's refusal of the tenant: its
// good calls spread over the fleet as before, whether a tenth or a third
// of its calls are bad, or all of them (its key expired: refused
// everywhere, every replica is passed over, and none is).
func TestTenantsOwnBadCallsKeepItsCallsSpread(t *testing.T) {
	t.Parallel()
	for _, bad := range []int{1, 3, 10} { // tenths of A's calls refused everywhere
		for _, perRound := range []int{4, 40} {
			if perRound == 40 && raceSkips(t, fmt.Sprintf("%d/10 of A's calls bad, 2000 calls a second", bad)) {
				continue
			}
			r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(uint64(bad))}, "r0", "r1", "r2", "r3")
			r.tenant = tenantMix(30)
			// A's calls are bad in turn, wherever they go: by the count
			// of A's calls, which the pick knows nothing of.
			var aN int
			r.refuse = func(_, tn string, _ int) bool {
				if tn != "A" {
					return false
				}
				aN++
				return aN*bad/10 != (aN-1)*bad/10
			}
			r.rounds(500, perRound)
			got := r.rounds(3000, perRound)
			name := fmt.Sprintf("%d/10 of A's calls bad, %d calls a second", bad, perRound*50)
			t.Logf("%s: A's calls %v, %d refused", name, got.drew["A"], got.refused["A"])
			for _, addr := range []string{"r0", "r1", "r2", "r3"} {
				assert.InDelta(t, got.calls["A"]/4, got.drew["A"][addr], float64(got.calls["A"])/16, "%s: A's calls on %s", name, addr)
			}
		}
	}
}

// Once r0 has A's key (the rollout reached it), A's calls come back to it:
// the pass-over ends after ErrorDecay, and the first call of A's there,
// served, ends the memory.
func TestTenantRefusalEndsWhenTheReplicaServesIt(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(3)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	fixed := false
	r.refuse = func(addr, tn string, _ int) bool { return !fixed && addr == "r0" && tn == "A" }
	got := r.rounds(1000, 4) // 20 s
	assert.Less(t, got.drew["A"]["r0"], 25, "A's calls on r0 while it refuses them")
	fixed = true
	r.rounds(int(balancer.DefaultErrorDecay/(20*time.Millisecond))+100, 4)
	got = r.rounds(1000, 4)
	t.Logf("A's calls after r0 has its key: %v", got.drew["A"])
	assert.Greater(t, got.drew["A"]["r0"], got.calls["A"]/5, "A's calls back on r0")
}

// Tenants are request data: a client can send calls under ever new,
// made-up tenants that every replica refuses (half the calls here, a
// thousand new names a second). The memory stays its size, and they do
// not evict the entries of tenant A, whose calls r0 refuses and the
// others serve: those are kept once a call the memory steered was
// served elsewhere, and made-up tenants, served nowhere, evict each
// other. Evicted, A's entries were learnt again, three refused calls at a
// time, as the flood evicted them.
func TestMadeUpTenantsKeepARealTenantsRefusal(t *testing.T) {
	t.Parallel()
	for _, perRound := range []int{4, 40} {
		r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(5)}, "r0", "r1", "r2", "r3")
		real := tenantMix(20)
		r.tenant = func(n int) string {
			if n%2 == 0 {
				return fmt.Sprintf("made-up-%d", n)
			}
			return real(n / 2)
		}
		r.refuse = func(addr, tn string, _ int) bool {
			return tn == "A" && addr == "r0" || len(tn) > 1
		}
		r.rounds(500, perRound)
		got := r.rounds(3000, perRound)
		on, all := got.others("A", "r0")
		t.Logf("%d calls a second: A refused %d of %d; A's calls %v; the others drew %d of %d on r0", perRound*50,
			got.refused["A"], got.calls["A"], got.drew["A"], on, all)
		assert.LessOrEqual(t, got.refused["A"], 20, "A's calls refused among made-up tenants, %d calls a second", perRound*50)
	}
}

// Pick and Done stay free of allocations with tenants' refusals
// remembered: a pick the memory steers, a refusal that renews an entry, a
// success that names its tenant.
func TestTenantRefusalDoesNotAllocate(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(9)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
	r.rounds(100, 4) // the table is allocated, r0 passed over for A
	reqs := []*inferlb.Request{{Service: inferlb.ServiceEmbedding, Tenant: "A"}, {Service: inferlb.ServiceEmbedding, Tenant: "B"}}
	n := 0
	allocs := testing.AllocsPerRun(200, func() {
		req := reqs[n%2]
		n++
		p, err := r.b.Pick(req)
		if err != nil {
			panic(err)
		}
		r.clock.Advance(time.Millisecond)
		p.Done(inferlb.Outcome{Tenant: req.Tenant, ClientError: n%7 == 0})
	})
	assert.Zero(t, allocs)
}

// With tenant shards (TenantShardSize), a shard member that refuses its
// tenant's calls is passed over for the shard's other member, strict or
// not, and still draws the other tenants' calls: 499 of 2,000 here. (A's
// calls are half of them and go to its shard only: without the tenant
// remembered, r0's share of client errors rose far above its peers', and
// r0 was shunned for everyone, drawing none of the others' 2,000.) When both refuse, the tenant's calls are refused wherever they go
// and its share of client errors says so: the memory passes neither over
// (its own key may be what is wrong), and a strict tenant's calls stay in
// the shard.
func TestShardMemberRefusingItsTenant(t *testing.T) {
	for _, strict := range []bool{false, true} {
		for _, both := range []bool{false, true} {
			r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(2), TenantShardSize: 2, TenantShardStrict: strict, AffinitySeed: 3},
				"r0", "r1", "r2", "r3", "r4", "r5")
			shard := firstSeenShard(t, r.b, "A", 2)
			r.tenant = func(n int) string {
				if n%2 == 0 {
					return "A"
				}
				return fmt.Sprintf("t%d", n/2%24) // others, over all the shards
			}
			r.refuse = func(addr, tn string, _ int) bool { return tn == "A" && (addr == shard[0] || both && addr == shard[1]) }
			r.rounds(500, 4) // 10 s
			got := r.rounds(1000, 4)
			name := fmt.Sprintf("strict %v, both refuse %v", strict, both)
			on, all := got.others("A", shard[0])
			t.Logf("%s: A's calls %v (shard %v), %d refused; the others drew %d of %d on %s", name, got.drew["A"], shard, got.refused["A"], on, all, shard[0])
			switch {
			case !both:
				assert.Less(t, got.refused["A"], 10, name)
				assert.Greater(t, got.drew["A"][shard[1]], got.calls["A"]*9/10, name)
				assert.Greater(t, on, all/10, "%s: the others' calls on %s", name, shard[0])
			case strict:
				assert.Equal(t, got.calls["A"], got.drew["A"][shard[0]]+got.drew["A"][shard[1]], name)
			default:
				assert.Equal(t, got.calls["A"], got.refused["A"], name)
			}
		}
	}
}

// Chats go by their keys to the keys' owners: the walk passes over an
// owner that refuses the chat's tenant, as P2C does, and its other
// tenants' chats stay with it. Without the tenant named, A's chats whose
// keys r0 owns failed on every call (126 of A's 1,000 calls, B drawing
// 814 of its 3,000 there); named, none does (B draws 940).
func TestTenantRefusalMovesOnlyThatTenantsKeys(t *testing.T) {
	for _, tell := range []bool{false, true} {
		r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(4), AffinitySeed: 4}, "r0", "r1", "r2", "r3")
		r.svc, r.tell = inferlb.ServiceLLM, tell
		keys := chatKeys(64)
		r.tenant = func(n int) string {
			if n%4 == 0 {
				return "A"
			}
			return "B"
		}
		r.key = func(n int) uint64 { return keys[n%len(keys)] }
		r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
		r.rounds(500, 4)
		got := r.rounds(1000, 4)
		on, all := got.others("A", "r0")
		t.Logf("tenant named %v: A refused %d of %d; B drew %d of %d on r0", tell, got.refused["A"], got.calls["A"], on, all)
		if tell {
			assert.Less(t, got.refused["A"], 10)
			assert.Greater(t, on, all/6, "B's chats on r0")
		} else {
			assert.Greater(t, got.refused["A"], got.calls["A"]/10)
		}
	}
}

// firstSeenShard picks for tenant's embedding calls until it has seen n
// endpoints, its shard of n (TenantShardSize), each call served (with
// the tenant on its outcome), in the order they were first picked.
func firstSeenShard(t *testing.T, b *balancer.Balancer, tenant string, n int) []string {
	t.Helper()
	var shard []string
	for len(shard) < n {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tenant})
		require.NoError(t, err)
		if a := p.Endpoint().Addr; !slices.Contains(shard, a) {
			shard = append(shard, a)
		}
		p.Done(inferlb.Outcome{Tenant: tenant})
	}
	return shard
}

// addrEndpoints returns an endpoint for each of addrs, known by its address.
func addrEndpoints(addrs ...string) []inferlb.Endpoint {
	out := make([]inferlb.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = inferlb.Endpoint{Addr: a}
	}
	return out
}
