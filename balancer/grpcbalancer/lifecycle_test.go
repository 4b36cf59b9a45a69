package grpcbalancer

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// hookCC is a fake ClientConn that runs onNewSubConn each time a child
// asks for a SubConn: from inside the policy's UpdateClientConnState, after
// the policy has updated the core and before it publishes its next picker,
// which is when a real channel's concurrent calls pick on the old one.
type hookCC struct {
	*grpcfake.ClientConn
	onNewSubConn func()
}

func (cc *hookCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	if cc.onNewSubConn != nil {
		cc.onNewSubConn()
	}
	return cc.ClientConn.NewSubConn(addrs, opts)
}

// pickTen returns a hook that makes 10 picks on the channel's current
// picker, as calls arriving while the policy applies an update do: a pick
// that gets a SubConn is done, one told to wait for the next picker
// (ErrNoSubConnAvailable) is queued, which is fine, and any other error is
// collected in errs.
func pickTen(fake *grpcfake.ClientConn, errs *[]error) func() {
	return func() {
		for range 10 {
			res, err := fake.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
			switch {
			case err == nil:
				res.Done(sent)
			case err != balancer.ErrNoSubConnAvailable:
				*errs = append(*errs, err)
			}
		}
	}
}

// A resolver update that renames a connected endpoint (a new WithEndpoint
// ID, or "idByHost" turned on: same addresses, so endpointsharding keeps
// its READY child) must not fail the calls that pick while the policy
// applies it: the endpoint stays as ready as its child is.
func TestRenamingAReadyEndpointFailsNoCall(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg, next string
		rename    func(resolver.Endpoint) resolver.Endpoint
	}{
		{"WithEndpoint ID", `{}`, `{}`, func(ep resolver.Endpoint) resolver.Endpoint {
			return WithEndpoint(ep, inferlb.Endpoint{ID: "replica-0"})
		}},
		{"idByHost turned on", `{}`, `{"idByHost": true}`, func(ep resolver.Endpoint) resolver.Endpoint { return ep }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := grpcfake.NewClientConn()
			cc := &hookCC{ClientConn: fake}
			bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
			t.Cleanup(bal.Close)
			parse := func(js string) *lbConfig {
				c, err := (&Builder{name: Name}).ParseConfig(json.RawMessage(js))
				if err != nil {
					t.Fatal(err)
				}
				return c.(*lbConfig)
			}
			update := func(cfg *lbConfig, eps []resolver.Endpoint) {
				t.Helper()
				if err := bal.UpdateClientConnState(balancer.ClientConnState{
					ResolverState: resolver.State{Endpoints: eps}, BalancerConfig: cfg,
				}); err != nil {
					t.Fatal(err)
				}
			}
			eps := endpoints(1)
			update(parse(tc.cfg), eps)
			for fake.ConnectAll() > 0 {
			}

			var errs []error
			cc.onNewSubConn = pickTen(fake, &errs)
			// The rename comes with a new endpoint, whose SubConn is the hook.
			next := append([]resolver.Endpoint{tc.rename(eps[0])}, endpoints(2)[1])
			update(parse(tc.next), next)
			cc.onNewSubConn = nil
			if len(errs) > 0 {
				t.Fatalf("%d of 10 calls failed while the rename was applied, first: %v", len(errs), errs[0])
			}
			// And after it the renamed endpoint serves.
			res, err := fake.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
			if err != nil {
				t.Fatalf("after the rename: %v", err)
			}
			res.Done(sent)
		})
	}
}

// A resolver update that replaces the endpoints (a single replica whose
// address changed, a blue/green switch) leaves nothing READY for a moment:
// the calls then queue until the new endpoints connect, as they do once
// the next picker is published. The calls that pick on the current
// picker while the policy applies the update must queue too, not fail
// UNAVAILABLE because the core's new endpoints are not ready yet.
func TestReplacingTheEndpointsFailsNoCall(t *testing.T) {
	fake := grpcfake.NewClientConn()
	cc := &hookCC{ClientConn: fake}
	bal := balancer.Get(Name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	update := func(eps []resolver.Endpoint) {
		t.Helper()
		if err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}); err != nil {
			t.Fatal(err)
		}
	}
	all := endpoints(4)
	update(all[:2])
	for fake.ConnectAll() > 0 {
	}
	var errs []error
	cc.onNewSubConn = pickTen(fake, &errs)
	update(all[2:])
	cc.onNewSubConn = nil
	if len(errs) > 0 {
		t.Fatalf("%d of %d calls failed while the update was applied, first: %v", len(errs), 10*2, errs[0])
	}
	// Once published, the next picker queues calls while the new endpoints
	// connect, and serves them after.
	if _, err := fake.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()}); err != balancer.ErrNoSubConnAvailable {
		t.Fatalf("while the new endpoints connect: %v, want the call queued", err)
	}
	for fake.ConnectAll() > 0 {
	}
	res, err := fake.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	if err != nil {
		t.Fatalf("once connected: %v", err)
	}
	res.Done(sent)
}

// A channel built while its shared core had no free membership fails its
// calls (TestSharedCoreWithoutAFreeMembership) and its resolver updates,
// which makes the DNS resolver resolve again with backoff. Once another
// channel has closed, the next update takes the freed membership and the
// channel serves.
func TestSharedCoreMembershipFreedLater(t *testing.T) {
	b := core.New(core.Options{})
	var held []*core.Membership
	for {
		m, err := b.NewMembership()
		if err != nil {
			break
		}
		held = append(held, m)
	}
	name := registerShared(b)
	cc := grpcfake.NewClientConn()
	bal := balancer.Get(name).Build(cc, balancer.BuildOptions{})
	t.Cleanup(bal.Close)
	update := func() error {
		return bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: endpoints(2)}})
	}
	if err := update(); !errors.Is(err, core.ErrTooManyMemberships) {
		t.Fatalf("first update: %v, want ErrTooManyMemberships", err)
	}
	held[0].Close()
	if err := update(); err != nil {
		t.Fatalf("update after a membership was freed: %v", err)
	}
	for cc.ConnectAll() > 0 {
	}
	res, err := cc.State().Picker.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
	if err != nil {
		t.Fatalf("pick after a membership was freed: %v", err)
	}
	res.Done(sent)
	if got := len(b.Stats()); got != 2 {
		t.Errorf("the shared core has %d endpoints, want the channel's 2", got)
	}
	for _, m := range held[1:] {
		m.Close()
	}
}
