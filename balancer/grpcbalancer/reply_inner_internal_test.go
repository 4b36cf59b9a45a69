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

// llmPair is the policy over a Balancer of its own on clock, with two
// endpoints and every method of the test service an LLM's: where the
// inner-hedge tests pick their attempts.
func llmPair(t *testing.T, clock core.Clock) (*core.Balancer, *harness) {
	t.Helper()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	return b, newHarness(t, registerShared(b), `{"methods": {"/grpc.testing.TestService/": "llm"}}`, 2)
}

// An interceptor chained inside UnaryOutcome or UnaryRetry that hedges a
// generation call: two attempts, each decoding into a reply of its own,
// the first to answer copying its reply into the call's and cancelling
// the other, which had only the server's headers. The loser's report
// comes from the goroutine the hedge ran it on, while the hedge fills the
// call's reply on its own: read there (in Done), the reply was read as
// still empty when the loser ended first, so an answered call counted its
// loser's endpoint as given up on with nothing back (Unanswered 1), and
// read as the hedge wrote it when they overlapped (a data race, which
// -race does not see: reflect's reads are not instrumented). The reply
// is read once the interceptor's invoker has returned, on the
// interceptor's goroutine: the call had its answer, and neither
// attempt's endpoint is charged. The caller cancels the call as the
// winner's answer comes (the loser, cancelled with it, is parked: an
// attempt that the hedge alone cancelled is reported at once, see
// TestInnerHedgeLoserLeavesNoLoadWhileTheCallGoesOn).
func TestInnerHedgeReplyIsReadAfterTheInvokerReturns(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ic        grpc.UnaryClientInterceptor
		loserLast bool // the loser ends as the hedge copies the winner's reply (racing)
	}{
		{"UnaryOutcome, the loser ends first", UnaryOutcome(), false},
		{"UnaryRetry, the loser ends first", UnaryRetry(2), false},
		{"UnaryOutcome, the loser ends as the reply is filled", UnaryOutcome(), true},
		{"UnaryRetry, the loser ends as the reply is filled", UnaryRetry(2), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, h := llmPair(t, testutil.NewClock())
			const method = "/grpc.testing.TestService/UnaryCall"
			canceled := status.Error(codes.Canceled, "context canceled")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hedge := func(ctx context.Context, method string, req, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				lctx, cancelLoser := context.WithCancel(ctx)
				defer cancelLoser()
				_, loser := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: lctx})
				_, winner := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				winner.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
				cancel() // the caller's, which ends the loser too
				var wg sync.WaitGroup
				wg.Go(func() { // gRPC ends the loser on the hedge's goroutine for it
					loser.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				})
				if !tc.loserLast {
					wg.Wait()
				}
				reply.(*testgrpc.SimpleResponse).Username = "the winner's" // proto.Merge of the winner's reply
				wg.Wait()
				return nil
			}
			reply := &testgrpc.SimpleResponse{}
			require.NoError(t, tc.ic(ctx, method, &testgrpc.SimpleRequest{}, reply, nil, hedge))
			var unanswered, canceledN, successes uint64
			for _, s := range b.Stats() {
				unanswered += s.Unanswered
				canceledN += s.Canceled
				successes += s.Successes
				assert.Zero(t, s.InFlight, s.ID)
			}
			assert.EqualValues(t, 1, successes, "the winner")
			assert.EqualValues(t, 1, canceledN, "the loser")
			assert.Zero(t, unanswered, "the call was answered: no endpoint is charged for the loser")
		})
	}
}

// An attempt that an interceptor inside ours left running when it
// returned, cancelled by its caller after its server's headers, ends
// after the invoker returned: nothing would report a parked attempt then,
// so it is reported at once, as answered (the reply is the
// application's again), and leaves nothing in flight. So is a second
// such attempt that ends while the first is parked (an inner hedge's).
func TestLateOrSecondCancelledAttemptIsReportedAtOnce(t *testing.T) {
	b, h := llmPair(t, testutil.NewClock())
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	inFlight := func() (n int64) {
		for _, s := range b.Stats() {
			n += s.InFlight
		}
		return n
	}
	unanswered := func() (n uint64) {
		for _, s := range b.Stats() {
			n += s.Unanswered
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	var late balancer.PickResult
	leave := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		_, late = h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		return status.Error(codes.DeadlineExceeded, "the inner interceptor gave up")
	}
	require.Error(t, UnaryOutcome()(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, leave))
	cancel()
	late.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
	assert.Zero(t, inFlight(), "reported at once")
	assert.Zero(t, unanswered(), "the reply is the application's: answered")

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	two := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		_, first := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		_, second := h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		cancel()
		first.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
		assert.EqualValues(t, 2, inFlight(), "the first is parked")
		second.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
		assert.EqualValues(t, 1, inFlight(), "the second is reported at once")
		assert.Zero(t, unanswered(), "as answered")
		return canceled
	}
	require.Error(t, UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, two))
	assert.Zero(t, inFlight())
	assert.EqualValues(t, 1, unanswered(), "the parked one, its reply still empty as the invoker returned")
}
