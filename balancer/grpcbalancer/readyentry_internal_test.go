package grpcbalancer

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// An endpoint that enters READY is offered by the core from SetReady on,
// a moment before the picker holding its child is published; a pick that
// began on the picker before (gRPC picks on whichever it holds) and that
// the core gives the new endpoint waits for the next picker and picks
// there. Before, it was routed as a failover past the endpoint, to
// whatever else was READY: the endpoint the call's affinity key is owned
// by, or a fleet's only healthy one, lost the call. On a loaded machine
// that moment lasts long enough for several calls: e2e tests that wait
// for the core to see every endpoint READY and then call lost a call to
// it now and then (TestE2EPushbackRetriesAvoidRefusingBackend: one of 30
// calls sent to the refusing backend three times over).
func TestAPickOnThePickerBeforeAnEndpointIsReadyWaitsForTheNext(t *testing.T) {
	cc := grpcfake.NewClientConn()
	bb := balancer.Get(Name)
	bal := bb.Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	cfg, err := bb.(balancer.ConfigParser).ParseConfig(json.RawMessage(`{}`))
	require.NoError(t, err)
	require.NoError(t, bal.UpdateClientConnState(balancer.ClientConnState{
		ResolverState:  resolver.State{Endpoints: endpoints(2)},
		BalancerConfig: cfg,
	}))
	connect := func(a string) {
		t.Helper()
		for _, sc := range cc.SubConns() {
			if sc.Addr() == a && !sc.IsShutdown() {
				sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
				sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Ready})
				return
			}
		}
		t.Fatalf("no SubConn for %s", a)
	}
	info := balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()}

	connect(addr(0))
	before := cc.State().Picker
	require.IsType(t, &picker{}, before, "endpoint 0 READY: the policy's picker")
	busy, err := before.Pick(info) // a call out to endpoint 0: endpoint 1 is the cheaper
	require.NoError(t, err)
	require.Equal(t, addr(0), busy.SubConn.(*grpcfake.SubConn).Addr())

	connect(addr(1))
	require.NotSame(t, before, cc.State().Picker, "endpoint 1 READY: a new picker")
	res, err := before.Pick(info)
	if err == nil {
		t.Errorf("a pick on the picker from before endpoint 1 was READY went to %s; want it to wait for the next picker", res.SubConn.(*grpcfake.SubConn).Addr())
		res.Done(sent)
	} else {
		assert.ErrorIs(t, err, balancer.ErrNoSubConnAvailable)
	}
	res, err = cc.State().Picker.Pick(info) // the call's next pick
	require.NoError(t, err)
	assert.Equal(t, addr(1), res.SubConn.(*grpcfake.SubConn).Addr())
	res.Done(sent)
	busy.Done(sent)
}
