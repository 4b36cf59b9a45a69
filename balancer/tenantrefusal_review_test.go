package balancer_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A tenant's pass-over written before the clock stepped back ends at the
// step, as the not-served memory's entries do (lackLapsed): r0 refused
// A's calls until its key arrived, then the clock stepped back. The
// entries, which lapse two ErrorDecays (a minute) after they were
// written, then read as lapsing the step later; they counted as live
// while the step was below the not-served memory's horizon (the longest
// of NotServedMemory and MaxEjectionTime, plus the two ErrorDecays), and
// r0 was passed over for A for the whole step on top of its ErrorDecay:
// A drew none of its calls there in the minute after a step of 100 s
// with the defaults, or of 10 minutes with an hour's MaxEjectionTime.
func TestTenantRefusalEndsAtAClockStepBack(t *testing.T) {
	for _, tc := range []struct {
		maxEject, step time.Duration
	}{{0, 100 * time.Second}, {time.Hour, 10 * time.Minute}} {
		maxEject := tc.maxEject
		r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(3), MaxEjectionTime: maxEject}, "r0", "r1", "r2", "r3")
		r.tenant = tenantMix(30)
		fixed := false
		r.refuse = func(addr, tn string, _ int) bool { return !fixed && addr == "r0" && tn == "A" }
		got := r.rounds(1000, 4) // 20 s
		assert.Less(t, got.drew["A"]["r0"], 25, "A's calls on r0 while it refuses them")
		fixed = true
		r.clock.Set(r.clock.Now().Add(-tc.step))
		got = r.rounds(3000, 4) // 60 s
		t.Logf("MaxEjectionTime %v, a step of %v: A's calls in the minute after the step: %v", maxEject, tc.step, got.drew["A"])
		assert.Greater(t, got.drew["A"]["r0"], got.calls["A"]/8, "MaxEjectionTime %v: A's calls back on r0 after the step", maxEject)
	}
}

// A strict tenant's calls go only to its shard: when the member that
// serves them is down (not ready) and the other is remembered to refuse
// the tenant, the memory passes over every endpoint the call can take,
// and a first pick goes ahead as if nothing were remembered, as it does
// for the not-served memory (the memory may be stale: the key may have
// arrived since). It failed with ErrTenantShardDown without trying a
// server. A failover, which would only fetch the refusal again, still
// finds none.
func TestStrictShardWhoseOnlyLiveMemberRefusesItsTenant(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(2), TenantShardSize: 2, TenantShardStrict: true, AffinitySeed: 3},
		"r0", "r1", "r2", "r3", "r4", "r5")
	shard := firstSeenShard(t, r.b, "A", 2)
	r.tenant = func(n int) string {
		if n%2 == 0 {
			return "A"
		}
		return fmt.Sprintf("t%d", n/2%24)
	}
	r.refuse = func(addr, tn string, _ int) bool { return tn == "A" && addr == shard[0] }
	got := r.rounds(500, 4)
	require.Less(t, got.refused["A"], 30, "the memory passes %s over for A", shard[0])
	require.True(t, r.b.SetReady(shard[1], false))
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "A"}
	p, err := r.b.Pick(req)
	require.NoError(t, err, "A's shard has a ready member")
	assert.Equal(t, shard[0], p.Endpoint().Addr)
	p.Done(inferlb.Outcome{Tenant: "A", ClientError: true})
	_, err = r.b.PickExcept(req, "elsewhere")
	assert.ErrorIs(t, err, balancer.ErrTenantShardDown, "a failover to the member that refuses A")
}

