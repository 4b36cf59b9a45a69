package grpcbalancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// An interceptor inside UnaryOutcome that gives an attempt up after its
// headers (a per-attempt timeout) and starts the next one at once, on
// another goroutine, without waiting for the first to end: the first
// attempt's Done (its park) runs as the second is picked. When the pick
// (and its look for a parked attempt, another) fell between park's first
// look and its hold, the first attempt stayed parked, its
// endpoint's call in flight, until the invoker returned: for the whole of
// the second attempt, which may take minutes. It is reported as the pick
// would have reported it (Unanswered), at once.
func TestInnerRetryPickedAsTheGivenUpAttemptParks(t *testing.T) {
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	clock, h, stats, ctx := innerRig(t)
	var first, second string
	invoker := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		pick := func(ctx context.Context) (string, balancer.PickResult) {
			return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		}
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		var res balancer.PickResult
		first, res = pick(actx)
		clock.Advance(30 * time.Second) // its headers came, then nothing
		cancel()                        // the timer fires
		var next balancer.PickResult
		rctx, rcancel := context.WithCancel(ctx)
		defer rcancel()
		own := ctx.Value(retryKey{}).(*retryState)
		race := func(st *retryState) {
			if st == own {
				second, next = pick(rctx) // the retry, on its own goroutine
			}
		}
		parkRace.Store(&race)
		defer parkRace.Store(nil)
		res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
		parkRace.Store(nil)
		require.NotNil(t, next.Done, "the retry was picked as the first attempt parked")
		s := stats(first)
		assert.EqualValues(t, 1, s.Unanswered, "the attempt given up, reported at once")
		if first != second {
			assert.Zero(t, s.InFlight, "its endpoint, free while the retry runs")
		}
		clock.Advance(time.Second)
		next.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		reply.(*testgrpc.SimpleResponse).Username = "the retry's"
		return nil
	}
	require.NoError(t, UnaryOutcome()(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, invoker))
	for _, id := range []string{first, second} {
		assert.Zero(t, stats(id).InFlight, "in flight at %s", id)
	}
	assert.EqualValues(t, 1, stats(first).Unanswered)
}
