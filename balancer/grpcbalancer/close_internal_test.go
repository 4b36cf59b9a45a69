package grpcbalancer

import (
	"testing"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

// The policy's Close closes the core Balancer it made for the channel
// (balancer.Balancer.Close), which nothing else routes with, and never a
// Balancer given to NewBuilder, which is the caller's.
func TestCloseClosesOnlyTheCoreThePolicyMade(t *testing.T) {
	update := func(bal balancer.Balancer) {
		t.Helper()
		if err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: endpoints(2)}}); err != nil {
			t.Fatal(err)
		}
	}

	owned := balancer.Get(Name).Build(grpcfake.NewClientConn(), balancer.BuildOptions{})
	update(owned)
	b := owned.(*lbBalancer).core.Load()
	owned.Close()
	if _, err := b.Pick(&inferlb.Request{}); err != core.ErrClosed {
		t.Fatalf("the policy's own core after Close: Pick error %v, want ErrClosed", err)
	}

	shared := core.New(core.Options{})
	t.Cleanup(shared.Close)
	if err := shared.Update([]inferlb.Endpoint{{ID: "x", Addr: "10.0.0.9:1"}}); err != nil {
		t.Fatal(err)
	}
	given := NewBuilder("inferlb-close-test", shared).Build(grpcfake.NewClientConn(), balancer.BuildOptions{})
	update(given)
	given.Close()
	p, err := shared.Pick(&inferlb.Request{})
	if err != nil {
		t.Fatalf("a NewBuilder Balancer after the policy's Close: %v", err)
	}
	p.Done(inferlb.Outcome{})
}
