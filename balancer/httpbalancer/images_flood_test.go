package httpbalancer_test

import (
	"bytes"
	"net/http"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// A message's parts are request data: a body of a megabyte of empty
// images (Ollama's "images", 3 bytes each) made Inspect allocate a marker
// per image and a message text of 25 bytes per image, about 700,000
// allocations and 72 MB per call, when a key reads at most
// cache.MaxKeyChars of a message. Inspect now allocates a few times
// MaxKeyChars for it, in a few allocations, and the key is the one the
// whole text gives.
func TestInspectManyImagesAllocatesLittle(t *testing.T) {
	const path = "/api/chat"
	var b bytes.Buffer
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"","images":[`)
	for b.Len() < 1<<20 {
		b.WriteString(`"",`)
	}
	b.WriteString(`""]}]}`)
	body := b.Bytes()
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, bytes.NewReader(body))
	o := &httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}
	var info httpbalancer.Info
	allocs := testing.AllocsPerRun(2, func() {
		info = httpbalancer.Info{}
		o.Inspect(r, body, true, &info)
	})
	assert.Less(t, allocs, 64.0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	info = httpbalancer.Info{}
	o.Inspect(r, body, true, &info)
	runtime.ReadMemStats(&after)
	// The message's text grows to MaxKeyChars (in steps) and is copied
	// once, whatever the body's size.
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8*cache.MaxKeyChars))
	assert.NotZero(t, info.AffinityKey)

	// The key reads the user turn's first Depth characters: images past
	// them change nothing, images within them do.
	other := bytes.Replace(body, []byte(`""]}]}`), []byte(`"x"]}]}`), 1)
	assert.Equal(t, info.AffinityKey, inspect(path, string(other), true).AffinityKey)
	first := bytes.Replace(body, []byte(`"images":["",`), []byte(`"images":["x",`), 1)
	assert.NotEqual(t, info.AffinityKey, inspect(path, string(first), true).AffinityKey)
}