// Many goroutines refuse and serve the calls of different tenants, real
// and made-up, across endpoints while the membership changes and
// endpoints turn not ready and back (run with -race): every pick finds an
// endpoint, and afterwards the memory still passes r0 over for A. (C's
// calls are not asserted on: r0 and r1, refusing a third of all calls,
// may be shunned for everyone by their own shares, clienterror.go.)
//
// Each call reports its latency (a millisecond), and endpoints join at
// full weight (no SlowStartWindow), so that where the calls go, and so
// A's share of client errors, does not hang on how the goroutines are
// scheduled. Measured, a call's latency was the time on the shared clock
// between its Pick and its Done, which the other goroutines advance: a
// worker descheduled there on a busy machine gave its endpoint a latency
// of seconds (1.5 s to 6.8 s seen). When that endpoint was r1, the only
// other one at full weight (r2 and r4 to r6 rejoin new, r3 turns ready
// again, all in slow start), A's calls went to r0 nine in ten, refused:
// A's share of client errors rose to 0.77 to 0.94, where no run passes an
// endpoint over (needRun; a tenant whose calls all go to endpoints that
// refuse it, see tenantrefusal.go), its entry live and its run on r0 at
// the most the count holds, and the serial calls after the run, r1 still
// priced out, drew 180 of A's 200 on r0 (1 run in 120). The memory was
// not stuck: a serial run with one 6 s latency on r1, r2 and r3 in slow
// start, and refusals that name no tenant (which it never sees) in place
// of the made-up tenants, did the same. With latencies alike but slow
// start, A's calls went half to r0 in the concurrent part, and its share,
// near 0.5, now and then still kept the memory from learning before the
// end (2 to 4 of A's calls on r0 after, 10 runs in 1,500). The memory
// now weighs a run against the tenant's calls served elsewhere during
// it, and passes r0 over in the serial run after 28 of A's calls
// (TestTenantRefusalWeighsItsCallsElsewhere).
//
// A's calls keep off r0 also when r0's own share shuns it for everyone,
// or when the picks' turns give A the other members: a failover of A's
// whose only candidate is r0 asks the memory itself.
func TestTenantRefusalConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(7), SlowStartWindow: -1})
	defer b.Close()
	require.NoError(t, b.Update(addrEndpoints("r0", "r1", "r2", "r3", "r4", "r5")))
	refuses := func(addr, tn string) bool {
		return addr == "r0" && tn == "A" || addr == "r1" && tn == "B" || len(tn) > 1
	}
	const workers, calls = 8, 1500
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		sets := [][]inferlb.Endpoint{addrEndpoints("r0", "r1", "r2", "r3", "r4", "r5"), addrEndpoints("r0", "r1", "r2", "r3", "r6"), addrEndpoints("r0", "r1", "r3", "r4", "r5", "r6")}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = b.Update(sets[i%len(sets)])
			b.SetReady("r3", i%2 == 0)
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range calls {
				tn := [...]string{"A", "B", "C", "D"}[n%4]
				if n%3 == 0 {
					tn = fmt.Sprintf("made-up-%d-%d", w, n)
				}
				req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tn}
				var p balancer.Pick
				var err error
				if n%5 == 0 {
					p, err = b.PickExcept(req, "r2")
				} else {
					p, err = b.Pick(req)
				}
				if err != nil {
					errs <- fmt.Errorf("call %d of %s: %w", n, tn, err)
					return
				}
				clock.Advance(time.Millisecond)
				p.Done(inferlb.Outcome{Tenant: tn, ClientError: refuses(p.Endpoint().Addr, tn), Latency: time.Millisecond})
			}
		}()
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.NoError(t, b.Update(addrEndpoints("r0", "r1", "r2", "r3")))
	b.SetReady("r3", true)
	drew := map[string]map[string]int{"A": {}, "C": {}}
	for n := range 400 {
		tn := [...]string{"A", "C"}[n%2]
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tn})
		require.NoError(t, err)
		drew[tn][p.Endpoint().Addr]++
		clock.Advance(time.Millisecond)
		p.Done(inferlb.Outcome{Tenant: tn, ClientError: refuses(p.Endpoint().Addr, tn), Latency: time.Millisecond})
	}
	t.Logf("after the run: A's calls %v, C's %v", drew["A"], drew["C"])
	assert.Less(t, drew["A"]["r0"], 5, "A's calls on r0")
	// The memory's own verdict: a failover of A's whose only candidate is
	// r0 finds none; C's goes there.
	require.True(t, b.SetReady("r2", false))
	require.True(t, b.SetReady("r3", false))
	p, err := b.PickExcept(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "A"}, "r1")
	if err == nil {
		t.Errorf("a failover of A's went to %s, which refuses A", p.Endpoint().Addr)
		p.Done(inferlb.Outcome{Tenant: "A", ClientError: true, Latency: time.Millisecond})
	} else {
		assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	}
	p, err = b.PickExcept(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "C"}, "r1")
	require.NoError(t, err, "C's failover to r0")
	assert.Equal(t, "r0", p.Endpoint().Addr)
	p.Done(inferlb.Outcome{Tenant: "C", Latency: time.Millisecond})
}

// maxTenantLooks bounds the members and slots of marked pairs the
// tenants' refusals memory may look at for one Pick+Done of a tenant's
// (testhook.SetTenantLooks), whatever the size of the pool: the members
// the pick weighs (an embedding call's scan compares up to ScanLimit of
// them, twice while some endpoint's share of client errors may shun it,
// as the refusals here make it), the four slots of each set of pairs
// that holds a marked pair of the tenant's (one here), a member or two
// the pick may take, and room to spare. A look at each member of the
// group is 2,048 here.
const maxTenantLooks = 2*balancer.DefaultScanLimit + 16

// countTenantLooks has b count the looks its memory of the tenants'
// refusals takes (testhook.SetTenantLooks), before its first refusal.
func countTenantLooks(b *balancer.Balancer) *atomic.Int64 {
	n := new(atomic.Int64)
	testhook.SetTenantLooks(b, n)
	return n
}

// tenantLooks makes calls Pick+Done of req, the call a success, and
// returns the most looks (countTenantLooks) one of them took, their
// total, and the endpoints picked.
func tenantLooks(t *testing.T, b *balancer.Balancer, looks *atomic.Int64, req *inferlb.Request, calls int) (most, total int64, picked map[string]int) {
	t.Helper()
	picked = map[string]int{}
	for range calls {
		before := looks.Load()
		p, err := b.Pick(req)
		require.NoError(t, err)
		picked[p.ID()]++
		p.Done(inferlb.Outcome{Tenant: req.Tenant})
		n := looks.Load() - before
		most, total = max(most, n), total+n
	}
	return most, total, picked
}

