package cache_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/inferlb/inferlb/cache"
)

// Every turn of a conversation routes on the same key, so it finds the KV
// cache its earlier turns left; another conversation with the same system
// prompt gets its own key.
func ExampleKeyer_Chat() {
	k := cache.NewKeyer(0x5eed) // a fleet shares the seed to agree on placement
	system := cache.Message{Role: "system", Content: "You are a helpful assistant."}
	turn1 := []cache.Message{system, {Role: "user", Content: "What is prefix caching?"}}
	turn2 := append(turn1,
		cache.Message{Role: "assistant", Content: "Reusing the KV cache of a shared prompt prefix."},
		cache.Message{Role: "user", Content: "How much does it save?"})
	other := []cache.Message{system, {Role: "user", Content: "Write a haiku."}}

	fmt.Println(k.Chat("llama", turn1) == k.Chat("llama", turn2))
	fmt.Println(k.Chat("llama", turn1) == k.Chat("llama", other))
	// Output:
	// true
	// false
}

// A key's walk gives its owner first, then where it spills when the owner is
// over its load bound. Every process with the same seed and members walks the
// same way, whatever order it lists the members in.
func ExamplePlacement_Walk() {
	members := []cache.Member{{ID: "gpu-a:8000"}, {ID: "gpu-b:8000", Weight: 2}, {ID: "gpu-c:8000"}}
	reversed := []cache.Member{members[2], members[1], members[0]}
	key := cache.NewKeyer(0x5eed).Prompt("llama", "Summarize the following report: ...")

	order := func(ms []cache.Member) []string {
		var ids []string
		w := cache.NewPlacement(ms, 0x5eed).Walk(key)
		for m, ok := w.Next(); ok; m, ok = w.Next() {
			ids = append(ids, ms[m].ID)
		}
		return ids
	}
	fmt.Println(order(members))
	fmt.Println(order(reversed))
	// Output:
	// [gpu-b:8000 gpu-c:8000 gpu-a:8000]
	// [gpu-b:8000 gpu-c:8000 gpu-a:8000]
}

// manualClock is a cache.Clock that moves only when told to.
type manualClock struct{ now time.Time }

func (c *manualClock) Now() time.Time          { return c.now }
func (c *manualClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// A session sticks to the member it was first placed on until it has been
// idle for the TTL.
func ExampleSessions() {
	clock := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := cache.NewSessions(cache.SessionOptions{TTL: time.Minute, Clock: clock})
	if err != nil {
		panic(err)
	}
	key := cache.NewKeyer(0x5eed).Session("conversation-42")

	s.Put(key, 2) // placed on member 2
	clock.Advance(30 * time.Second)
	member, ok := s.Get(key)
	fmt.Println(member, ok)

	clock.Advance(2 * time.Minute)
	_, ok = s.Get(key)
	fmt.Println(ok)
	// Output:
	// 2 true
	// false
}

// A first user message that opens with a long shared context (a RAG
// document, a file) keys on its first Depth bytes only, so questions
// about the same document share an owner and the document's KV cache.
// A depth past the document tells the questions apart again.
func ExampleKeyer_WithDepth() {
	k := cache.NewKeyer(0x5eed)
	doc := strings.Repeat("Section 1. The parties agree ... ", 200) // 6,600 bytes
	ask := func(q string) []cache.Message {
		return []cache.Message{{Role: "user", Content: doc + "\n\nQuestion: " + q}}
	}
	a, b := ask("Who are the parties?"), ask("When does it end?")
	fmt.Println(k.Depth(), k.Chat("llama", a) == k.Chat("llama", b))

	deep := k.WithDepth(16 << 10)
	fmt.Println(deep.Depth(), deep.Chat("llama", a) == deep.Chat("llama", b))
	// Output:
	// 4096 true
	// 16384 false
}
