package grpcbalancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/grpcbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// windowCall makes an EmptyCall of model llm with tokens prompt tokens:
// in an inferlb.Request in its context, and in x-tokens for the backend.
func windowCall(t *testing.T, client testgrpc.TestServiceClient, tokens int) error {
	return estimatedCall(t, client, tokens, tokens)
}

// estimatedCall is windowCall with the Request's PromptTokens an
// estimate, not the true count.
func estimatedCall(t *testing.T, client testgrpc.TestServiceClient, tokens, estimate int) error {
	ctx := metadata.AppendToOutgoingContext(testContext(t), "x-tokens", fmt.Sprint(tokens))
	ctx = inferlb.NewContext(ctx, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: estimate})
	_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
	return err
}

// Replicas of one model with different context windows (two with 1,000
// tokens, one with 8,000): with UnaryRetry, every long call is answered,
// each small replica refuses one at most (after that the Balancer
// remembers its window and passes it over for calls that do not fit), and
// short calls still go everywhere. No refusal counts as a failure.
func TestE2EUnaryRetryGoesPastSmallContextWindows(t *testing.T) {
	small1, small2 := &backend{window: 1000}, &backend{window: 1000}
	large := &backend{window: 8000}
	bs := []*backend{small1, small2, large}
	client, b := retryClient(t, bs, core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5), BreakerFailures: 2}, `{}`, 3)
	for i := range 30 {
		require.NoError(t, windowCall(t, client, 5000), "long call %d", i)
	}
	assert.Equal(t, int64(30), large.calls.Load(), "the large replica answers every long call")
	for _, be := range []*backend{small1, small2} {
		s := stats(t, b, be.addr)
		assert.LessOrEqual(t, be.calls.Load(), int64(1), "a small replica met once at most")
		assert.Equal(t, uint64(be.calls.Load()), s.TooLong)
		assert.Zero(t, s.Failures)
	}
	// A caller whose estimate is far off (100 tokens for 5,000) meets a
	// small replica on its first pick, but the retry carries the count
	// the server gave and passes the other small one over.
	before := small1.calls.Load() + small2.calls.Load()
	for i := range 20 {
		require.NoError(t, estimatedCall(t, client, 5000, 100), "underestimated call %d", i)
	}
	assert.Equal(t, int64(50), large.calls.Load())
	assert.LessOrEqual(t, small1.calls.Load()+small2.calls.Load()-before, int64(20), "one refusal a call at most")
	before = small1.calls.Load() + small2.calls.Load()
	for i := range 60 {
		require.NoError(t, windowCall(t, client, 500), "short call %d", i)
	}
	assert.Greater(t, small1.calls.Load()+small2.calls.Load()-before, int64(20), "short calls still go to the small replicas")
}

// When no replica's window takes the call, the caller gets the server's
// refusal as it came (its code and text), not an error of the policy's;
// the retry stops once every replica is remembered too small, and a
// Triton backend's refusal sent as INTERNAL trips no breaker.
func TestE2EContextWindowRefusalReachesTheCaller(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.Internal} {
		t.Run(code.String(), func(t *testing.T) {
			text := "Prompt length (%[2]d) exceeds maximum sequence length (%[1]d)."
			a, c := &backend{window: 1000, windowCode: code, windowRefusal: text}, &backend{window: 2000, windowCode: code, windowRefusal: text}
			a.start(t)
			c.start(t)
			name, b := shared(t, core.Options{Rand: testutil.NewRand(9), BreakerFailures: 2})
			conn, _ := dial(t, []*backend{a, c}, name, `{}`, grpc.WithChainUnaryInterceptor(grpcbalancer.UnaryRetry(5)))
			allReady(t, conn, b, 2)
			client := testgrpc.NewTestServiceClient(conn)
			err := windowCall(t, client, 5000)
			require.Equal(t, code, status.Code(err), "%v", err)
			assert.Regexp(t, `^Prompt length \(5000\) exceeds maximum sequence length \((1|2)000\)\.$`, status.Convert(err).Message())
			assert.Equal(t, int64(2), a.calls.Load()+c.calls.Load(), "each replica refused once, and the retry stopped")
			for range 5 {
				require.Equal(t, code, status.Code(windowCall(t, client, 5000)))
			}
			assert.Equal(t, int64(7), a.calls.Load()+c.calls.Load(), "a first pick goes ahead; its retry finds no window")
			for _, be := range []*backend{a, c} {
				s := stats(t, b, be.addr)
				assert.Zero(t, s.Failures)
				assert.False(t, s.BreakerOpen)
			}
			require.NoError(t, windowCall(t, client, 1500), "a call that fits the larger window")
		})
	}
}

