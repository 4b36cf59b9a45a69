package balancer_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

func statIDs(b *balancer.Balancer) []string {
	var ids []string
	for _, s := range b.Stats() {
		ids = append(ids, s.ID)
	}
	return ids
}

// pickIDs picks n times from pick, ending each call at once, and counts
// the endpoints chosen.
func pickIDs(t *testing.T, n int, pick func(*inferlb.Request) (balancer.Pick, error)) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		p, err := pick(&inferlb.Request{})
		require.NoError(t, err)
		seen[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	return seen
}

func TestMembershipsKeepTheirOwnEndpoints(t *testing.T) {
	// Without slow start: z joins c next to y, which a already serves, so
	// it ramps (see TestSlowStartIsForJoinersOfAServingPool).
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(1), Clock: testutil.NewClock(), SlowStartWindow: -1})
	a, err := b.NewMembership()
	require.NoError(t, err)
	c, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, a.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}, {ID: "y", Addr: "10.0.0.2:1"}}))
	require.NoError(t, c.Update([]inferlb.Endpoint{{ID: "y", Addr: "10.0.0.2:2"}, {ID: "z", Addr: "10.0.0.3:2"}}))
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "w", Addr: "10.0.0.4:1"}}))

	assert.Equal(t, []string{"w", "x", "y", "z"}, statIDs(b), "the Balancer holds every membership's endpoints")
	assert.Equal(t, map[string]int{"x": 50, "y": 50}, roughly(pickIDs(t, 100, a.Pick), 50, 20))
	assert.Equal(t, map[string]int{"y": 50, "z": 50}, roughly(pickIDs(t, 100, c.Pick), 50, 20))
	assert.Equal(t, map[string]int{"w": 100}, pickIDs(t, 100, b.Pick))

	// One membership's update leaves the others alone.
	require.NoError(t, a.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}}))
	assert.Equal(t, []string{"w", "x", "y", "z"}, statIDs(b), "y is still c's")
	assert.Equal(t, map[string]int{"x": 100}, pickIDs(t, 100, a.Pick))
	assert.Equal(t, map[string]int{"y": 50, "z": 50}, roughly(pickIDs(t, 100, c.Pick), 50, 20))
	require.NoError(t, b.Update(nil))
	assert.Equal(t, []string{"x", "y", "z"}, statIDs(b))
}

// roughly replaces each count within tol of want by want, so a map of
// counts compares as "about even" while a missing or extra key still fails.
func roughly(m map[string]int, want, tol int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v >= want-tol && v <= want+tol {
			v = want
		}
		out[k] = v
	}
	return out
}

func TestMembershipsShareTheStateOfCommonEndpoints(t *testing.T) {
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(2), Clock: testutil.NewClock()})
	grpcSide, err := b.NewMembership()
	require.NoError(t, err)
	httpSide, err := b.NewMembership()
	require.NoError(t, err)
	eps := []inferlb.Endpoint{{ID: "r0", Addr: "10.0.0.1:8001"}, {ID: "r1", Addr: "10.0.0.2:8001"}}
	require.NoError(t, grpcSide.Update(eps))
	eps[0].Addr, eps[1].Addr = "10.0.0.1:8000", "10.0.0.2:8000"
	require.NoError(t, httpSide.Update(eps))

	// gRPC calls held on r0 ...
	var held []balancer.Pick
	for range 8 {
		p, err := grpcSide.PickExcept(&inferlb.Request{}, "r1")
		require.NoError(t, err)
		require.Equal(t, "r0", p.ID())
		held = append(held, p)
	}
	// ... steer the HTTP side's picks to r1: it sees the same load.
	seen := pickIDs(t, 50, httpSide.Pick)
	assert.Equal(t, 50, seen["r1"], "HTTP picks went to the replica busy with gRPC calls: %v", seen)
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
	assert.Len(t, b.Stats(), 2, "one state per ID, whichever memberships list it")
}

