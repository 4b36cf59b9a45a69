package grpcbalancer

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/internal/testutil/grpcfake"
)

func TestUnaryRetry(t *testing.T) {
	generous := core.New(core.Options{})
	none := core.New(core.Options{RetryRatio: -1, RetryFloor: -1})
	unavailable := status.Error(codes.Unavailable, "connection reset")
	tests := []struct {
		name     string
		b        *core.Balancer // recorded by the "picker"; nil = not an inferlb channel
		received bool           // the failed attempt had response bytes
		errs     []error        // per attempt; the last repeats
		calls    int
		ok       bool
	}{
		{"retried once then served", generous, false, []error{unavailable, nil}, 2, true},
		{"bounded attempts", generous, false, []error{unavailable}, 3, false},
		{"response had started", generous, true, []error{unavailable, nil}, 1, false},
		{"not a connection failure", generous, false, []error{status.Error(codes.Internal, "x"), nil}, 1, false},
		{"budget spent", none, false, []error{unavailable, nil}, 1, false},
		{"not routed by inferlb", nil, false, []error{unavailable, nil}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				st, inv := invokeFrom(ctx, method)
				if st == nil {
					t.Fatal("the interceptor put no retry state in the context")
				}
				if tt.b != nil {
					inv.core.Store(tt.b) // what the picker does
				}
				inv.received.Store(tt.received) // what Done does
				err := tt.errs[min(calls, len(tt.errs)-1)]
				calls++
				return err
			}
			err := UnaryRetry(3)(context.Background(), "/x.Y/Z", nil, nil, nil, invoker)
			if calls != tt.calls || (err == nil) != tt.ok {
				t.Errorf("%d attempts, err %v; want %d attempts, success %v", calls, err, tt.calls, tt.ok)
			}
		})
	}
}

// A retry is the same call again: when nothing but the endpoint it failed
// on can serve it, the fallback pick must not count its affinity key as
// seen again (that would inflate the key-reuse estimate behind MinKeyReuse).
func TestFailoverToTheOnlyEndpointIsNotASecondSighting(t *testing.T) {
	UnaryRetry(2) // turns on the retry-state lookup, as installing it does
	h := newHarness(t, Name, `{}`, 1)
	b := h.lb().core.Load()
	req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 12345} // top bits 0: a sampled key
	ctx := inferlb.NewContext(context.Background(), req)
	_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	require.EqualValues(t, 1, b.KeyReuse().Observed)

	st := &retryState{method: "/x.Y/Z"}
	failed := addr(0)
	st.exclude.Store(&failed)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.WithValue(ctx, retryKey{}, st)})
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	assert.Equal(t, addr(0), a, "the only endpoint takes the retry")
	assert.EqualValues(t, 1, b.KeyReuse().Observed, "the retry was counted as a new sighting of its key")
}

// gRPC's own retries (a retryPolicy in the service config) happen inside
// one invoker call and go through the picker: they count toward
// UnaryRetry's attempts, so the two together do not multiply them.
func TestUnaryRetryCountsGRPCsOwnAttempts(t *testing.T) {
	h := newHarness(t, Name, `{}`, 4)
	unavailable := status.Error(codes.Unavailable, "connection reset")
	// gRPC's attempts per invoke -> attempts sent in all: the interceptor
	// retries while fewer than 3 were sent.
	for grpcAttempts, want := range map[int]int{1: 3, 2: 4, 3: 3} {
		t.Run(fmt.Sprint(grpcAttempts, " per invoke"), func(t *testing.T) {
			sent, invokes := 0, 0
			invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				invokes++
				for range grpcAttempts { // what gRPC's retry policy does within one invoke
					_, res := h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: ctx})
					res.Done(balancer.DoneInfo{Err: unavailable, BytesSent: true})
					sent++
				}
				return unavailable
			}
			err := UnaryRetry(3)(context.Background(), "/x.Y/Z", nil, nil, nil, invoker)
			require.Error(t, err)
			assert.Equal(t, want, sent, "attempts sent (%d invokes)", invokes)
		})
	}
}

