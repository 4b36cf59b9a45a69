package httpbalancer_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// TestSessionHeaderIsSalted: a session header's key is scoped by the
// body's vLLM cache_salt, as the body's own keys are. Two tenants whose
// callers pick the same session ID ("default", a user number) with their
// own salts got one key, and were sent to one owner for a cache the server
// keeps apart. One salt keeps one key; no salt (or an empty one) keys the
// header as before; the salt counts wherever it is in the body, past the
// peek too.
func TestSessionHeaderIsSalted(t *testing.T) {
	a := newBackend(t, "a")
	keyer := cache.NewKeyer(7)
	seen := make(chan inferlb.Request, 1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(a),
		Keyer:     keyer,
		MaxPeek:   256,
		OnResult:  func(r httpbalancer.Result) { seen <- r.Request },
	})
	keyOf := func(session, body string) uint64 {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(body))
		req.Header.Set("X-Session-Id", session)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		got := <-seen
		assert.True(t, got.Session)
		return got.AffinityKey
	}
	chat := func(salt string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16` + salt + `}`
	}
	ta, tb := keyOf("conv-9", chat(`,"cache_salt":"tenant-a"`)), keyOf("conv-9", chat(`,"cache_salt":"tenant-b"`))
	assert.NotEqual(t, ta, tb, "two salts, one session ID: two keys")
	assert.Equal(t, ta, keyOf("conv-9", chat(`,"cache_salt":"tenant-a"`)), "one salt, one key")
	assert.NotEqual(t, ta, keyOf("conv-8", chat(`,"cache_salt":"tenant-a"`)), "one salt, two sessions")
	plain := keyOf("conv-9", chat(""))
	assert.Equal(t, keyer.Session("conv-9"), plain, "no salt: keyed as before")
	assert.NotEqual(t, plain, ta)
	assert.Equal(t, plain, keyOf("conv-9", chat(`,"cache_salt":""`)))
	// The salt after a long first turn, past the 256-byte peek, in a body
	// held in memory (the SDKs write extra fields last).
	long := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4<<10) + `"}],"cache_salt":"tenant-a"}`
	assert.Equal(t, ta, keyOf("conv-9", long), "salt past the peek")
	// The prompt key's salt is the body's own, not the header's business:
	// a prompt_cache_key is salted as before.
	assert.NotEqual(t, keyOf("conv-9", `{"model":"m","prompt_cache_key":"s","cache_salt":"tenant-a","messages":[]}`),
		keyOf("conv-9", `{"model":"m","prompt_cache_key":"s","cache_salt":"tenant-b","messages":[]}`))
}

// TestSessionHeaderUnsaltedForOtherInspectors: an Inspector of the
// caller's own cannot record a salt; its session headers key as they did.
func TestSessionHeaderUnsaltedForOtherInspectors(t *testing.T) {
	a := newBackend(t, "a")
	keyer := cache.NewKeyer(7)
	seen := make(chan inferlb.Request, 1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(a),
		Keyer:     keyer,
		Inspector: httpbalancer.InspectorFunc(func(r *http.Request, body []byte, complete bool, info *httpbalancer.Info) {
			info.Service = inferlb.ServiceLLM
		}),
		OnResult: func(r httpbalancer.Result) { seen <- r.Request },
	})
	req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(`{"cache_salt":"tenant-a"}`))
	req.Header.Set("X-Session-Id", "conv-9")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, keyer.Session("conv-9"), (<-seen).AffinityKey)
}
