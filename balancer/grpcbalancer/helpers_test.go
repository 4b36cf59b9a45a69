package grpcbalancer

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness drives one policy instance on a fake ClientConn.
type harness struct {
	t   testing.TB
	cc  *grpcfake.ClientConn
	bal balancer.Balancer
	cfg serviceconfig.LoadBalancingConfig
}

// newHarness builds the policy registered as name, parses cfgJSON with it
// and gives it n endpoints, all connected.
func newHarness(t testing.TB, name, cfgJSON string, n int) *harness {
	t.Helper()
	return newHarnessWith(t, name, cfgJSON, endpoints(n))
}

// newHarnessWith is newHarness with the given endpoints.
func newHarnessWith(t testing.TB, name, cfgJSON string, eps []resolver.Endpoint) *harness {
	t.Helper()
	bb := balancer.Get(name)
	if bb == nil {
		t.Fatalf("policy %q not registered", name)
	}
	h := &harness{t: t, cc: grpcfake.NewClientConn()}
	h.bal = bb.Build(h.cc, balancer.BuildOptions{})
	t.Cleanup(h.bal.Close)
	if p, ok := bb.(balancer.ConfigParser); ok {
		cfg, err := p.ParseConfig(json.RawMessage(cfgJSON))
		if err != nil {
			t.Fatalf("ParseConfig(%s): %v", cfgJSON, err)
		}
		h.cfg = cfg
	}
	h.updateEndpoints(eps)
	h.settle(len(eps))
	return h
}

func addr(i int) string { return fmt.Sprintf("10.0.0.%d:50051", i) }

func endpoints(n int) []resolver.Endpoint {
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(i)}}}
	}
	return eps
}

// update gives the policy endpoints 0..n-1.
func (h *harness) update(n int) {
	h.t.Helper()
	h.updateEndpoints(endpoints(n))
}

func (h *harness) updateEndpoints(eps []resolver.Endpoint) {
	h.t.Helper()
	err := h.bal.UpdateClientConnState(balancer.ClientConnState{
		ResolverState:  resolver.State{Endpoints: eps},
		BalancerConfig: h.cfg,
	})
	if err != nil {
		h.t.Fatalf("UpdateClientConnState: %v", err)
	}
}

// settle connects SubConns until want of them are READY. Lazy policies
// (ring_hash) ask for connections from picks, on goroutines of their own, so
// it also picks with random hashes and yields; it gives up after 5s.
func (h *harness) settle(want int) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; ; i++ {
		h.cc.ConnectAll()
		if h.readySubConns() >= want && h.cc.State().ConnectivityState == connectivity.Ready {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("only %d of %d SubConns READY after 5s (state %v)", h.readySubConns(), want, h.cc.State().ConnectivityState)
		}
		if p := h.cc.State().Picker; p != nil {
			_, _ = p.Pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.Background()})
		}
		runtime.Gosched()
	}
}

func (h *harness) readySubConns() int {
	n := 0
	for _, sc := range h.cc.SubConns() {
		if sc.IsReady() {
			n++
		}
	}
	return n
}

func (h *harness) picker() balancer.Picker { return h.cc.State().Picker }

// pick picks once and reports the chosen address; it fails the test on error.
func (h *harness) pick(info balancer.PickInfo) (string, balancer.PickResult) {
	h.t.Helper()
	if info.Ctx == nil {
		info.Ctx = context.Background()
	}
	res, err := h.picker().Pick(info)
	if err != nil {
		h.t.Fatalf("Pick: %v", err)
	}
	return res.SubConn.(*grpcfake.SubConn).Addr(), res
}

// subConn returns the live SubConn for address a.
func (h *harness) subConn(a string) *grpcfake.SubConn {
	h.t.Helper()
	var found *grpcfake.SubConn
	for _, sc := range h.cc.SubConns() {
		if sc.Addr() == a && !sc.IsShutdown() {
			found = sc
		}
	}
	if found == nil {
		h.t.Fatalf("no live SubConn for %s", a)
	}
	return found
}

// lbOf returns the inferlb policy instance behind a harness.
func (h *harness) lb() *lbBalancer { return h.bal.(*lbBalancer) }

// onlySubConn returns the policy's one SubConn.
func (h *harness) onlySubConn(t *testing.T) *subConn {
	t.Helper()
	lb := h.lb()
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if len(lb.subConns) != 1 {
		t.Fatalf("%d SubConns, want 1", len(lb.subConns))
	}
	for s := range lb.subConns {
		return s
	}
	return nil
}

func coreForTest() *core.Balancer { return core.New(core.Options{}) }

// awaitIdle waits until no endpoint of b has a call in flight: gRPC, and a
// context's AfterFunc, end some calls on goroutines of their own. It looks
// again at each Done, not on a timer, and fails the test after 5s.
func awaitIdle(t *testing.T, b *core.Balancer, what string) {
	t.Helper()
	idle := func() bool {
		for _, s := range b.Stats() {
			if s.InFlight != 0 {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := testhook.Await(ctx, b, idle); err != nil {
		t.Fatalf("%s: still in flight after 5s: %+v", what, b.Stats())
	}
}