// The retry of a refusal as too long spends the retry budget (PickRetry)
// also when an earlier attempt of the call failed elsewhere: the call's
// exclusion then outlives that attempt, and the window retry once took
// the failover pick instead, which spends nothing and, with no window
// left that might take the call, went on to an endpoint remembered too
// small for it. Here the call's connection to its first endpoint breaks,
// its failover is refused as too long, and the budget (one retry) is
// spent: the call ends with the server's refusal after two attempts.
func TestWindowRetryAfterAFailureSpendsTheBudget(t *testing.T) {
	UnaryRetry(3) // turns on the retry-state lookup, as installing it does
	clock := testutil.NewClock()
	// One retry in the budget: the floor's first, then none for 10s.
	b := core.New(core.Options{Rand: testutil.NewRand(1), Clock: clock, RetryRatio: -1, RetryFloor: 0.1})
	h := newHarness(t, registerShared(b), `{}`, 2)
	lost := status.Error(codes.Unavailable, "connection reset")
	refused := status.Error(codes.InvalidArgument, "This model's maximum context length is 1000 tokens. However, your request has 5000 input tokens.")
	var picked []string
	invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("Pick: %v", err) // gRPC would wait for another picker
			}
			return err
		}
		a := res.SubConn.(*grpcfake.SubConn).Addr()
		picked = append(picked, a)
		if a == picked[0] { // the first endpoint's connection is broken
			res.Done(balancer.DoneInfo{Err: lost, BytesSent: true})
			return lost
		}
		res.Done(balancer.DoneInfo{Err: refused, BytesSent: true, BytesReceived: true})
		return refused
	}
	ctx := inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
	err := UnaryRetry(3)(ctx, "/x.Y/Z", nil, nil, nil, invoker)
	assert.Equal(t, refused, err, "the caller gets the server's refusal")
	assert.Len(t, picked, 2, "attempts: %v", picked)
	assert.Equal(t, core.RetryStats{Allowed: 1, Denied: 1}, b.RetryStats(), "the failover and the window retry each asked the budget")
}

// A window retry whose pick the core gives an endpoint this picker has no
// READY child for (it has just connected: the next picker, which has it,
// is on its way) waits for that picker. The picker once asked again
// without that endpoint, as for other picks, and a failover pick finds
// nothing else but endpoints remembered too small for the call: the retry
// went back to the endpoint that had just refused it, and each refusal
// made another, until maxAttempts.
func TestWindowRetryWaitsForTheEndpointThatJustConnected(t *testing.T) {
	UnaryRetry(3) // turns on the retry-state lookup, as installing it does
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 2)
	// Endpoint 1's connection drops, and it reconnects.
	h.subConn(addr(1)).SetState(balancer.SubConnState{ConnectivityState: connectivity.Idle})
	require.False(t, stats(t, b, addr(1)).Ready)
	stale := h.picker()

	// The call is refused by endpoint 0 as too long, and UnaryRetry
	// retries it.
	st := &retryState{method: "/x.Y/Z"}
	ctx := inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
	info := balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.WithValue(ctx, retryKey{}, st)}
	a, res := h.pick(info)
	require.Equal(t, addr(0), a)
	res.Done(balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "This model's maximum context length is 1000 tokens. However, your request has 5000 input tokens."), BytesSent: true, BytesReceived: true})
	require.True(t, st.first.tooLong.Load())
	st.first.windowRetry.Store(true) // what UnaryRetry does for its retry's invoke

	// Endpoint 1 is back: the core has it ready, and the next picker is
	// published; the retry's pick runs on the one before.
	for h.cc.ConnectAll() > 0 {
	}
	require.True(t, stats(t, b, addr(1)).Ready)
	_, err := stale.Pick(info)
	require.ErrorIs(t, err, balancer.ErrNoSubConnAvailable, "the retry waits for the next picker")
	a, res = h.pick(info)
	assert.Equal(t, addr(1), a, "the endpoint whose window is not known to be too small")
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	assert.Equal(t, uint64(1), stats(t, b, addr(0)).TooLong, "refused once")
	assert.Equal(t, core.RetryStats{Allowed: 1}, b.RetryStats(), "one retry, spent once")
}

