package httpbalancer_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// openAIClient is the official OpenAI client over rt, at the logical base
// URL every test calls, with its own retries off: failover is the
// transport's job here.
func openAIClient(rt http.RoundTripper) openai.Client {
	return openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: rt}),
		option.WithBaseURL("http://llm.internal/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
	)
}

// TestOpenAIClient drives the official OpenAI Go client through the
// transport, plain and streaming, and checks the balancer saw each call as
// an LLM call for the right model and ended it when the body ended.
func TestOpenAIClient(t *testing.T) {
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")}
	res := newResults(256)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(bs...),
		// Fixed seeds and a fake clock: the 30 calls' affinity keys land
		// alike in every run, on all three backends.
		BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5), AffinitySeed: 1},
		OnResult:        res.on,
	})
	client := openAIClient(tr)
	ctx := context.Background()
	const n = 30
	for i := range n {
		params := openai.ChatCompletionNewParams{
			Model:     "llama-3-8b",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("question %d", i))},
			MaxTokens: openai.Int(32),
		}
		if i%2 == 0 {
			cc, err := client.Chat.Completions.New(ctx, params)
			require.NoError(t, err)
			require.Len(t, cc.Choices, 1)
			assert.True(t, strings.HasPrefix(cc.Choices[0].Message.Content, "hello from "))
			continue
		}
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var text strings.Builder
		for stream.Next() {
			if c := stream.Current(); len(c.Choices) > 0 {
				text.WriteString(c.Choices[0].Delta.Content)
			}
		}
		require.NoError(t, stream.Err())
		require.NoError(t, stream.Close())
		assert.Equal(t, "tok0 tok1 tok2 tok3 tok4 ", text.String())
	}
	require.EqualValues(t, n, res.n.Load())
	var streamed int
	for range n {
		r := <-res.c
		assert.Equal(t, inferlb.ServiceLLM, r.Request.Service)
		assert.Equal(t, "llama-3-8b", r.Request.Model)
		assert.Equal(t, 32, r.Request.MaxOutputTokens)
		assert.NotZero(t, r.Request.AffinityKey)
		assert.NoError(t, r.Outcome.Err)
		if r.Events > 0 {
			streamed++
			assert.Equal(t, chunks, r.Events)
			assert.Equal(t, chunks, r.Outcome.OutputTokens)
		}
	}
	assert.Equal(t, n/2, streamed)
	for _, b := range bs {
		t.Logf("%s: %d", b.name, b.hits.Load())
		assert.Positive(t, b.hits.Load(), "backend %s", b.name)
	}
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestOpenAIClientLargeBodyFindsModel: openai-go writes "messages" before
// "model", so a request larger than the peek (here an image as a data URL)
// has its model past the peek. It must still reach an endpoint serving that
// model, with the stream flag, output bound and prompt_cache_key that come
// after it read too.
func TestOpenAIClientLargeBodyFindsModel(t *testing.T) {
	bs := []*backend{newBackend(t, "llama"), newBackend(t, "qwen")}
	eps := endpointsOf(bs...)
	for i, b := range bs {
		eps[i].Labels = map[string]string{"model": b.name}
	}
	res := newResults(64)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       eps,
		MaxPeek:         4096,
		BalancerOptions: balancer.Options{Rand: testutil.NewRand(7), MinKeyReuse: -1},
		OnResult:        res.on,
	})
	client := openAIClient(tr)
	image := "data:image/png;base64," + strings.Repeat("iVBORw0KGgo", 2000) // 22 KB
	const n = 12
	for i := range n {
		model := bs[i%2].name
		params := openai.ChatCompletionNewParams{
			Model: model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
				openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: image}),
				openai.TextContentPart(fmt.Sprintf("What is in this picture? (%d)", i)),
			})},
			MaxCompletionTokens: openai.Int(64),
			PromptCacheKey:      openai.String("user-42"),
		}
		if i%3 == 0 {
			stream := client.Chat.Completions.NewStreaming(context.Background(), params)
			for stream.Next() {
			}
			require.NoError(t, stream.Err())
			require.NoError(t, stream.Close())
		} else {
			cc, err := client.Chat.Completions.New(context.Background(), params)
			require.NoError(t, err)
			require.Equal(t, "hello from "+model, cc.Choices[0].Message.Content)
		}
		r := <-res.c
		assert.Equal(t, model, r.Endpoint, "call %d", i)
		assert.Equal(t, model, r.Request.Model, "call %d", i)
		assert.Equal(t, 64, r.Request.MaxOutputTokens, "call %d", i)
		assert.Equal(t, tr.Balancer().Keyer().Session("user-42"), r.Request.AffinityKey, "call %d", i)
		assert.Less(t, r.Request.PromptTokens, 200, "call %d: the image's base64 is not prompt text", i)
		if i%3 == 0 {
			assert.Equal(t, chunks, r.Events, "call %d streamed", i)
		}
	}
	assert.EqualValues(t, n/2, bs[0].hits.Load())
	assert.EqualValues(t, n/2, bs[1].hits.Load())
}

// TestOpenAIClientLoRAFleet: the OpenAI client asks for a LoRA adapter
// that one of three vLLM replicas has loaded, streaming and not. A call
// that meets a replica without it goes on to another, so the client sees
// no NotFoundError; after the first 404 of each, the adapter's calls go
// to the replica that has it.
func TestOpenAIClientLoRAFleet(t *testing.T) {
	owner := newLoRABackend(t, "owner", "sql-adapter")
	others := []*loraBackend{newLoRABackend(t, "b"), newLoRABackend(t, "c")}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(owner.backend, others[0].backend, others[1].backend),
		BalancerOptions: balancer.Options{Rand: testutil.NewRand(9), Clock: testutil.NewClock()},
	})
	client := openAIClient(tr)
	ctx := context.Background()
	for i := range 20 {
		params := openai.ChatCompletionNewParams{
			Model:    "sql-adapter",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("query %d", i))},
		}
		if i%2 == 0 {
			_, err := client.Chat.Completions.New(ctx, params)
			require.NoError(t, err, "call %d", i)
			continue
		}
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		for stream.Next() {
		}
		require.NoError(t, stream.Err(), "call %d", i)
		require.NoError(t, stream.Close())
	}
	assert.Equal(t, int64(20), owner.hits.Load())
	assert.LessOrEqual(t, others[0].notFound.Load()+others[1].notFound.Load(), int64(2), "at most one 404 from each")
}
