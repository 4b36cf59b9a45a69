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

// UnaryRetry invokes again after an invoke that an interceptor inside it
// ended without waiting for its attempt (a per-attempt timeout that runs
// the invoker on a goroutine, cancels the attempt and returns UNAVAILABLE
// at once): that attempt ends during the next invoke. Each invoke's
// attempts settle against that invoke alone; one that ends after its
// invoke returned is reported at once, as grpc-go ended it, as one that
// ends after the call returned is (TestLateOrSecondCancelledAttemptIsReportedAtOnce).
//
//   - Cancelled after its headers, it was parked in the next invoke's
//     slot: it held its endpoint's load for the whole of that invoke's
//     attempt, and when the interceptor's timer gave that one up too,
//     with nothing back, the slot was taken, so that attempt was reported
//     as answered and the hung replica it ran on went unmarked, while the
//     left-over attempt took the reading of Unanswered.
//   - Answered (ended without error), it was held in the next invoke's
//     slot and settled with that invoke's error: a failure of another
//     attempt on another endpoint was charged to the endpoint that had
//     answered.
func TestLeftOverAttemptSettlesAgainstItsOwnInvoke(t *testing.T) {
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	timedOut := status.Error(codes.Unavailable, "the attempt timed out")
	t.Run("cancelled after its headers", func(t *testing.T) {
		clock, h, stats, ctx := innerRig(t)
		var left balancer.PickResult
		var leftID, hungID string
		invokes := 0
		inner := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			invokes++
			actx, cancel := context.WithCancel(ctx)
			defer cancel()
			pick := func() (string, balancer.PickResult) {
				return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: actx})
			}
			if invokes == 1 {
				leftID, left = pick() // its headers came, then nothing
				clock.Advance(30 * time.Second)
				cancel()        // the timer fires
				return timedOut // without waiting for the attempt to end
			}
			var res balancer.PickResult
			hungID, res = pick()
			require.NotEqual(t, leftID, hungID, "the retry goes to the endpoint with nothing in flight")
			// The left-over attempt ends now: gRPC's goroutine for it.
			left.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			assert.Zero(t, stats(leftID).InFlight, "the left-over attempt, reported as it ends")
			clock.Advance(30 * time.Second) // the retry's headers came, then nothing
			cancel()
			res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			return canceled
		}
		err := UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner)
		assert.Equal(t, canceled, err)
		require.Equal(t, 2, invokes)
		l, w := stats(leftID), stats(hungID)
		assert.Zero(t, l.InFlight+w.InFlight)
		assert.Zero(t, l.Unanswered, "the left-over attempt ended after its invoke returned: answered, as grpc-go ended it")
		assert.EqualValues(t, 1, l.Canceled)
		assert.EqualValues(t, 1, w.Unanswered, "the retry, given up with nothing back, its invoke's only attempt")
	})
	t.Run("answered", func(t *testing.T) {
		_, h, stats, ctx := innerRig(t)
		var left balancer.PickResult
		var leftID, failedID, thirdID string
		invokes := 0
		inner := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			invokes++
			pick := func() (string, balancer.PickResult) {
				return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
			}
			switch invokes {
			case 1:
				leftID, left = pick()
				return timedOut // without waiting for the attempt to end
			case 2:
				var res balancer.PickResult
				failedID, res = pick()
				require.NotEqual(t, leftID, failedID, "the retry goes to the endpoint with nothing in flight")
				// The left-over attempt's answer comes now, too late.
				left.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
				assert.EqualValues(t, 1, stats(leftID).Successes, "the left-over attempt, reported as it ends")
				res.Done(balancer.DoneInfo{Err: timedOut, BytesSent: true}) // the connection broke
				return timedOut
			}
			var res balancer.PickResult
			thirdID, res = pick()
			res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
			reply.(*testgrpc.SimpleResponse).Username = "answered"
			return nil
		}
		// The left-over attempt's answer, which its invoke's interceptor
		// had given up on, is no answer begun of the second invoke, which
		// broke before any byte came: that one is retried, as any such
		// failure (a third time, within maxAttempts).
		require.NoError(t, UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner))
		require.Equal(t, 3, invokes)
		assert.NotEqual(t, failedID, thirdID, "the third attempt avoids where the second failed")
		l, f := stats(leftID), stats(failedID)
		assert.Zero(t, l.InFlight+f.InFlight+stats(thirdID).InFlight)
		assert.Zero(t, l.Failures, "the endpoint that answered is not charged with the next invoke's failure")
		assert.EqualValues(t, 1, f.Failures, "the attempt that failed")
	})
}

