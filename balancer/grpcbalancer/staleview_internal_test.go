package grpcbalancer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// gapChild is endpointsharding with a hook into the gap in
// lbBalancer.UpdateClientConnState: the policy has applied the new
// endpoints (gen, its membership, eps) and released mu, and endpointsharding
// has not yet inhibited its children's updates, so a child reporting from
// a goroutine of its own publishes the old children to the policy.
type gapChild struct {
	balancer.Balancer
	gap func()
}

func (c *gapChild) UpdateClientConnState(s balancer.ClientConnState) error {
	if c.gap != nil {
		c.gap()
	}
	return c.Balancer.UpdateClientConnState(s)
}

// stateTap passes endpointsharding's states on to the policy and tells a
// waiting test when one shows the child of an address in a state.
type stateTap struct {
	balancer.ClientConn // the policy

	mu    sync.Mutex
	addr  string
	state connectivity.State
	seen  chan struct{}
}

// await returns a channel closed once a state published after the call
// shows the child of addr in state st.
func (tp *stateTap) await(addr string, st connectivity.State) <-chan struct{} {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.addr, tp.state, tp.seen = addr, st, make(chan struct{})
	return tp.seen
}

func (tp *stateTap) UpdateState(st balancer.State) {
	tp.ClientConn.UpdateState(st)
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.seen == nil {
		return
	}
	for _, c := range endpointsharding.ChildStatesFromPicker(st.Picker) {
		if namingAddr(c.Endpoint.Addresses) == tp.addr && c.State.ConnectivityState == tp.state {
			close(tp.seen)
			tp.seen = nil
			return
		}
	}
}

// A child that lost its connection reconnects on a goroutine of
// endpointsharding's own (go es.exitIdle), and pickfirst reports CONNECTING
// from there. When that report lands between the policy's taking a
// resolver update and endpointsharding's, the policy is shown the children
// of the endpoints the update replaced, READY, while its core already holds
// the new ones, none READY. A picker built from that view must queue calls
// for the picker endpointsharding publishes at the end of its update, not
// fail those that do not wait for ready UNAVAILABLE ("each of the 2 READY
// endpoints is excluded", which none is), and must not route over children
// that are no longer the channel's.
func TestAStaleViewOfTheChildrenQueuesCalls(t *testing.T) {
	for _, tc := range []struct {
		name     string
		next     []int // the endpoints of the update, after 0, 1, 2
		gapState connectivity.State
		gap      func(t *testing.T, err error, to string)
	}{
		{"every endpoint replaced", []int{3, 4, 5}, connectivity.Connecting, func(t *testing.T, err error, _ string) {
			assert.ErrorIs(t, err, balancer.ErrNoSubConnAvailable, "a call in the gap failed")
		}},
		{"one endpoint kept", []int{2, 3, 4}, connectivity.Ready, func(t *testing.T, err error, to string) {
			if assert.NoError(t, err) {
				assert.Equal(t, addr(2), to, "the call went to a child the update removed")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := grpcfake.NewClientConn()
			lb := balancer.Get(Name).Build(fake, balancer.BuildOptions{}).(*lbBalancer)
			t.Cleanup(lb.Close)
			tap := &stateTap{ClientConn: lb}
			child := &gapChild{Balancer: endpointsharding.NewBalancer(tap, balancer.BuildOptions{}, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})}
			lb.child = child
			update := func(ids ...int) {
				var eps []resolver.Endpoint
				for _, i := range ids {
					eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(i)}}})
				}
				require.NoError(t, lb.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
			}
			info := balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()}
			pickAddr := func() (string, error) {
				res, err := fake.State().Picker.Pick(info)
				if err != nil {
					return "", err
				}
				if res.Done != nil { // nil: not through the core
					res.Done(sent)
				}
				return res.SubConn.(*grpcfake.SubConn).Addr(), nil
			}

			update(0, 1, 2)
			for fake.ConnectAll() > 0 {
			}
			_, err := pickAddr()
			require.NoError(t, err)

			var (
				gapErr   error
				gapTo    string
				gapState connectivity.State
				ran      bool
			)
			child.gap = func() {
				// Endpoint 0's connection closes (a server's
				// MaxConnectionAge): pickfirst reports IDLE, and
				// endpointsharding has it reconnect on a goroutine, whose
				// CONNECTING is published in this gap.
				var sc *grpcfake.SubConn
				for _, s := range fake.SubConns() {
					if s.Addr() == addr(0) && !s.IsShutdown() {
						sc = s
					}
				}
				require.NotNil(t, sc)
				connecting := tap.await(addr(0), connectivity.Connecting)
				sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
				select {
				case <-connecting:
				case <-time.After(10 * time.Second): // a failsafe, not a wait
					t.Fatal("endpointsharding did not reconnect the IDLE child")
				}
				gapTo, gapErr = pickAddr()
				gapState = fake.State().ConnectivityState
				ran = true
			}
			update(tc.next...)
			child.gap = nil
			require.True(t, ran)
			tc.gap(t, gapErr, gapTo)
			assert.Equal(t, tc.gapState, gapState)

			// endpointsharding's own view follows: the new children.
			for fake.ConnectAll() > 0 {
			}
			for range 20 {
				to, err := pickAddr()
				require.NoError(t, err)
				assert.Contains(t, []string{addr(tc.next[0]), addr(tc.next[1]), addr(tc.next[2])}, to)
			}
		})
	}
}
