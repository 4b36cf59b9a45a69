package balancer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// refuse has endpoint ep refuse a call for model as longer than its
// context window of tokens.
func refuse(t *testing.T, b *balancer.Balancer, ep, model string, tokens int) {
	t.Helper()
	eps := endpoints(len(b.Stats()))
	for range 1000 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
		require.NoError(t, err)
		if p.ID() == ep {
			p.Done(inferlb.Outcome{ContextWindow: tokens, Model: model})
			return
		}
		p.Done(inferlb.Outcome{})
	}
	t.Fatalf("no pick of %s among %v", ep, eps)
}

func picksOf(t *testing.T, b *balancer.Balancer, req *inferlb.Request, n int) map[string]int {
	t.Helper()
	c := map[string]int{}
	for range n {
		p, err := b.Pick(req)
		require.NoError(t, err)
		c[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	return c
}

// A replica that refused a call as longer than its context window keeps
// the calls that fit it and loses those that do not, for that model only;
// the refusal counts as neither success nor failure.
func TestContextWindowSteersLongCalls(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(2)})
	small := endpoints(3)[0].Addr
	refuse(t, b, small, "llama", 4096)

	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 6000, MaxOutputTokens: 500}
	assert.Zero(t, picksOf(t, b, long, 300)[small], "6,500 tokens do not fit 4,096")
	short := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 3000, MaxOutputTokens: 500}
	assert.Greater(t, picksOf(t, b, short, 300)[small], 60, "3,500 do")
	other := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "qwen", PromptTokens: 6000, MaxOutputTokens: 500}
	assert.Greater(t, picksOf(t, b, other, 300)[small], 60, "another model's window is not known")

	st := stat(t, b, small)
	assert.EqualValues(t, 1, st.TooLong)
	assert.Zero(t, st.Failures)
	assert.Zero(t, st.ErrorRate)

	clock.Advance(10*time.Minute + time.Second)
	assert.Greater(t, picksOf(t, b, long, 300)[small], 60, "forgotten after ten minutes")
}

// When every endpoint refused as much, a retry finds none (it would only
// be refused again), while a first pick goes ahead: the request's tokens
// are an estimate, and the answer is the caller's.
func TestContextWindowEverywhere(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(3)})
	for _, ep := range endpoints(3) {
		refuse(t, b, ep.Addr, "llama", 4096)
	}
	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 6000}
	p, err := b.Pick(long)
	require.NoError(t, err)
	_, err = b.PickRetry(long, p.ID())
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	p.Done(inferlb.Outcome{ContextWindow: 4096, Model: "llama"})

	// One of them takes more after a restart with a larger window: the
	// smallest remembered stays the gate, the endpoint's own the filter.
	big := endpoints(3)[2].Addr
	refuse(t, b, big, "llama", 8192)
	q, err := b.PickRetry(long, endpoints(3)[0].Addr)
	require.NoError(t, err)
	assert.Equal(t, big, q.ID(), "6,000 fit its 8,192")
	q.Done(inferlb.Outcome{})
}

// Remembered windows are bounded: per endpoint the latest 16 models, so a
// caller's made-up model names cannot grow them, and a pick that fits
// every window costs no allocation.
func TestContextWindowMemoryIsBounded(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(4)})
	small := endpoints(2)[0].Addr
	for i := range 40 {
		refuse(t, b, small, fmt.Sprint("m", i), 1000)
	}
	for i, want := range map[int]bool{0: false, 23: false, 24: true, 39: true} {
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: fmt.Sprint("m", i), PromptTokens: 2000}
		got := picksOf(t, b, req, 100)[small] == 0
		assert.Equal(t, want, got, "model m%d remembered", i)
	}
	fits := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m39", PromptTokens: 500}
	assert.Zero(t, pickDoneAllocs(b, fits))
	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "m39", PromptTokens: 2000}
	assert.Zero(t, pickDoneAllocs(b, long))
}