// What UnaryRetry does after an invoke rests on that invoke's attempts:
// a left-over attempt of the invoke before it (an interceptor inside ours
// gave it up and returned without waiting) that ends while the next one
// runs decides nothing about that one's failure. It set the call's
// "response bytes received" and "endpoint does not serve the model" for
// the whole call: a second invoke that broke before any byte came was not
// retried, and its failure was taken for a not-served answer (a window
// retry next, and, when that could go nowhere, the second invoke's error
// returned in place of the last one's).
func TestLeftOverAttemptDoesNotDecideTheNextInvokesRetry(t *testing.T) {
	const method = "/grpc.testing.TestService/UnaryCall"
	timedOut := status.Error(codes.Unavailable, "the attempt timed out")
	broke := status.Error(codes.Unavailable, "connection reset")
	for _, tc := range []struct {
		name string
		left balancer.DoneInfo // how the left-over attempt ends
	}{
		{"its connection reset after its headers", balancer.DoneInfo{Err: broke, BytesSent: true, BytesReceived: true}},
		{"not served", balancer.DoneInfo{Err: status.Error(codes.NotFound, "Request for unknown model: 'llm' is not found"), BytesSent: true, BytesReceived: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, h, stats, ctx := innerRig(t)
			var left balancer.PickResult
			var ids []string
			last := status.Error(codes.Unavailable, "the third invoke's own error")
			invokes := 0
			inner := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				invokes++
				pick := func() (string, balancer.PickResult) {
					return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				}
				switch invokes {
				case 1:
					var id string
					id, left = pick()
					ids = append(ids, id)
					return timedOut // without waiting for the attempt to end
				case 2:
					id, res := pick()
					ids = append(ids, id)
					left.Done(tc.left)                                       // the left-over attempt ends now
					res.Done(balancer.DoneInfo{Err: broke, BytesSent: true}) // nothing came back
					return broke
				}
				return last // sent nowhere (no endpoint ready for it, say)
			}
			err := UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner)
			assert.Equal(t, 3, invokes, "the second invoke broke before any byte came: retried")
			assert.Equal(t, status.Convert(last).Message(), status.Convert(err).Message(), "the caller gets the last invoke's error")
			for _, id := range ids {
				assert.Zero(t, stats(id).InFlight, "in flight at %s", id)
			}
		})
	}
}

// gRPC retries a left-over attempt of UnaryRetry's first invoke
// transparently (its stream was refused) while the next invoke's attempt
// runs: the retry's pick is the first invoke's, as the attempt it
// retries is (the context it picks with carries that invoke). It was
// taken for the invoke under way: its attempt then read as a hedge's
// sibling, and when the interceptor's timer gave it up after its headers,
// with nothing back, it was reported answered, its hung replica
// unmarked; or, held with an answer until the invoke's error is known,
// it was settled as retried, neither success nor failure, by the
// left-over attempt's pick.
func TestLeftOverAttemptRetriedByGRPCPicksInItsOwnInvoke(t *testing.T) {
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	timedOut := status.Error(codes.Unavailable, "the attempt timed out")
	refused := status.Error(codes.Unavailable, "stream terminated by "+msgRefused)
	for _, answered := range []bool{false, true} {
		name := "given up after its headers"
		if answered {
			name = "answered"
		}
		t.Run(name, func(t *testing.T) {
			clock, h, stats, ctx := innerRig(t)
			var lctx context.Context
			var left balancer.PickResult
			var leftID, id string
			invokes := 0
			inner := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				invokes++
				pick := func(ctx context.Context) (string, balancer.PickResult) {
					return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				}
				if invokes == 1 {
					lctx = ctx // the attempt's context: the invoke's, left uncancelled
					leftID, left = pick(lctx)
					return timedOut // without waiting for the attempt
				}
				actx, cancel := context.WithCancel(ctx)
				defer cancel()
				var res balancer.PickResult
				id, res = pick(actx)
				require.NotEqual(t, leftID, id, "the retry goes to the endpoint with nothing in flight")
				clock.Advance(30 * time.Second)
				if answered {
					res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true}) // held for the invoke's error
				}
				// The left-over attempt's stream is refused, and gRPC
				// retries it at once, on its own goroutine.
				left.Done(balancer.DoneInfo{Err: refused, BytesSent: true})
				_, left = pick(lctx)
				if answered {
					reply.(*testgrpc.SimpleResponse).Username = "answered"
					return nil
				}
				cancel() // the timer gives the attempt up: its headers, then nothing
				res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				return canceled
			}
			err := UnaryRetry(3)(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, inner)
			require.Equal(t, 2, invokes)
			s := stats(id)
			if answered {
				require.NoError(t, err)
				assert.EqualValues(t, 1, s.Successes, "the answered attempt, settled with its invoke's error")
			} else {
				assert.Equal(t, canceled, err)
				assert.EqualValues(t, 1, s.Unanswered, "the attempt given up, its invoke's only one in flight")
			}
			left.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
			for _, id := range []string{leftID, id} {
				assert.Zero(t, stats(id).InFlight, "in flight at %s", id)
			}
		})
	}
}
