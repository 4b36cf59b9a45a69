package grpcbalancer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// tenantServer answers EmptyCall after 20 ms of work on the core's fake
// clock, or, with refuseA set, tenant A's calls (x-tenant: A)
// UNAUTHENTICATED at once: a replica that A's key has not reached yet.
type tenantServer struct {
	testgrpc.UnimplementedTestServiceServer
	clock   *testutil.Clock
	refuseA atomic.Bool
	a, b    atomic.Int64 // calls of A's and of B's
}

func (s *tenantServer) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) > 0 && v[0] == "A" {
		s.a.Add(1)
		if s.refuseA.Load() {
			return nil, status.Error(codes.Unauthenticated, "invalid API key")
		}
	} else {
		s.b.Add(1)
	}
	s.clock.Advance(20 * time.Millisecond)
	return &testgrpc.Empty{}, nil
}

// TestE2ETenantRefusedOnOneServer: of three embedding servers on
// loopback, one answers tenant A's calls UNAUTHENTICATED and B's well.
// The policy names the call's tenant in its outcome, so that server is
// passed over for A's calls only: B's still go there. The tenant comes
// from tenantHeader, or from an inferlb.Request in the call's context
// (inferlb.NewContext), the way a caller that sets the call's model and
// tokens there names it (the server tells the tenants apart by metadata
// either way). With the context's Request, the outcome named no tenant
// when the Request's Service was set: A's refusals counted for no tenant,
// and the server that refuses A was shunned for B's calls too (16 of
// B's 300, no pair passed over).
func TestE2ETenantRefusedOnOneServer(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		ctxFor       func(ctx context.Context, tenant string) context.Context
	}{
		{"tenantHeader", `{"defaultService": "embedding", "tenantHeader": "x-tenant"}`,
			func(ctx context.Context, tenant string) context.Context {
				return metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant)
			}},
		{"context Request", `{"defaultService": "embedding"}`,
			func(ctx context.Context, tenant string) context.Context {
				return inferlb.NewContext(metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant),
					&inferlb.Request{Service: inferlb.ServiceEmbedding, Tenant: tenant})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			servers := make([]*tenantServer, 3)
			for i := range servers {
				servers[i] = &tenantServer{clock: clock}
			}
			bs := testBackends(t, servers...)
			name, b := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(3), SlowStartWindow: -1})
			conn, _ := dial(t, bs, name, tc.config)
			client := testgrpc.NewTestServiceClient(conn)
			ctx := testContext(t)
			ctxA, ctxB := tc.ctxFor(ctx, "A"), tc.ctxFor(ctx, "B")
			// Every server connected and answering first.
			callUntil(t, client, ctxB, func() bool {
				return servers[0].b.Load() > 0 && servers[1].b.Load() > 0 && servers[2].b.Load() > 0
			})
			bad := servers[2]
			bad.refuseA.Store(true)
			a0, b0 := bad.a.Load(), bad.b.Load()
			const n = 600
			refused := 0
			for i := range n {
				c := ctxB
				if i%2 == 0 {
					c = ctxA
				}
				_, err := client.EmptyCall(c, &testgrpc.Empty{}, grpc.WaitForReady(true))
				switch status.Code(err) {
				case codes.OK:
				case codes.Unauthenticated:
					refused++
				default:
					t.Fatal(err)
				}
			}
			drewA, drewB := bad.a.Load()-a0, bad.b.Load()-b0
			t.Logf("the server refusing A drew %d of A's %d calls (%d refused) and %d of B's", drewA, n/2, refused, drewB)
			if refused >= 30 {
				t.Errorf("%d of A's %d calls refused", refused, n/2)
			}
			if drewB <= n/2/5 {
				t.Errorf("the server refusing A drew %d of B's %d calls", drewB, n/2)
			}
			var passedOver int
			for _, s := range b.Stats() {
				passedOver += s.RefusedTenants
			}
			if passedOver != 1 {
				t.Errorf("%d endpoint-tenant pairs passed over, want 1 (the server refusing A, for A)", passedOver)
			}
		})
	}
}
