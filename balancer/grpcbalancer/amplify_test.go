package grpcbalancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestE2EUnaryRetryModelNobodyServes: a model none of six Triton servers
// serves (a typo), called through UnaryRetry(20). The first call meets
// each server once and ends with the server's NOT_FOUND as it came; later
// calls, with every server remembered without the model, meet one server
// each, as over HTTP (TestModelNobodyServes). Before, a retry that found
// every server remembered without the model went to one of them anyway
// (PickFailover's last resort): the first call made 20 requests, each
// server answering the same NOT_FOUND three or four times, and each later
// call made up to 20 too, until the retry budget ran out (one typo caller
// spent the fleet's budget that real failovers need: 100 banked retries in
// its first six calls).
func TestE2EUnaryRetryModelNobodyServes(t *testing.T) {
	const n = 6
	var bs []*backend
	for range n {
		bs = append(bs, &backend{reject: status.Error(codes.NotFound, "Request for unknown model: 'typo' is not found")})
	}
	clock := testutil.NewClock()
	client, b := retryClient(t, bs, core.Options{Rand: testutil.NewRand(3), Clock: clock}, `{"modelHeader": "x-model"}`, 20)
	ctx := metadata.AppendToOutgoingContext(testContext(t), "x-model", "typo")
	_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.Equal(t, "Request for unknown model: 'typo' is not found", status.Convert(err).Message())
	assert.Equal(t, int64(n), served(bs), "the first call meets every server once")
	for _, be := range bs {
		assert.Equal(t, int64(1), be.calls.Load())
	}
	for i := 1; i <= 20; i++ {
		clock.Advance(100 * time.Millisecond)
		_, err = client.EmptyCall(ctx, &testgrpc.Empty{})
		require.Equal(t, codes.NotFound, status.Code(err), "call %d: %v", i, err)
		require.Equal(t, int64(n+i), served(bs), "call %d meets one server", i)
	}
	assert.Equal(t, uint64(n-1), b.RetryStats().Allowed, "the first call's retries, and no more")
}

// TestE2EUnaryRetryMadeUpModelsFlood: 1,000 calls, each for a model of its
// own that none of 16 servers serves, through UnaryRetry(100), one a
// millisecond: the retry budget bounds the requests to 1,000 plus the
// retries it allows (half the 100 banked, 20% of the calls, 10 a second),
// not 1,000 times the servers met. The rest of the bank is failover's: the
// flood used to spend it all, and a server dying right after failed its
// calls with no failover for some 10 s.
func TestE2EUnaryRetryMadeUpModelsFlood(t *testing.T) {
	var bs []*backend
	for range 16 {
		bs = append(bs, &backend{reject: status.Error(codes.NotFound, "Request for unknown model: 'x' is not found")})
	}
	clock := testutil.NewClock()
	client, b := retryClient(t, bs, core.Options{Rand: testutil.NewRand(3), Clock: clock}, `{"modelHeader": "x-model"}`, 100)
	for i := range 1000 {
		clock.Advance(time.Millisecond)
		_, err := client.EmptyCall(metadata.AppendToOutgoingContext(testContext(t), "x-model", fmt.Sprintf("made-up-%d", i)), &testgrpc.Empty{})
		require.Equal(t, codes.NotFound, status.Code(err), "call %d: %v", i, err)
	}
	retries := b.RetryStats().Allowed
	assert.Equal(t, int64(1000+retries), served(bs), "one request per call and one per retry allowed")
	assert.LessOrEqual(t, retries, uint64(50+200+11), "half the bank, 20%% of 1,000 calls, and 10 a second")
	left := 0
	for range 40 {
		if b.AllowRetry() {
			left++
		}
	}
	assert.Equal(t, 40, left, "failovers the budget allows right after the flood")
}
