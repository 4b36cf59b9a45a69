package grpcbalancer

import (
	"maps"
	"slices"
	"testing"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// An address listed twice under two WithEndpoint IDs: endpointsharding
// keeps one child per address set and chose which at random at every
// update. The first listed must count, every time: the READY endpoint must
// not move from one ID to the other on unchanged updates (it would ramp
// again and leave its load counts behind), the core must not hold an
// endpoint no child serves, and out-of-band reports for the address must
// go to the ID in use.
func TestSameAddressUnderTwoIDsTheFirstCounts(t *testing.T) {
	eps := []resolver.Endpoint{
		WithEndpoint(resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(1)}}}, inferlb.Endpoint{ID: "x"}),
		WithEndpoint(resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(1)}}}, inferlb.Endpoint{ID: "y"}),
		{Addresses: []resolver.Address{{Addr: addr(2)}}},
	}
	h := &harness{t: t, cc: grpcfake.NewClientConn()}
	h.bal = balancer.Get(Name).Build(h.cc, balancer.BuildOptions{})
	t.Cleanup(h.bal.Close)
	lb := h.lb()
	want := map[string]bool{"x": true, addr(2): true}
	// endpointsharding rotates the list by a random amount each update:
	// 30 updates put y first in at least one of them but for a chance
	// of (2/3)^30.
	for i := range 30 {
		h.updateEndpoints(eps)
		for h.cc.ConnectAll() > 0 {
		}
		lb.mu.Lock()
		ready, id := maps.Clone(lb.ready), lb.addrToID[addr(1)]
		lb.mu.Unlock()
		if !maps.Equal(ready, want) {
			t.Fatalf("update %d: READY endpoints %v, want %v", i, ready, want)
		}
		if id != "x" {
			t.Fatalf("update %d: address %s belongs to %q for out-of-band reports, want x", i, addr(1), id)
		}
	}
	var ids []string
	for _, st := range lb.core.Load().Stats() {
		ids = append(ids, st.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{addr(2), "x"}) {
		t.Errorf("core endpoints %v, want [%s x]", ids, addr(2))
	}
	if n := len(h.cc.SubConns()); n != 2 {
		t.Errorf("%d SubConns, want 2", n)
	}
}
