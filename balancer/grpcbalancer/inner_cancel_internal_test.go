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

// An interceptor chained inside UnaryOutcome or UnaryRetry that cancels
// an attempt after its server's headers, while the caller still waits:
//
//   - a per-attempt timeout (context.WithCancel and a timer) on the call's
//     only attempt, then returning its CANCELLED: the attempt had nothing
//     back (its reply is empty as the invoker returns) and is Unanswered,
//     as if the caller had given up. It read as answered, so a hung
//     replica behind such a timeout fed no signal. With the answer's
//     message decoded into the reply (its status held back) it is
//     answered;
//   - the same timeout, then a retry: the attempt given up is reported
//     Unanswered as the retry is picked, its endpoint freed then, not held
//     while the retry runs;
//   - the same timeout on an attempt that gRPC retried within it
//     (transparently, or by a retry policy), or after a retry of the
//     interceptor's that timed out too: the attempt given up was the only
//     one in flight, and is Unanswered (see afterRetried);
//   - a hedge whose loser was picked after the attempt it keeps (the
//     first attempt's headers came first): the loser is reported at once,
//     as answered, whichever order the two were picked in (the order of
//     TestInnerHedgeLoserLeavesNoLoadWhileTheCallGoesOn is the other).
func TestInnerCancelOfAnAttemptAfterItsHeaders(t *testing.T) {
	const method = "/grpc.testing.TestService/UnaryCall"
	canceled := status.Error(codes.Canceled, "context canceled")
	for _, ic := range []struct {
		name string
		ic   grpc.UnaryClientInterceptor
	}{{"UnaryOutcome", UnaryOutcome()}, {"UnaryRetry", UnaryRetry(2)}} {
		for _, tc := range []struct {
			name string
			// inner is the interceptor inside: it makes its attempts
			// through pick and returns the call's error.
			inner      func(t *testing.T, ctx context.Context, reply any, pick func(context.Context) (string, balancer.PickResult), stats func(string) core.EndpointStats, clock *testutil.Clock) (ids []string, err error)
			unanswered []uint64 // per attempt, in the order inner returns them
		}{
			{"per-attempt timeout", func(t *testing.T, ctx context.Context, _ any, pick func(context.Context) (string, balancer.PickResult), _ func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
				actx, cancel := context.WithCancel(ctx)
				defer cancel()
				id, res := pick(actx)
				clock.Advance(30 * time.Second) // the attempt's budget, its headers come and then nothing
				cancel()                        // the timer fires
				res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				return []string{id}, canceled
			}, []uint64{1}},
			{"per-attempt timeout after the answer's message", func(t *testing.T, ctx context.Context, reply any, pick func(context.Context) (string, balancer.PickResult), _ func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
				actx, cancel := context.WithCancel(ctx)
				defer cancel()
				id, res := pick(actx)
				reply.(*testgrpc.SimpleResponse).Username = "decoded" // the message came, its status did not
				clock.Advance(30 * time.Second)
				cancel()
				res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				return []string{id}, canceled
			}, []uint64{0}},
			{"per-attempt timeout, then a retry", func(t *testing.T, ctx context.Context, reply any, pick func(context.Context) (string, balancer.PickResult), stats func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
				actx, cancel := context.WithCancel(ctx)
				defer cancel()
				first, res := pick(actx)
				clock.Advance(30 * time.Second)
				cancel()
				res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				rctx, rcancel := context.WithCancel(ctx)
				defer rcancel()
				second, res := pick(rctx)
				s := stats(first)
				assert.EqualValues(t, 1, s.Unanswered, "the attempt given up, reported as the retry is picked")
				if first != second {
					assert.Zero(t, s.InFlight, "its endpoint, free while the retry runs")
				}
				clock.Advance(time.Second)
				res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
				reply.(*testgrpc.SimpleResponse).Username = "the retry's"
				return []string{first, second}, nil
			}, []uint64{1, 0}},
			{"a hedge's loser picked second", func(t *testing.T, ctx context.Context, reply any, pick func(context.Context) (string, balancer.PickResult), stats func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
				wctx, cancelWinner := context.WithCancel(ctx)
				defer cancelWinner()
				lctx, cancelLoser := context.WithCancel(ctx)
				defer cancelLoser()
				winnerID, winner := pick(wctx)
				clock.Advance(30 * time.Second) // the hedge's delay, long enough to count
				loserID, loser := pick(lctx)
				cancelLoser() // the first attempt's headers came first
				loser.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
				if loserID != winnerID {
					assert.Zero(t, stats(loserID).InFlight, "the loser's endpoint, free at once")
				}
				assert.Zero(t, stats(loserID).Unanswered)
				clock.Advance(time.Second)
				winner.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
				reply.(*testgrpc.SimpleResponse).Username = "the winner's"
				return []string{winnerID, loserID}, nil
			}, []uint64{0, 0}},
			{"per-attempt timeout, then a retry that times out too", func(t *testing.T, ctx context.Context, _ any, pick func(context.Context) (string, balancer.PickResult), stats func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
				var ids []string
				for range 2 {
					actx, cancel := context.WithCancel(ctx)
					defer cancel()
					id, res := pick(actx)
					clock.Advance(30 * time.Second)
					cancel()
					res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
					ids = append(ids, id)
				}
				return ids, canceled
			}, []uint64{1, 1}},
			// gRPC's own retries within the attempt the interceptor
			// timed out: the attempt before ended before the next was
			// picked (grpc-go's retryLocked), and the one the
			// interceptor gave up is the call's only one in flight.
			{"per-attempt timeout after a transparent retry of a refused stream", afterRetried(balancer.DoneInfo{Err: status.Error(codes.Unavailable, "stream terminated by "+msgRefused), BytesSent: true}), []uint64{0, 1}},
			{"per-attempt timeout after a transparent retry of a stream a GOAWAY dropped", afterRetried(balancer.DoneInfo{Err: status.Error(codes.Unavailable, msgGoAway), BytesSent: true}), []uint64{0, 1}},
			{"per-attempt timeout after a transparent retry of a stream reset as it was written", afterRetried(balancer.DoneInfo{BytesSent: true}), []uint64{0, 1}},
			{"per-attempt timeout after a transparent retry of an attempt without a stream", afterRetried(balancer.DoneInfo{Err: status.Error(codes.Unavailable, "connection closed")}), []uint64{0, 1}},
			{"per-attempt timeout after a retry policy's retry", afterRetried(balancer.DoneInfo{Err: status.Error(codes.Unavailable, "shedding load"), BytesSent: true, BytesReceived: true}), []uint64{0, 1}},
		} {
			t.Run(ic.name+", "+tc.name, func(t *testing.T) {
				clock, h, stats, ctx := innerRig(t)
				var ids []string
				var innerErr error
				invoker := func(ctx context.Context, method string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
					pick := func(ctx context.Context) (string, balancer.PickResult) {
						return h.pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
					}
					ids, innerErr = tc.inner(t, ctx, reply, pick, stats, clock)
					return innerErr
				}
				err := ic.ic(ctx, method, &testgrpc.SimpleRequest{}, &testgrpc.SimpleResponse{}, nil, invoker)
				assert.Equal(t, innerErr, err)
				require.Len(t, ids, len(tc.unanswered))
				want := map[string]uint64{}
				for i, id := range ids {
					want[id] += tc.unanswered[i]
				}
				for id, n := range want {
					s := stats(id)
					assert.Equal(t, n, s.Unanswered, "Unanswered at %s", id)
					assert.Zero(t, s.InFlight, "in flight at %s", id)
				}
			})
		}
	}
}

