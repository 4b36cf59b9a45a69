package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb/balancer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHTTPClientExample runs the example end to end at a small scale, so a
// change that breaks it fails CI: every chat completion succeeds, and
// through inferlb no Responses API conversation loses its stored response
// and no call for the LoRA adapter fails, while a plain round robin loses
// and fails some (none of which depends on timing: a round robin sends
// each follow-up and three in four adapter calls to a replica without
// what they need).
func TestHTTPClientExample(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a second or two of real time")
	}
	var out strings.Builder
	res, err := run(context.Background(), &out, config{calls: 16, workers: 4, affinity: balancer.AffinityPrefer})
	t.Log("\n" + out.String())
	require.NoError(t, err)
	assert.Zero(t, res.failed, "chat completions failed")
	assert.Zero(t, res.lost["inferlb"], "conversations lost through inferlb")
	assert.Zero(t, res.loraFailed["inferlb"], "LoRA-adapter calls failed through inferlb")
	assert.Positive(t, res.lost["round-robin"], "conversations lost through round-robin")
	assert.Positive(t, res.loraFailed["round-robin"], "LoRA-adapter calls failed through round-robin")
	for _, line := range []string{
		"16 calls (every other one streamed) from 4 workers in ",
		"Responses API through inferlb: 0 of 8 four-turn conversations lost their stored response",
		"LoRA adapter on vllm-0 only, through inferlb: 0 of 20 calls failed",
	} {
		assert.Contains(t, out.String(), line)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 8 {
			rows[f[0]] = true
		}
	}
	for _, name := range []string{"vllm-0", "vllm-1", "vllm-2", "vllm-3"} {
		assert.True(t, rows[name], "no table row for %s", name)
	}
}
