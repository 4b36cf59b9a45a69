package grpcbalancer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An attempt that ends without error is held until the call's error is
// known (retryState.hold): the call's failure is the attempt's; its
// success is the attempt's; and an attempt gRPC then retried failed, with
// an error of its retry policy's, and counts as neither. None stays in
// flight.
func TestHeldAttemptIsSettledByTheCallsError(t *testing.T) {
	b := core.New(core.Options{Rand: testutil.NewRand(1)})
	h := newHarness(t, registerShared(b), `{}`, 1)
	ok := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	inFlight := func() int64 { return b.Stats()[0].InFlight }

	st := &retryState{}
	ctx := context.WithValue(context.Background(), retryKey{}, st)
	retryInUse.Store(true)
	a, res := h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(ok)
	assert.EqualValues(t, 1, inFlight(), "held until the call returns")
	st.settle(status.Error(codes.ResourceExhausted, "rate limited"))
	s := stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the call's error")
	assert.Zero(t, inFlight())

	st = &retryState{}
	ctx = context.WithValue(context.Background(), retryKey{}, st)
	_, res = h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx})
	res.Done(ok)
	_, res = h.pick(balancer.PickInfo{FullMethodName: "/svc/M", Ctx: ctx}) // gRPC retries it
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{0, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the retried attempt counts as neither")
	assert.EqualValues(t, 1, inFlight(), "the retry")
	res.Done(ok)
	st.settle(nil)
	s = stats(t, b, a)
	assert.Equal(t, [3]uint64{1, 0, 1}, [3]uint64{s.Successes, s.Failures, s.Overloads}, "the call's success")
	assert.Zero(t, inFlight())
}