// A call made under a retried call's context with another method (an
// interceptor further in, per-RPC credentials that fetch a token over
// gRPC) is not an attempt of the retried call: it neither avoids the
// endpoint the call failed on, nor records its Balancer, nor counts as
// one of the call's attempts.
func TestSideCallDoesNotShareTheRetryState(t *testing.T) {
	UnaryRetry(2) // turns on the retry-state lookup, as installing it does
	h := newHarness(t, Name, `{}`, 2)
	st := &retryState{method: "/ai.Gen/Chat"}
	failed := addr(0)
	st.exclude.Store(&failed)
	ctx := context.WithValue(context.Background(), retryKey{}, st)
	side := map[string]int{}
	for range 40 {
		a, res := h.pick(balancer.PickInfo{FullMethodName: "/auth.Token/Get", Ctx: ctx})
		res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		side[a]++
	}
	assert.Positive(t, side[addr(0)], "the side call avoided the endpoint the retried call failed on: %v", side)
	assert.Nil(t, st.first.core.Load(), "the side call recorded its Balancer as the call's")
	assert.Zero(t, st.sent.Load(), "the side call counted as the call's attempts")

	a, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Gen/Chat", Ctx: ctx})
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	assert.Equal(t, addr(1), a, "the call's own retry avoids where it failed")
	assert.NotNil(t, st.first.core.Load())
}

// A window retry whose pick the endpoint's child picker fails (its
// SubConn not ready after all) has spent its retry; gRPC's next pick of
// the attempt goes to a window that might take the call without spending
// another.
func TestWindowRetryChildErrorSpendsOnce(t *testing.T) {
	UnaryRetry(3) // turns on the retry-state lookup, as installing it does
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 2)
	cur := h.picker().(*picker)

	st := &retryState{method: "/x.Y/Z"}
	ctx := inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
	info := balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.WithValue(ctx, retryKey{}, st)}
	var a string
	var res balancer.PickResult
	for a != addr(0) { // the first attempt meets endpoint 0
		if a != "" {
			res.Done(balancer.DoneInfo{Err: context.Canceled})
		}
		a, res = h.pick(balancer.PickInfo{FullMethodName: "/x.Y/Z", Ctx: context.WithValue(ctx, retryKey{}, st)})
	}
	res.Done(balancer.DoneInfo{Err: status.Error(codes.InvalidArgument, "This model's maximum context length is 1000 tokens. However, your request has 5000 input tokens."), BytesSent: true, BytesReceived: true})
	require.True(t, st.first.tooLong.Load())
	st.first.windowRetry.Store(true) // what UnaryRetry does for its retry's invoke

	byID := maps.Clone(cur.children.byID)
	byID[addr(1)] = base.NewErrPicker(balancer.ErrNoSubConnAvailable)
	failing := &picker{mem: cur.mem, cfg: cur.cfg, children: newChildTable(b, byID)}
	_, err := failing.Pick(info)
	require.ErrorIs(t, err, balancer.ErrNoSubConnAvailable)
	require.Equal(t, core.RetryStats{Allowed: 1}, b.RetryStats())

	a, res = h.pick(info)
	assert.Equal(t, addr(1), a, "the endpoint whose window is not known to be too small")
	res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
	assert.Equal(t, core.RetryStats{Allowed: 1}, b.RetryStats(), "one retry, spent once")
}

// When gRPC's own retry policy retries a refusal as too long inside one
// invocation (its retryableStatusCodes name the refusal's code) and that
// attempt then fails otherwise, and no endpoint's window might take the
// call, the caller gets the server's refusal, not the later error.
func TestWindowRefusalOutlivesGRPCsOwnRetry(t *testing.T) {
	UnaryRetry(3) // turns on the retry-state lookup, as installing it does
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	lost := status.Error(codes.Unavailable, "connection reset")
	refused := status.Error(codes.Internal, "Prompt length (5000) exceeds maximum sequence length (1000).")
	invokes := 0
	invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		invokes++
		res, err := h.picker().Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		if err != nil {
			return err
		}
		if invokes > 1 {
			t.Fatal("the window retry was sent though no window might take the call")
		}
		res.Done(balancer.DoneInfo{Err: refused, BytesSent: true, BytesReceived: true})
		// gRPC's retry policy retries INTERNAL: the attempt's connection
		// breaks.
		res, err = h.picker().Pick(balancer.PickInfo{FullMethodName: method, Ctx: ctx})
		require.NoError(t, err)
		res.Done(balancer.DoneInfo{Err: lost, BytesSent: true})
		return lost
	}
	ctx := inferlb.NewContext(context.Background(), &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 100})
	err := UnaryRetry(3)(ctx, "/x.Y/Z", nil, nil, nil, invoker)
	assert.Equal(t, codes.Internal, status.Code(err), "%v", err)
	assert.Equal(t, status.Convert(refused).Message(), status.Convert(err).Message())
}