func TestMembershipReadinessIsItsOwn(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(3), Clock: clock})
	a, err := b.NewMembership()
	require.NoError(t, err)
	c, err := b.NewMembership()
	require.NoError(t, err)
	eps := []inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}, {ID: "y", Addr: "10.0.0.2:1"}}
	require.NoError(t, a.Update(eps))
	require.NoError(t, c.Update(eps))

	require.True(t, a.SetReady("x", false))
	assert.Equal(t, map[string]int{"y": 60}, pickIDs(t, 60, a.Pick))
	assert.Equal(t, map[string]int{"x": 30, "y": 30}, roughly(pickIDs(t, 60, c.Pick), 30, 15), "a's view hid x from c")
	assert.False(t, a.SetReady("nope", true), "an ID the Membership does not list")
	assert.False(t, b.SetReady("x", true), "the Balancer's own membership does not list x")

	// x was in use by c all along: ready in a again, it takes its full share at once.
	clock.Advance(time.Second)
	require.True(t, a.SetReady("x", true))
	assert.Equal(t, 1.0, stat(t, b, "x").RampFactor)

	// y served calls; after an outage of every membership it ramps up.
	require.True(t, a.SetReady("y", false))
	clock.Advance(time.Second)
	require.True(t, c.SetReady("y", false))
	assert.False(t, stat(t, b, "y").Ready)
	clock.Advance(time.Second)
	require.True(t, c.SetReady("y", true))
	assert.True(t, stat(t, b, "y").Ready)
	assert.Less(t, stat(t, b, "y").RampFactor, 1.0, "y came back from an outage of every membership without slow start")
}

// Slow start follows use, not the API path: an endpoint's first connect at
// startup (gRPC marks endpoints not ready until they connect) takes its
// full share at once, and one that served calls, went away and came back
// ramps up, also when it was never marked ready explicitly (Update makes
// endpoints ready; direct and HTTP users may only ever call SetReady(false)
// and SetReady(true) on an outage).
func TestReadyAgainAfterServingRamps(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "x"}, {ID: "y"}}))
	require.True(t, b.SetReady("x", false)) // before any call, as gRPC does
	clock.Advance(time.Second)
	require.True(t, b.SetReady("x", true))
	assert.Equal(t, 1.0, stat(t, b, "x").RampFactor, "a first connect takes its full share")

	p, err := b.PickAt(&inferlb.Request{}, serialOf(t, b, "y"))
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	require.True(t, b.SetReady("y", false))
	clock.Advance(time.Minute)
	require.True(t, b.SetReady("y", true))
	assert.Less(t, stat(t, b, "y").RampFactor, 1.0, "back after an outage: ramps up")
}

func serialOf(t *testing.T, b *balancer.Balancer, id string) uint64 {
	t.Helper()
	s, ok := b.Serial(id)
	require.True(t, ok, id)
	return s
}

func TestMembershipCloseAndLimit(t *testing.T) {
	b := balancer.New(balancer.Options{})
	var srcs []*balancer.Membership
	for {
		s, err := b.NewMembership()
		if err != nil {
			require.ErrorIs(t, err, balancer.ErrTooManyMemberships)
			break
		}
		srcs = append(srcs, s)
	}
	assert.Len(t, srcs, 63)

	a, c := srcs[0], srcs[1]
	require.NoError(t, a.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.1:1"}, {ID: "y", Addr: "10.0.0.2:1"}}))
	require.NoError(t, c.Update([]inferlb.Endpoint{{ID: "y", Addr: "10.0.0.2:1"}}))
	p, err := a.Pick(&inferlb.Request{Model: ""})
	require.NoError(t, err)

	a.Close()
	a.Close() // idempotent
	assert.Equal(t, []string{"y"}, statIDs(b), "x was only a's; y is still c's")
	p.Done(inferlb.Outcome{}) // a call in flight when its membership closed ends normally
	assert.ErrorIs(t, a.Update([]inferlb.Endpoint{{Addr: "10.0.0.9:1"}}), balancer.ErrMembershipClosed)
	_, err = a.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.Equal(t, []string{"y"}, statIDs(b))

	// Its slot is free again.
	s, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, s.Update([]inferlb.Endpoint{{ID: "z", Addr: "10.0.0.3:1"}}))
	assert.Equal(t, map[string]int{"z": 10}, pickIDs(t, 10, s.Pick))
	assert.Equal(t, map[string]int{"y": 10}, pickIDs(t, 10, c.Pick))
}