// A pooling server bounds each input by its window, not the batch: a
// pooling call is weighed by its longest input (LongestInput), however
// many tokens its batch sums to, and one whose longest input is not known
// by no window.
func TestContextWindowPoolingCallsPerInput(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(2)})
	eps := endpoints(3)
	small := eps[0].Addr
	refuse(t, b, small, "e5", 512)

	for _, svc := range []inferlb.Service{inferlb.ServiceEmbedding, inferlb.ServiceRerank} {
		batch := &inferlb.Request{Service: svc, Model: "e5", PromptTokens: 10000, LongestInput: 100}
		assert.Greater(t, picksOf(t, b, batch, 300)[small], 60, "%v: each input of 100 tokens fits 512", svc)
		unknown := &inferlb.Request{Service: svc, Model: "e5", PromptTokens: 10000}
		assert.Greater(t, picksOf(t, b, unknown, 300)[small], 60, "%v: the longest input not known", svc)
		long := &inferlb.Request{Service: svc, Model: "e5", PromptTokens: 600, LongestInput: 600}
		assert.Zero(t, picksOf(t, b, long, 300)[small], "%v: an input of 600 tokens does not fit 512", svc)
	}

	// A retry that fits nowhere finds none; a batch of short inputs does.
	for _, ep := range eps[1:] {
		refuse(t, b, ep.Addr, "e5", 512)
	}
	_, err := b.PickRetry(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: "e5", LongestInput: 600}, small)
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
	p, err := b.PickRetry(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: "e5", PromptTokens: 10000, LongestInput: 100}, small)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
}

// The Balancer-wide gate holds up to 256 models; a refusal for a model
// that finds it full (a fleet of many LoRA adapters, or made-up model
// names on a server that takes any) is still remembered for the endpoint,
// and a retry, which must not go where it would only be refused again,
// passes the endpoint over. The retry of a gRPC call has no endpoint to
// exclude: without this it went back to the endpoint that refused it.
func TestContextWindowRetryWhenGateIsFull(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(6)})
	eps := endpoints(3)
	for i := range 256 {
		refuse(t, b, eps[1+i%2].Addr, fmt.Sprint("f", i), 100)
	}
	small := eps[0].Addr
	refuse(t, b, small, "llm", 1000)
	refusePrompt := func(model string, tokens int) {
		for range 1000 {
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: model})
			require.NoError(t, err)
			if p.ID() == small {
				p.Done(inferlb.Outcome{ContextWindow: tokens, PromptWindow: true, Model: model})
				return
			}
			p.Done(inferlb.Outcome{})
		}
		t.Fatal("no pick of the small endpoint")
	}
	refusePrompt("tgi", 1024)
	for _, req := range []*inferlb.Request{
		{Service: inferlb.ServiceLLM, Model: "llm", PromptTokens: 3000},
		{Service: inferlb.ServiceLLM, Model: "tgi", PromptTokens: 3000},
	} {
		for range 60 {
			p, err := b.PickRetry(req, "")
			require.NoError(t, err)
			assert.NotEqual(t, small, p.ID(), "%s: the retry went back to the endpoint that refused it", req.Model)
			p.Done(inferlb.Outcome{})
		}
	}
}

// A batch of no known service without a model (TEI's /predict) is
// limited per input: after both endpoints refused a long text, the
// failover of a batch of short texts (4,000 tokens in all) found no
// endpoint whose window held its total.
func TestContextWindowUnknownServiceWithoutModelIsPerInput(t *testing.T) {
	b := newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(4)})
	eps := endpoints(2)
	refuse(t, b, eps[0].Addr, "", 512)
	refuse(t, b, eps[1].Addr, "", 512)
	req := &inferlb.Request{PromptTokens: 4000}
	p, err := b.Pick(req)
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Err: errors.New("connection reset")})
	_, err = b.PickRetry(req, p.ID())
	require.NoError(t, err, "failover of a batch of short texts")
	long := &inferlb.Request{PromptTokens: 4000, LongestInput: 600}
	_, err = b.PickRetry(long, p.ID())
	require.ErrorIs(t, err, balancer.ErrNoEndpoints, "a text longer than every remembered limit")
}

// TestContextWindowSurvivesAClockStepBack: a window's memory lapses at a
// deadline on the clock; stepped back an hour, a window remembered just
// before the step held for that hour on top of its ten minutes, and long
// calls kept away from a replica restarted with a larger window since.
// Like the core's deadlines set before a step, it ends at the step. A
// window remembered after the step is remembered as any, and so is one
// across a step of less than a second (goroutines' readings race).
func TestContextWindowSurvivesAClockStepBack(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(2)})
	small := endpoints(3)[0].Addr
	long := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama", PromptTokens: 6000, MaxOutputTokens: 500}

	refuse(t, b, small, "llama", 4096)
	clock.Advance(-500 * time.Millisecond)
	assert.Zero(t, picksOf(t, b, long, 300)[small], "a step within a second is no step")

	clock.Advance(-time.Hour)
	assert.Greater(t, picksOf(t, b, long, 300)[small], 60, "forgotten at the step (how much of it was left is not known), not held for an hour and ten minutes")

	refuse(t, b, small, "llama", 4096)
	assert.Zero(t, picksOf(t, b, long, 300)[small], "a window remembered after the step")
	clock.Advance(10*time.Minute + time.Second)
	assert.Greater(t, picksOf(t, b, long, 300)[small], 60, "and forgotten after its ten minutes")
}