// A tenant whose own bad call one endpoint refused (a 400), with none of
// its pairs marked, picks at the cost of any other tenant's: the memory
// looked at every member of the group on each of its picks for two
// ErrorDecays (over 2,048 endpoints a pick of its took 49.8 µs against
// another tenant's 2.7 µs; BenchmarkPickTenantRefused). The looks are
// counted, not timed: the machines are shared and noisy.
func TestTenantsBadCallDoesNotSlowItsPicks(t *testing.T) {
	const n = 2048
	clock := testutil.NewClock()
	b := newBalancer(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	looks := countTenantLooks(b)
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "C"}
	p, err := b.Pick(req)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Tenant: "C", ClientError: true})
	most, total, _ := tenantLooks(t, b, looks, req, 300)
	t.Logf("C's 300 picks over %d endpoints: %d looks, at most %d in one", n, total, most)
	assert.LessOrEqual(t, most, int64(maxTenantLooks), "looks in a pick of the tenant whose bad call was refused")
}

// A failover of tenant A's call, whose only other candidate is r0, which
// the memory passes over for A, finds none, as one whose candidates are
// all remembered not to serve its model does: the retry would only
// fetch r0's refusal, on the retry budget. It went to r0. A first pick
// still goes ahead.
func TestTenantFailoverToOnlyTheRefusingEndpointFindsNone(t *testing.T) {
	r := newTenantRun(t, balancer.Options{Rand: testutil.NewRand(3)}, "r0", "r1", "r2", "r3")
	r.tenant = tenantMix(30)
	r.refuse = func(addr, tn string, _ int) bool { return addr == "r0" && tn == "A" }
	got := r.rounds(1000, 4)
	require.Less(t, got.drew["A"]["r0"], 25, "A's calls on r0 while it refuses them")
	require.True(t, r.b.SetReady("r2", false))
	require.True(t, r.b.SetReady("r3", false))
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "A"}
	for _, pick := range []func() (balancer.Pick, error){
		func() (balancer.Pick, error) { return r.b.PickExcept(req, "r1") },
		func() (balancer.Pick, error) { return r.b.PickRetry(req, "r1") },
	} {
		p, err := pick()
		if err == nil {
			t.Errorf("a failover of A's went to %s", p.Endpoint().Addr)
			p.Done(inferlb.Outcome{Tenant: "A", ClientError: true})
			continue
		}
		assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	}
	p, err := r.b.Pick(req)
	require.NoError(t, err)
	assert.Equal(t, "r1", p.Endpoint().Addr)
	p.Done(inferlb.Outcome{Tenant: "A"})
	p, err = r.b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "B"})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Tenant: "B"})
	_, err = r.b.PickExcept(&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "B"}, "r1")
	assert.NoError(t, err, "B's failover to r0")
}

// A pick of a tenant that one endpoint is passed over for costs about
// what another tenant's does, however large the pool: the count the cap
// needs (no more of the pool passed over than MaxEjectedFraction, never
// every candidate) came from a look at each member of the group, and
// over 2,048 endpoints a pick of its took 49.8 µs against another
// tenant's 2.0 µs. It now comes from the tenant's marked pairs
// (refusalTable.marks). The looks are counted, not timed (the machines
// are shared and noisy; BenchmarkPickTenantRefused times them), and the
// memory must look at some: the pick passes the endpoint over.
func TestTenantsPassedOverEndpointDoesNotSlowItsPicks(t *testing.T) {
	const n = 2048
	clock := testutil.NewClock()
	b := newBalancer(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	looks := countTenantLooks(b)
	// Refused on the first endpoint, served elsewhere nine times as
	// often (BenchmarkPickTenantRefused): its pair is marked. A's first
	// success steered by the memory (once in its entry's life) looks at
	// each member (tenantServed), before the count below.
	bad := endpoints(n)[0].Addr
	serial, ok := b.Serial(bad)
	require.True(t, ok)
	req := &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "A"}
	for i := range 300 {
		var p balancer.Pick
		var err error
		if i%10 == 0 {
			p, err = b.PickAt(req, serial)
		} else {
			p, err = b.Pick(req)
		}
		require.NoError(t, err)
		p.Done(inferlb.Outcome{Tenant: "A", ClientError: p.ID() == bad})
	}
	require.Equal(t, 1, refusedTenants(t, b)[bad], "%s passed over for A", bad)
	most, total, picked := tenantLooks(t, b, looks, req, 300)
	t.Logf("A's 300 picks over %d endpoints: %d looks, at most %d in one", n, total, most)
	assert.Zero(t, picked[bad], "A's picks of %s, passed over for it", bad)
	assert.GreaterOrEqual(t, total, int64(300), "the memory looks at A's marked pair on each of its picks")
	assert.LessOrEqual(t, most, int64(maxTenantLooks), "looks in a pick of the tenant an endpoint is passed over for")
	_, total, _ = tenantLooks(t, b, looks, &inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: "B"}, 300)
	assert.Zero(t, total, "looks in B's picks, which nothing passes over")
}
