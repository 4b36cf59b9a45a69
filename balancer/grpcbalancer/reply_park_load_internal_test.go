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

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An interceptor chained inside UnaryOutcome or UnaryRetry hedges a
// generation call and commits to the attempt whose server sent its
// headers first, cancelling the other (which had its headers too); the
// committed attempt's answer then takes 30 s (a long generation). The
// loser was parked for a reading of the reply (retryState.park) while the
// call's caller was still waiting: its endpoint kept the call in flight,
// its request and its 1,200 tokens, for those 30 s, until the invoker
// returned, and the picks made meanwhile saw it loaded. A cancel that is
// not the caller's (the call's own context is not cancelled) says nothing
// of a wait the caller gave up on, so the attempt is reported at once, as
// answered (cancelled), as grpc-go ended it: its endpoint is free again.
//
// When the committed attempt then hangs and the caller gives up, the
// reply is empty as the invoker returns: the loser, parked first, was
// read as the call abandoned with nothing back (Unanswered), and the
// attempt the caller gave up on, finding the park taken, was reported as
// answered. Now the loser is no longer parked, and the hung attempt is
// the one read as Unanswered.
func TestInnerHedgeLoserLeavesNoLoadWhileTheCallGoesOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		ic   grpc.UnaryClientInterceptor
		hang bool // the committed attempt never answers; the caller cancels
	}{
		{"UnaryOutcome", UnaryOutcome(), false},
		{"UnaryRetry", UnaryRetry(2), false},
		{"UnaryOutcome, the committed attempt hangs", UnaryOutcome(), true},
		{"UnaryRetry, the committed attempt hangs", UnaryRetry(2), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b, h := llmPair(t, clock)
			const method = "/grpc.testing.TestService/UnaryCall"
			canceled := status.Error(codes.Canceled, "context canceled")
			stats := func(id string) core.EndpointStats {
				for _, s := range b.Stats() {
					if s.ID == id {
						return s
					}
				}
				t.Fatalf("no endpoint %q", id)
				return core.EndpointStats{}
			}
			req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 1000, MaxOutputTokens: 200}
			ctx, cancel := context.WithCancel(inferlb.NewContext(context.Background(), req))
			defer cancel()
			var loserID, winnerID string
			hedge := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				lctx, cancelLoser := context.WithCancel(ctx)
				defer cancelLoser()
				var loser, winner balancer.PickResult
				loserID, loser = h.pick(balancer.PickInfo{FullMethodName: method, Ctx: lctx})
				winnerID, winner = h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
				require.NotEqual(t, loserID, winnerID, "two endpoints, two distinct picks")
				assert.EqualValues(t, 1, stats(loserID).InFlight)
				assert.EqualValues(t, 1200, stats(loserID).InFlightTokens)
				// The winner's headers came first: the hedge commits to it.
				cancelLoser()
				loser.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				for range 30 { // the winner's generation, a second at a time
					clock.Advance(time.Second)
					s := stats(loserID)
					assert.Zero(t, s.InFlight, "the loser's endpoint at %v", clock.Now())
					assert.Zero(t, s.InFlightTokens, "the loser's endpoint at %v", clock.Now())
					assert.EqualValues(t, 1, s.Canceled, "reported as grpc-go ended it")
				}
				if tc.hang {
					cancel() // the caller gives up
					winner.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
					return canceled
				}
				winner.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
				reply.(*testgrpc.SimpleResponse).Username = "the winner's"
				return nil
			}
			err := tc.ic(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, hedge)
			l, w := stats(loserID), stats(winnerID)
			assert.Zero(t, l.InFlight+w.InFlight)
			assert.EqualValues(t, 1, l.Canceled, "the loser")
			assert.Zero(t, l.Unanswered, "cancelled by the hedge, not by the caller")
			if tc.hang {
				require.Error(t, err)
				assert.EqualValues(t, 1, w.Canceled)
				assert.EqualValues(t, 1, w.Unanswered, "the attempt the caller gave up on, its reply empty")
			} else {
				require.NoError(t, err)
				assert.EqualValues(t, 1, w.Successes)
			}
		})
	}
}
