package grpcbalancer

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// No attempt parked for its reply (retryState.park) is left in flight, on
// any path the interceptor's invoker takes: an inner interceptor that
// panics after a cancelled attempt parked (invokeSettled's defer reports
// it); UnaryRetry's next invoke, in which an attempt that the first left
// running parks as it ends (the park is reopened per invoke, and that
// invoke's return reports it); and attempts that an inner interceptor
// ends on goroutines of its own as it returns, with or without a retry
// and a cancel, which park or are reported at once.
func TestParkedAttemptIsReportedOnEveryPath(t *testing.T) {
	b := core.New(core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1), RetryFloor: 1000})
	t.Cleanup(b.Close)
	h := newHarness(t, registerShared(b), `{"methods": {"/grpc.testing.TestService/": "llm"}}`, 3)
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	inFlight := func() (n int64) {
		for _, s := range b.Stats() {
			n += s.InFlight
		}
		return n
	}
	// The invoker panics with an attempt parked.
	for _, ic := range []grpc.UnaryClientInterceptor{UnaryOutcome(), UnaryRetry(3)} {
		ctx, cancel := context.WithCancel(context.Background())
		panicky := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			_, a := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
			cancel()
			a.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			panic("inner")
		}
		func() {
			defer func() { assert.Equal(t, "inner", recover()) }()
			_ = ic(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, panicky)
		}()
		assert.Zero(t, inFlight(), "panic")
	}
	// UnaryRetry: an attempt the first invoke left running parks in the
	// second.
	{
		ctx, cancel := context.WithCancel(context.Background())
		var left balancer.PickResult
		n := 0
		inner := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			n++
			if n == 1 {
				_, left = h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				return status.Error(codes.Unavailable, "gone")
			}
			_, a := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
			cancel()
			left.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			a.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			return canceled
		}
		_ = UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner)
		assert.Equal(t, 2, n)
		assert.Zero(t, inFlight(), "retry leftover")
	}
	// Attempts ended on goroutines as the invoker returns.
	for i := range 100 {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		n := 0
		inner := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			n++
			for range 3 {
				_, a := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				wg.Go(func() {
					if i%2 == 0 {
						cancel()
					}
					a.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				})
			}
			if n == 1 && i%3 == 0 {
				return status.Error(codes.Unavailable, "gone")
			}
			return canceled
		}
		_ = UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner)
		wg.Wait()
		cancel()
		require.Zero(t, inFlight(), "iteration %d", i)
	}
}
