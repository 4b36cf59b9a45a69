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

	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
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
// (the SubConns it follows for out-of-band ORCA, addresses, readiness) and
// its core must hold the current endpoints only.
func TestResolverChurnKeepsThePolicysTablesToTheCurrentEndpoints(t *testing.T) {
	fake := grpcfake.NewClientConn()
	cc := &shutdownCC{ClientConn: fake}
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	lb := bal.(*lbBalancer)
	const rounds, size = 500, 3
	for r := range rounds {
		var eps []resolver.Endpoint
		for i := range size {
			eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: fmt.Sprintf("10.%d.%d.%d:50051", r>>8&255, r&255, i)}}})
		}
		require.NoError(t, bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
		for fake.ConnectAll() > 0 {
		}
		cc.reportShutdowns()
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
	assert.Equal(t, size, len(lb.core.Load().Stats()), "core endpoints")
}
