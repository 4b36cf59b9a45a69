package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An endpoint that serves chats and embeddings alike (Ollama, a gateway in
// front of both) kept one latency for both: each chat's seconds set its
// peak-EWMA, and the embedding scorer then priced its 20 ms embeddings as
// if they took as long, sending them to a dedicated embedding server three
// times slower. Each service keeps its own latency.
func TestEmbeddingsAreNotPricedByChatLatency(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	require.NoError(t, b.Update([]inferlb.Endpoint{
		{Addr: "ollama:11434", Labels: map[string]string{"model": "llama3,nomic-embed-text"}},
		{Addr: "tei:8080", Labels: map[string]string{"model": "nomic-embed-text"}},
	}))
	embedLatency := map[string]time.Duration{"ollama:11434": 20 * time.Millisecond, "tei:8080": 60 * time.Millisecond}
	embed := func() string {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, Model: "nomic-embed-text"})
		require.NoError(t, err)
		addr := p.Endpoint().Addr
		clock.Advance(embedLatency[addr])
		p.Done(inferlb.Outcome{Latency: embedLatency[addr]})
		return addr
	}
	// Both have served embeddings before the chats start: an endpoint
	// with no latency of a service yet, and calls of another in flight,
	// is priced at the scorer's prior.
	for range 20 {
		embed()
	}
	toOllama := 0
	const rounds, perRound = 60, 10
	for r := range rounds {
		chat, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama3"})
		require.NoError(t, err)
		require.Equal(t, "ollama:11434", chat.Endpoint().Addr)
		for range perRound {
			if embed() == "ollama:11434" && r >= rounds/2 {
				toOllama++
			}
		}
		clock.Advance(8 * time.Second)
		chat.Done(inferlb.Outcome{Latency: 8 * time.Second})
	}
	assert.Greater(t, toOllama, rounds/2*perRound*6/10,
		"embeddings the 20 ms endpoint took of %d, while its chats took 8 s each", rounds/2*perRound)

	s := b.Stats()
	require.Len(t, s, 2)
	assert.Equal(t, 8*time.Second, s[0].ServiceLatency[inferlb.ServiceLLM], "ollama's chat latency")
	assert.Less(t, s[0].ServiceLatency[inferlb.ServiceEmbedding], 60*time.Millisecond, "ollama's embedding latency")
	assert.Equal(t, 8*time.Second, s[0].Latency, "Latency is that of the latest service")
	assert.Zero(t, s[1].ServiceLatency[inferlb.ServiceLLM], "tei answered no chat")
}
