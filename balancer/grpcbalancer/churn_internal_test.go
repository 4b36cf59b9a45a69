package grpcbalancer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
	"github.com/inferlb/inferlb/telemetry"
)

// shutdownCC is a fake ClientConn that, like a channel, tells a SubConn's
// listener SHUTDOWN after the policy shut it down (reportShutdowns; the
// fake alone only records it).
type shutdownCC struct {
	*grpcfake.ClientConn
	subs []shutdownSub
}

type shutdownSub struct {
	sc       *grpcfake.SubConn
	listener func(balancer.SubConnState)
}

func (cc *shutdownCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	sc, err := cc.ClientConn.NewSubConn(addrs, opts)
	if err == nil {
		cc.subs = append(cc.subs, shutdownSub{sc.(*grpcfake.SubConn), opts.StateListener})
	}
	return sc, err
}

func (cc *shutdownCC) reportShutdowns() {
	live := cc.subs[:0]
	for _, s := range cc.subs {
		if s.sc.IsShutdown() {
			s.listener(balancer.SubConnState{ConnectivityState: connectivity.Shutdown})
		} else {
			live = append(live, s)
		}
	}
	cc.subs = live
}

// The resolver replaces the endpoints on every deploy: the policy's tables
// (the SubConns it follows for out-of-band ORCA, addresses, readiness,
// the endpoints connected before) and its core must hold the current
// endpoints only. The fake forgets the SubConns shut down, as a channel
// does, so that nothing but the policy could hold them.
func TestResolverChurnKeepsThePolicysTablesToTheCurrentEndpoints(t *testing.T) {
	fake := grpcfake.NewClientConn()
	cc := &shutdownCC{ClientConn: fake}
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	lb := bal.(*lbBalancer)
	const rounds, size = 2_000, 3
	for r := range rounds {
		var eps []resolver.Endpoint
		for i := range size {
			eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: fmt.Sprintf("10.%d.%d.%d:50051", r>>8&255, r&255, i)}}})
		}
		require.NoError(t, bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
		for fake.ConnectAll() > 0 {
		}
		cc.reportShutdowns()
		fake.DropShutdown()
		res, err := fake.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
		require.NoError(t, err)
		res.Done(sent)
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	assert.Equal(t, size, len(lb.subConns), "SubConns followed")
	assert.Equal(t, size, len(lb.addrToID))
	assert.Equal(t, size, len(lb.ready))
	assert.Equal(t, size, len(lb.conn))
	assert.Equal(t, size, len(lb.connected), "endpoints connected before")
	assert.Equal(t, size, len(lb.eps))
	assert.Len(t, fake.SubConns(), size, "SubConns the channel has")
	require.NotNil(t, lb.current)
	assert.Len(t, lb.current.children.byID, size, "the picker's children")
	assert.LessOrEqual(t, len(lb.current.children.bySerial), maxSparse*size+8, "serials are never reused: the picker's table by serial is bounded by its children")
	assert.Equal(t, size, len(lb.core.Load().Stats()), "core endpoints")
}

// DNS servers rotate the records of a name from answer to answer (and a
// Kubernetes headless service lists its pods in no set order): the same
// endpoints in another order are no change, and must not make the policy
// rebuild its core's membership and invalidate its picker.
func TestReorderedResolverAnswerIsNoChange(t *testing.T) {
	fake := grpcfake.NewClientConn()
	bal := balancer.Get(Name).Build(fake, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	lb := bal.(*lbBalancer)
	addrs := []string{"10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"}
	update := func(order ...int) {
		var eps []resolver.Endpoint
		for _, i := range order {
			eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: addrs[i]}}})
		}
		require.NoError(t, bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
		for fake.ConnectAll() > 0 {
		}
	}
	update(0, 1, 2)
	gen := lb.gen.Load()
	update(2, 0, 1)
	update(1, 2, 0)
	assert.Equal(t, gen, lb.gen.Load(), "a reordered answer re-applied the endpoints")
	update(1, 2)
	assert.NotEqual(t, gen, lb.gen.Load(), "a changed answer is applied")
	assert.Len(t, lb.core.Load().Stats(), 2)
}

func TestSameEndpoints(t *testing.T) {
	x := inferlb.Endpoint{ID: "x", Addr: "10.0.0.1:1"}
	y := inferlb.Endpoint{ID: "y", Addr: "10.0.0.2:1"}
	y2 := inferlb.Endpoint{ID: "y", Addr: "10.0.0.3:1"}
	yl := inferlb.Endpoint{ID: "y", Addr: "10.0.0.2:1", Labels: map[string]string{"model": "m"}}
	for _, tc := range []struct {
		a, b []inferlb.Endpoint
		same bool
	}{
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{x, y}, true},
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{y, x}, true},
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{x, y2}, false},
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{yl, x}, false},
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{x}, false},
		// Repeated IDs: the core keeps the first, so order counts.
		{[]inferlb.Endpoint{x, y, y2}, []inferlb.Endpoint{x, y2, y}, false},
		{[]inferlb.Endpoint{x, y}, []inferlb.Endpoint{y, y}, false},
		{[]inferlb.Endpoint{y, y}, []inferlb.Endpoint{x, y}, false},
	} {
		assert.Equal(t, tc.same, sameEndpoints(tc.a, tc.b), "%v / %v", tc.a, tc.b)
	}
}

// An address that left the resolver's endpoints and comes back (a pod IP
// reused by a new pod) is a new endpoint: its first READY is a first
// connection, which keeps what a Poller published about the new replica,
// not a reconnect to the old process, which would expire it. The policy
// forgets the endpoints it had connected to as they leave.
func TestReAddedAddressFirstReadyIsNoReconnect(t *testing.T) {
	fake := grpcfake.NewClientConn()
	cc := &shutdownCC{ClientConn: fake}
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	lb := bal.(*lbBalancer)
	x, y := resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.1:50051"}}}, resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.2:50051"}}}
	update := func(eps ...resolver.Endpoint) {
		require.NoError(t, bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
	}
	settle := func() {
		for fake.ConnectAll() > 0 {
		}
		cc.reportShutdowns()
	}
	update(x, y)
	settle()
	update(y)
	settle()
	update(x, y)
	core := lb.core.Load()
	var s telemetry.Sample
	s.Set(telemetry.KVCacheUsage, 0.25)
	s.Time = core.Now()
	core.Publish("10.0.0.1:50051", s) // a Poller's reading of the new replica, before its channel connects
	settle()
	for _, st := range core.Stats() {
		if st.ID == "10.0.0.1:50051" {
			v, ok := st.Telemetry.Get(telemetry.KVCacheUsage)
			require.True(t, ok, "the new replica's reading was expired as if its first connection were a reconnect")
			assert.Equal(t, 0.25, v)
			return
		}
	}
	t.Fatal("the endpoint added back is not in the core")
}
