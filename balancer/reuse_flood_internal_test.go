package balancer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
)

// TestKeyReuseFloodKeepsOtherClassesKeys: a tenant whose prompts never
// recur (a RAG pipeline over fresh documents) sending 256 of them for
// each call of a chat tenant whose 500 conversations recur. From one
// table of keys for every class, the flood evicted the chat tenant's keys
// before they came back: 20 repeats of 848 observed, below MinKeyReuse,
// and affinity went off for a tenant whose prompts do recur. Each class of
// tenants now has a table of its own.
func TestKeyReuseFloodKeepsOtherClassesKeys(t *testing.T) {
	r := newKeyReuse(cache.NewKeyer(1))
	chat := r.class("chat")
	var rag *reuseCounts
	for i := 0; rag == nil || rag == chat; i++ {
		rag = r.class(string(rune('a' + i)))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, 500)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	for range 20 {
		for _, k := range keys {
			r.observe(k, chat)
			for range 256 {
				r.observe(rng.Uint64(), rag)
			}
		}
	}
	require.Greater(t, chat.observed.Load(), int64(reuseWarm))
	ratio := float64(chat.repeated.Load()) / float64(chat.observed.Load())
	assert.Greater(t, ratio, 0.8, "the chat tenant's keys recur (%d of %d)", chat.repeated.Load(), chat.observed.Load())
	assert.True(t, r.recurring(chat, DefaultMinKeyReuse), "affinity stays on for the chat tenant")
	assert.False(t, r.recurring(rag, DefaultMinKeyReuse), "and off for the flood")
}