// afterRetried is an inner interceptor's per-attempt timeout whose
// attempt gRPC retried within itself (transparently, or by a retry
// policy) after its first try ended with first: the retry got its
// server's headers and then nothing, and the timer gave it up. The retry
// was the only attempt in flight when it was given up, and is
// Unanswered: the try before it, ended before the retry was picked, is
// no hedge's sibling. It read as a hedge's loser, answered, and the hung
// replica behind it fed no signal.
func afterRetried(first balancer.DoneInfo) func(*testing.T, context.Context, any, func(context.Context) (string, balancer.PickResult), func(string) core.EndpointStats, *testutil.Clock) ([]string, error) {
	return func(t *testing.T, ctx context.Context, _ any, pick func(context.Context) (string, balancer.PickResult), _ func(string) core.EndpointStats, clock *testutil.Clock) ([]string, error) {
		canceled := status.Error(codes.Canceled, "context canceled")
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		refused, res := pick(actx)
		res.Done(first) // gRPC ends the try before it picks the retry
		retried, res := pick(actx)
		clock.Advance(30 * time.Second) // the retry's headers came, then nothing
		cancel()
		res.Done(balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true})
		return []string{refused, retried}, canceled
	}
}

// innerRig is the setup of the inner-interceptor tests: a harness of two
// endpoints on a shared Balancer with a test clock, a lookup of an
// endpoint's stats by ID, and a context carrying an LLM call's Request.
func innerRig(t *testing.T) (*testutil.Clock, *harness, func(string) core.EndpointStats, context.Context) {
	clock := testutil.NewClock()
	b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
	t.Cleanup(b.Close)
	h := newHarness(t, registerShared(b), `{"methods": {"/grpc.testing.TestService/": "llm"}}`, 2)
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
	return clock, h, stats, inferlb.NewContext(context.Background(), req)
}