// Memberships change while others pick: nothing panics, every pick gets an
// endpoint of its own membership, and once all calls end nothing is left in
// flight. Run with -race.
func TestMembershipsChangeWhileOthersPick(t *testing.T) {
	b := balancer.New(balancer.Options{})
	stable, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, stable.Update([]inferlb.Endpoint{{ID: "s0", Addr: "10.0.0.1:1"}, {ID: "shared", Addr: "10.0.0.2:1"}}))
	own := map[string]bool{"s0": true, "shared": true}

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				p, err := stable.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100})
				if err != nil {
					errs <- err
					return
				}
				if !own[p.ID()] {
					errs <- fmt.Errorf("picked %q, not one of its membership's", p.ID())
				}
				p.Done(inferlb.Outcome{})
			}
		}()
	}
	wg.Add(1)
	go func() { // another adapter coming and going
		defer wg.Done()
		for i := range 200 {
			m, err := b.NewMembership()
			if err != nil {
				errs <- err
				return
			}
			_ = m.Update([]inferlb.Endpoint{{ID: "shared", Addr: "10.0.0.2:2"}, {ID: fmt.Sprintf("o%d", i%3), Addr: "10.0.0.3:2"}})
			m.SetReady("shared", i%2 == 0)
			if p, err := m.Pick(&inferlb.Request{}); err == nil {
				p.Done(inferlb.Outcome{})
			}
			m.Close()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, []string{"s0", "shared"}, statIDs(b))
	for _, s := range b.Stats() {
		assert.Zero(t, s.InFlight, s.ID)
		assert.True(t, s.Ready, s.ID)
	}
}

// PickAt goes to the endpoint it names however busy, while that endpoint can
// take the call; otherwise it picks as Pick does.
func TestPickAtPinsWhileTheEndpointCanTakeIt(t *testing.T) {
	b := balancer.New(balancer.Options{Rand: testutil.NewRand(5), Clock: testutil.NewClock()})
	require.NoError(t, b.Update([]inferlb.Endpoint{
		{ID: "x", Addr: "10.0.0.1:1", Labels: map[string]string{"model": "llama"}},
		{ID: "y", Addr: "10.0.0.2:1", Labels: map[string]string{"model": "llama"}},
		{ID: "z", Addr: "10.0.0.3:1", Labels: map[string]string{"model": "qwen"}},
	}))
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", AffinityKey: 42}
	var serial uint64
	var held []balancer.Pick
	for len(held) < 20 { // x busy with 20 calls
		p, err := b.PickExcept(req, "y")
		require.NoError(t, err)
		require.Equal(t, "x", p.ID())
		serial = p.Serial()
		held = append(held, p)
	}
	for range 10 {
		p, err := b.PickAt(req, serial)
		require.NoError(t, err)
		assert.Equal(t, "x", p.ID(), "pinned, however busy")
		p.Done(inferlb.Outcome{})
	}
	// A model x does not serve, an unknown serial, x not ready: the usual pick.
	p, err := b.PickAt(&inferlb.Request{Model: "qwen"}, serial)
	require.NoError(t, err)
	assert.Equal(t, "z", p.ID())
	p.Done(inferlb.Outcome{})
	p, err = b.PickAt(req, 9999)
	require.NoError(t, err)
	assert.Equal(t, "y", p.ID(), "unknown serial: P2C sends it to the idle one")
	p.Done(inferlb.Outcome{})
	require.True(t, b.SetReady("x", false))
	p, err = b.PickAt(req, serial)
	require.NoError(t, err)
	assert.Equal(t, "y", p.ID())
	p.Done(inferlb.Outcome{})
	for i := range held {
		held[i].Done(inferlb.Outcome{})
	}
}

