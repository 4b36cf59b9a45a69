package grpcbalancer_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// Hugging Face TEI's gRPC API (tei.v1 Embed) names no model, as its
// native HTTP routes do. UnaryRetry sent on only the refusals as too long
// of calls with a model, so with TEI replicas of max-input-lengths 512 and
// 8,192 a call with an input over 512 that met a small one failed with
// its INVALID_ARGUMENT; now it goes on, carrying the server's count, to
// the large one, and the small ones' limits are remembered for calls
// without a model.
func TestE2EUnaryRetryWithoutModel(t *testing.T) {
	text := "Input validation error: `inputs` must have less than %[1]d tokens. Given: %[2]d"
	small1, small2 := &backend{window: 512, windowRefusal: text}, &backend{window: 512, windowRefusal: text}
	large := &backend{window: 8192, windowRefusal: text}
	bs := []*backend{small1, small2, large}
	client, b := retryClient(t, bs, core.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5), BreakerFailures: 2}, `{}`, 3)
	// embed is a call without a model of an input of tokens, whose
	// Request says longest (0: not known, as a policy does not estimate
	// it).
	embed := func(tokens, longest int) error {
		ctx := metadata.AppendToOutgoingContext(testContext(t), "x-tokens", fmt.Sprint(tokens))
		ctx = inferlb.NewContext(ctx, &inferlb.Request{Service: inferlb.ServiceEmbedding, PromptTokens: tokens, LongestInput: longest})
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
	refused := func() int64 { return small1.calls.Load() + small2.calls.Load() }
	for i := range 20 {
		require.NoError(t, embed(600, 600), "call %d: an input of 600 tokens, which the large replica takes", i)
	}
	for _, be := range []*backend{small1, small2} {
		assert.LessOrEqual(t, be.calls.Load(), int64(1), "a small replica's limit remembered after one refusal")
		assert.Equal(t, uint64(be.calls.Load()), stats(t, b, be.addr).TooLong)
		assert.Zero(t, stats(t, b, be.addr).Failures)
	}
	// Both small ones remembered: a call whose Request does not say its
	// longest input may meet one first, and its retry, carrying the
	// server's count, passes the other over.
	for i := 0; small1.calls.Load() == 0 || small2.calls.Load() == 0; i++ {
		require.Less(t, i, 100, "a small replica was never tried")
		_ = embed(600, 600) // may meet both small ones, once each
	}
	before, answered := refused(), large.calls.Load()
	for i := range 30 {
		require.NoError(t, embed(600, 0), "call %d", i)
	}
	assert.Equal(t, int64(30), large.calls.Load()-answered)
	assert.LessOrEqual(t, refused()-before, int64(30), "one refusal a call at most")

	before = refused()
	for i := range 60 {
		require.NoError(t, embed(100, 100), "short call %d", i)
	}
	assert.Greater(t, refused()-before, int64(20), "inputs of 100 tokens still go to the small replicas")
}

// TEI's tei.v1 Predict names no model and is of no known service: a
// policy does not say its longest input (LongestInput 0), so its first
// pick weighs no window, but its retry must weigh the count the refusal
// gave as a pooling call's, as the Balancer weighs such a call. The count
// went into its PromptTokens, which no check of such a call reads: the
// retry passed over no small replica remembered, and a call that met two
// small ones in turn failed with the refusal, the large one untried.
func TestE2EUnaryRetryPredictWeighsTheRefusedInput(t *testing.T) {
	text := "Input validation error: `inputs` must have less than %[1]d tokens. Given: %[2]d"
	smalls := []*backend{{window: 512, windowRefusal: text}, {window: 512, windowRefusal: text}, {window: 512, windowRefusal: text}}
	large := &backend{window: 8192, windowRefusal: text}
	bs := append(smalls[:len(smalls):len(smalls)], large)
	client, _ := retryClient(t, bs, core.Options{Rand: testutil.NewRand(5), BreakerFailures: 2}, `{}`, 3)
	predict := func(tokens int) error {
		ctx := metadata.AppendToOutgoingContext(testContext(t), "x-tokens", fmt.Sprint(tokens))
		ctx = inferlb.NewContext(ctx, &inferlb.Request{PromptTokens: tokens})
		_, err := client.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
	refused := func() (n int64) {
		for _, be := range smalls {
			n += be.calls.Load()
		}
		return n
	}
	for i := 0; slices.ContainsFunc(smalls, func(be *backend) bool { return be.calls.Load() == 0 }); i++ {
		require.Less(t, i, 100, "a small replica was never tried")
		_ = predict(600) // may meet small ones not yet remembered, one after another
	}
	// Every small one remembered: a call may meet one first, and its
	// retry, carrying the server's count, passes the others over.
	for i := range 60 {
		before := refused()
		require.NoError(t, predict(600), "call %d: an input of 600 tokens, which the large replica takes", i)
		assert.LessOrEqual(t, refused()-before, int64(1), "call %d: refused once at most (its first pick weighs nothing)", i)
	}
}
