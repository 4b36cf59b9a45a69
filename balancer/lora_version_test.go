package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A version served under a name of its own beside the stable one (vLLM's
// `--served-model-name llama llama@v2`, README's canary recipe) is the
// base model, not a LoRA adapter, though the server reports llama alone
// as its base: its calls follow their prompts' keys, not one adapter
// home, and an endpoint whose slots other adapters fill takes them. A
// name that is no version of the base is still an adapter's.
func TestAVersionNameIsNoAdapter(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(6), AffinitySeed: 42})
	publishLoRA(b, clock, 1, "sql", "math", "", "")
	v2 := homesOf(t, b, "llama@v2", 200, inferlb.Request{})
	t.Logf("llama@v2: %v", v2)
	assert.Len(t, v2, 4, "spread by its prompts' keys, full slots or not")
	for id, n := range v2 {
		assert.Greater(t, n, 20, "%s", id)
	}
	assert.Len(t, homesOf(t, b, "law", 200, inferlb.Request{}), 1, "an adapter goes to its home")

	s := telemetry.Sample{}
	s.SetAdapters(1, &telemetry.Adapters{Base: "llama@v1", Running: []string{"sql"}})
	for _, tc := range []struct {
		model         string
		adapter, full bool
	}{
		{"llama@v1", false, false},
		{"llama@v2", false, false},
		{"llama", false, false},
		{"sql", false, false},
		{"law", true, true},
		{"llamas", true, true},
	} {
		adapter, full := s.SlotWait(tc.model)
		require.Equal(t, tc.adapter, adapter, tc.model)
		require.Equal(t, tc.full, full, tc.model)
	}
}