func TestPickFailover(t *testing.T) {
	b := balancer.New(balancer.Options{})
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update([]inferlb.Endpoint{{ID: "x"}, {ID: "y"}}))
	for range 20 {
		p, err := m.PickFailover(&inferlb.Request{}, "x")
		require.NoError(t, err)
		assert.Equal(t, "y", p.ID(), "another endpoint when one can serve")
		p.Done(inferlb.Outcome{})
	}
	require.True(t, m.SetReady("y", false))
	p, err := m.PickFailover(&inferlb.Request{}, "x")
	require.NoError(t, err)
	assert.Equal(t, "x", p.ID(), "the failed one when nothing else is left")
	p.Done(inferlb.Outcome{})
	require.True(t, m.SetReady("x", false))
	_, err = m.PickFailover(&inferlb.Request{}, "x")
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
}

// TestSlowStartIsForJoinersOfAServingPool: a membership whose first Update
// names only new endpoints (a second service joining a shared Balancer)
// starts them at full weight; endpoints it adds later ramp, and so do new
// endpoints a first Update lists next to ones another membership serves.
func TestSlowStartIsForJoinersOfAServingPool(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "llm-1:80"}, {Addr: "llm-2:80"}}))
	ramp := func(id string) float64 {
		for _, s := range b.Stats() {
			if s.ID == id {
				return s.RampFactor
			}
		}
		t.Fatalf("no endpoint %s", id)
		return 0
	}
	assert.Equal(t, 1.0, ramp("llm-1:80"), "the Balancer's first endpoints")

	embed, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, embed.Update([]inferlb.Endpoint{{Addr: "embed-1:80"}, {Addr: "embed-2:80"}}))
	assert.Equal(t, 1.0, ramp("embed-1:80"), "a second service's first endpoints")
	require.NoError(t, embed.Update([]inferlb.Endpoint{{Addr: "embed-1:80"}, {Addr: "embed-2:80"}, {Addr: "embed-3:80"}}))
	assert.Less(t, ramp("embed-3:80"), 1.0, "a later joiner")

	other, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, other.Update([]inferlb.Endpoint{{Addr: "llm-1:80"}, {Addr: "llm-3:80"}}))
	assert.Less(t, ramp("llm-3:80"), 1.0, "new next to an endpoint already serving")
	assert.Equal(t, 1.0, ramp("llm-1:80"))
}

// TestOwnEndpointIsTheBalancersOwnDescription: two memberships describe
// one ID with two addresses (an HTTP port and a gRPC port). Endpoint is
// the description given last, by either; OwnEndpoint is the Balancer's
// own membership's, whoever updated last, and stays after that membership
// drops the endpoint (a pick made just before still reads it).
func TestOwnEndpointIsTheBalancersOwnDescription(t *testing.T) {
	b := balancer.New(balancer.Options{})
	defer b.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "r", Addr: "10.0.0.5:8000"}}))
	m, err := b.NewMembership()
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Update([]inferlb.Endpoint{{ID: "r", Addr: "10.0.0.5:50051"}, {ID: "g", Addr: "10.0.0.6:50051"}}))

	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	defer p.Done(inferlb.Outcome{})
	assert.Equal(t, "10.0.0.5:50051", p.Endpoint().Addr, "Endpoint is the latest description")
	own, ok := p.OwnEndpoint()
	assert.True(t, ok)
	assert.Equal(t, "10.0.0.5:8000", own.Addr)

	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "r2", Addr: "10.0.0.7:8000"}})) // drops r
	own, ok = p.OwnEndpoint()
	assert.True(t, ok)
	assert.Equal(t, "10.0.0.5:8000", own.Addr, "the last description stays")

	for range 20 {
		q, err := m.PickExcept(&inferlb.Request{}, "r")
		require.NoError(t, err)
		_, ok := q.OwnEndpoint()
		assert.False(t, ok, "the Balancer's own membership never listed g")
		q.Done(inferlb.Outcome{})
	}
	var zero balancer.Pick
	_, ok = zero.OwnEndpoint()
	assert.False(t, ok)
}
