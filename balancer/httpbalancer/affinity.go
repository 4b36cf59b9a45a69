package httpbalancer

import (
	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb/cache"
)

// chatKey and promptKey stand in for cache.Keyer's Chat and Prompt, which
// are being added to package cache concurrently; the inspector calls only
// these two, so switching is a two-line change here. Until then they hash
// the same inputs with the Keyer's seed, never returning 0 (no affinity).

func chatKey(k *cache.Keyer, model string, msgs []cache.Message) uint64 {
	d := xxhash.NewWithSeed(k.Seed())
	_, _ = d.WriteString("chat\x00")
	_, _ = d.WriteString(model)
	for _, m := range msgs {
		_, _ = d.WriteString("\x00")
		_, _ = d.WriteString(m.Role)
		_, _ = d.WriteString("\x00")
		_, _ = d.WriteString(m.Content)
	}
	return nonZero(d.Sum64())
}

func promptKey(k *cache.Keyer, model, prompt string) uint64 {
	d := xxhash.NewWithSeed(k.Seed())
	_, _ = d.WriteString("prompt\x00")
	_, _ = d.WriteString(model)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(prompt)
	return nonZero(d.Sum64())
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}
