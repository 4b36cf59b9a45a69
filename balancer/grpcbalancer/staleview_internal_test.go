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
			r := newTapRig(t)
			fake, child, update, pickAddr := r.fake, r.child, r.update, r.pickAddr
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
				r.disconnect(addr(0))
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

// tapRig is the policy with endpointsharding built on a stateTap and
// wrapped in a gapChild, on a fake ClientConn.
type tapRig struct {
	t     *testing.T
	fake  *grpcfake.ClientConn
	lb    *lbBalancer
	tap   *stateTap
	child *gapChild
}

func newTapRig(t *testing.T) *tapRig {
	r := &tapRig{t: t, fake: grpcfake.NewClientConn()}
	r.lb = balancer.Get(Name).Build(r.fake, balancer.BuildOptions{}).(*lbBalancer)
	t.Cleanup(r.lb.Close)
	r.tap = &stateTap{ClientConn: r.lb}
	r.child = &gapChild{Balancer: endpointsharding.NewBalancer(r.tap, balancer.BuildOptions{}, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})}
	r.lb.child = r.child
	return r
}

// update gives the policy the endpoints addr(i) for ids.
func (r *tapRig) update(ids ...int) {
	var eps []resolver.Endpoint
	for _, i := range ids {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(i)}}})
	}
	require.NoError(r.t, r.lb.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}))
}

// pickAddr picks once, a call that does not wait for ready, on the picker
// published last.
func (r *tapRig) pickAddr() (string, error) { return pickOn(r.fake.State().Picker) }

func pickOn(p balancer.Picker) (string, error) {
	res, err := p.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	if err != nil {
		return "", err
	}
	if res.Done != nil { // nil: not through the core
		res.Done(sent)
	}
	return res.SubConn.(*grpcfake.SubConn).Addr(), nil
}

// disconnect closes a's connection (a server's MaxConnectionAge): its
// pickfirst child reports IDLE, and endpointsharding has it reconnect on a
// goroutine of its own (go es.exitIdle), whose report of CONNECTING has
// reached the policy, and whose ExitIdle has returned (its Connect done),
// when disconnect returns.
func (r *tapRig) disconnect(a string) {
	var sc *grpcfake.SubConn
	for _, s := range r.fake.SubConns() {
		if s.Addr() == a && !s.IsShutdown() {
			sc = s
		}
	}
	require.NotNil(r.t, sc)
	connecting := r.tap.await(a, connectivity.Connecting)
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	select {
	case <-connecting:
	case <-time.After(10 * time.Second): // a failsafe, not a wait
		r.t.Fatal("endpointsharding did not reconnect the IDLE child")
	}
	// The SubConn starts connecting. pickfirst, which reported CONNECTING
	// already and publishes nothing for it, takes it under the lock its
	// ExitIdle holds until it has asked the SubConn to connect.
	sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
}

// A pick on a picker gRPC has not replaced yet, after the only READY child
// lost its connection (MaxConnectionAge rotating it), finds the core with
// nothing READY. It must queue the call for the picker that replaces it,
// which waits for the reconnect, as gRPC does for a picker that returns a
// SubConn no longer READY; not fail it UNAVAILABLE "the one READY endpoint
// is excluded", which it is not.
func TestAPickerOlderThanADisconnectQueuesCalls(t *testing.T) {
	r := newTapRig(t)
	r.update(0)
	for r.fake.ConnectAll() > 0 {
	}
	old := r.fake.State().Picker
	_, err := pickOn(old)
	require.NoError(t, err)

	r.disconnect(addr(0))
	_, err = pickOn(old)
	assert.ErrorIs(t, err, balancer.ErrNoSubConnAvailable, "a call on the replaced picker failed")
	assert.Equal(t, connectivity.Connecting, r.fake.State().ConnectivityState)
	_, err = r.pickAddr()
	assert.ErrorIs(t, err, balancer.ErrNoSubConnAvailable)

	for r.fake.ConnectAll() > 0 {
	}
	to, err := r.pickAddr()
	require.NoError(t, err)
	assert.Equal(t, addr(0), to)
}
