package modelserver_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// replaceLine returns file's exposition with the line that starts with from
// replaced by to.
func replaceLine(t *testing.T, file, from, to string) []byte {
	t.Helper()
	body := string(readFile(t, file))
	i := strings.Index(body, from)
	require.GreaterOrEqual(t, i, 0, "%s has no line %q", file, from)
	end := i + strings.IndexByte(body[i:], '\n')
	return []byte(body[:i] + to + body[end:])
}

// One data-parallel engine's bad value withholds the field it is part of:
// the other engines' sum or maximum understated the server, and drew calls
// to it. With engine 1's KV-cache usage NaN, vLLM's two engines read 0.42
// (engine 0's) where the full reading is 0.87; with engine 0's running
// count -1, 6 where it is 14. The result is partial, as before, and keeps
// the fields all of whose series were read.
func TestABadEngineValueWithholdsTheServersField(t *testing.T) {
	const file = "vllm-v1-two-engines.txt"
	body := replaceLine(t, file, `vllm:kv_cache_usage_perc{engine="1"`,
		`vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} NaN`)
	body = bytes.Replace(body, []byte(`vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0`),
		[]byte(`vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} -1`), 1)
	res, err := modelserver.Parse(bytes.NewReader(body))
	require.ErrorIs(t, err, telemetry.ErrPartial)
	got := fields(res.Sample)
	assert.NotContains(t, got, "kv_cache_usage", "engine 0's 0.42 is not the server's")
	assert.NotContains(t, got, "running", "engine 1's 6 is not the server's")
	assert.Equal(t, 4.0, got["waiting"], "a field all of whose series were read is kept")

	// SGLang with data-parallel attention: each dp_rank is a batch of its
	// own, its TP ranks replicas of one count. A bad rank beside a good one
	// of its batch loses nothing; a batch with no good rank withholds it.
	const dp = "sglang-dp-attention.txt"
	oneRank := replaceLine(t, dp, `sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V3",engine_type="unified",tp_rank="3"`,
		`sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V3",engine_type="unified",tp_rank="3",pp_rank="0",moe_ep_rank="3",dp_rank="1"} NaN`)
	res, err = modelserver.Parse(bytes.NewReader(oneRank))
	require.ErrorIs(t, err, telemetry.ErrPartial)
	whole, err := modelserver.Parse(bytes.NewReader(readFile(t, dp)))
	require.NoError(t, err)
	want, ok := whole.Sample.Get(telemetry.Running)
	require.True(t, ok)
	r, ok := res.Sample.Get(telemetry.Running)
	require.True(t, ok, "its batch's other rank was read")
	assert.Equal(t, want, r)

	batch := bytes.Replace(oneRank,
		[]byte(`sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V3",engine_type="unified",tp_rank="2",pp_rank="0",moe_ep_rank="2",dp_rank="1"} 7.0`),
		[]byte(`sglang:num_running_reqs{model_name="deepseek-ai/DeepSeek-V3",engine_type="unified",tp_rank="2",pp_rank="0",moe_ep_rank="2",dp_rank="1"} -3`), 1)
	require.NotEqual(t, oneRank, batch)
	res, err = modelserver.Parse(bytes.NewReader(batch))
	require.ErrorIs(t, err, telemetry.ErrPartial)
	_, ok = res.Sample.Get(telemetry.Running)
	assert.False(t, ok, "dp_rank 0's batch alone is not the server's running count")
}