// Without UnaryRetry the refusal reaches the caller at once, counts as
// neither success nor failure, and later calls that do not fit pass the
// replica over.
func TestE2EContextWindowWithoutRetry(t *testing.T) {
	small, large := &backend{window: 1000}, &backend{window: 8000}
	small.start(t)
	large.start(t)
	name, b := shared(t, core.Options{Rand: testutil.NewRand(2), BreakerFailures: 2})
	conn, _ := dial(t, []*backend{small, large}, name, `{}`)
	allReady(t, conn, b, 2)
	client := testgrpc.NewTestServiceClient(conn)
	refused := 0
	for range 20 {
		if err := windowCall(t, client, 5000); err != nil {
			require.Equal(t, codes.InvalidArgument, status.Code(err))
			refused++
		}
	}
	assert.Equal(t, 1, refused, "one call met the small replica; later ones passed it over")
	s := stats(t, b, small.addr)
	assert.Equal(t, uint64(1), s.TooLong)
	assert.Zero(t, s.Failures)
}

// A call refused by replicas of two kinds (one whose window bounds prompt
// and output, one whose limit bounds the prompt alone) goes on with what
// both said: the third attempt does not go back to the first replica
// because the second refusal named only the prompt. With a TGI of
// max-total-tokens 4096 (a), one of max-input-tokens 1024 (b) and a large
// one (c), a call of 3,000 prompt tokens asking for 2,000 is refused by a
// as 5,000 in all and by b as a prompt over 1,024: its retry must not take
// a's 4,096 for a fit again. Each trial starts with the windows forgotten
// (the clock moved past their memory), from a first pick with no token
// estimate, as a call through modelHeader has.
func TestE2EUnaryRetryKeepsEveryRefusalsCounts(t *testing.T) {
	a := &backend{window: 4096, windowRefusal: "Input validation error: `inputs` tokens + `max_new_tokens` must be <= %[1]d. Given: 3000 `inputs` tokens and 2000 `max_new_tokens`"}
	bb := &backend{window: 1024, windowRefusal: "Input validation error: `inputs` must have less than %[1]d tokens. Given: 3000"}
	c := &backend{window: 8000}
	bs := []*backend{a, bb, c}
	clock := testutil.NewClock()
	client, _ := retryClient(t, bs, core.Options{Rand: testutil.NewRand(3), Clock: clock}, `{}`, 3)
	metA, failed := 0, 0
	for i := range 60 {
		clock.Advance(11 * time.Minute)
		before := a.calls.Load()
		ctx := metadata.AppendToOutgoingContext(testContext(t), "x-tokens", "5000")
		ctx = inferlb.NewContext(ctx, &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llm"})
		if _, err := client.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			failed++
			t.Logf("call %d: %v", i, err)
		}
		if a.calls.Load()-before > 1 {
			metA++
		}
	}
	assert.Zero(t, metA, "calls that met the replica of 4,096 twice")
	assert.Zero(t, failed, "calls that failed while the large replica could take them")
	assert.Positive(t, a.calls.Load()+bb.calls.Load(), "the small replicas were met")
}
