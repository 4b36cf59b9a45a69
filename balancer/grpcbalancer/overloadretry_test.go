package grpcbalancer_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
)

// The core's probation after repeated overload answers applies to gRPC
// too: one backend answers every call RESOURCE_EXHAUSTED with a pushback
// of 1s, the other serves; the caller retries each call at exactly the
// pushback on the fake clock, three attempts in all, 300 ms between calls.
// Before, each retry found the refusing backend back from its cooldown
// and tied with the healthy one (3 of 30 calls failed all three attempts,
// in each of three runs); now the backend that refuses the retry sent at its pushback
// is second choice for a while, and no call fails.
func TestE2EPushbackRetriesAvoidRefusingBackend(t *testing.T) {
	bs := fleet(t, 2, func(i int, b *backend) {
		if i == 0 {
			b.reject = status.Error(codes.ResourceExhausted, "busy")
			b.rejectTrailer = metadata.Pairs("grpc-retry-pushback-ms", "1000")
		}
	})
	clock := testutil.NewClock()
	name, bal := shared(t, core.Options{Clock: clock, Rand: testutil.NewRand(5), SlowStartWindow: -1})
	conn, _ := dial(t, bs, name, `{}`)
	conn.Connect()
	// Both backends ready before the first call: gRPC reports READY on
	// goroutines of its own; look again at each change (testhook).
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testhook.Await(wctx, bal, func() bool {
		return stats(t, bal, bs[0].addr).Ready && stats(t, bal, bs[1].addr).Ready
	}); err != nil {
		t.Fatalf("backends not ready in 10s: %v", err)
	}
	client := testgrpc.NewTestServiceClient(conn)
	ctx := testContext(t)
	failed := 0
	for range 30 {
		served := false
		for attempt := range 3 {
			_, err := client.EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
			if err == nil {
				served = true
				break
			}
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("call: %v", err)
			}
			if attempt < 2 {
				clock.Advance(time.Second) // the pushback
			}
		}
		if !served {
			failed++
		}
		clock.Advance(300 * time.Millisecond)
	}
	t.Logf("%d of 30 calls failed, %d attempts refused", failed, bs[0].calls.Load())
	if failed != 0 {
		t.Errorf("%d of 30 calls failed all three attempts", failed)
	}
}
