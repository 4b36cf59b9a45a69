package modelserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// A vLLM server put to sleep reports an idle scheduler and an empty KV
// cache, the most attractive reading of the fleet: vllm:engine_sleep_state
// says it cannot serve (Asleep 1).
func TestParseVLLMSleepState(t *testing.T) {
	res, err := modelserver.Parse(strings.NewReader(string(readFile(t, "vllm-sleep-level1.txt"))))
	require.NoError(t, err)
	assert.Equal(t, modelserver.VLLM, res.Engine)
	v, ok := res.Sample.Get(telemetry.Asleep)
	require.True(t, ok, "the sleep state was not read")
	assert.Equal(t, 1.0, v)
	r, _ := res.Sample.Get(telemetry.Running)
	assert.Equal(t, 0.0, r)
}

func TestParseVLLMSleepStateEdges(t *testing.T) {
	const running = "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 0.0\n"
	series := func(engine, state string, v string) string {
		return `vllm:engine_sleep_state{model_name="m",engine="` + engine + `",sleep_state="` + state + `"} ` + v + "\n"
	}
	eng := func(engine, awake, offloaded, discard string) string {
		return series(engine, "awake", awake) + series(engine, "weights_offloaded", offloaded) + series(engine, "discard_all", discard)
	}
	for _, tc := range []struct {
		name   string
		in     string
		want   float64
		absent bool
		bad    bool
	}{
		{name: "awake at startup", in: eng("0", "1.0", "0.0", "0.0"), want: 0},
		{name: "level 2", in: eng("0", "0.0", "0.0", "1.0"), want: 1},
		{name: "no awake series: the levels say", in: series("0", "discard_all", "1.0") + series("0", "weights_offloaded", "0.0"), want: 1},
		{name: "no awake series, no level at 1", in: series("0", "discard_all", "0.0"), want: 0},
		{name: "two engines asleep", in: eng("0", "0.0", "1.0", "0.0") + eng("1", "0.0", "1.0", "0.0"), want: 1},
		{name: "one of two engines awake", in: eng("0", "0.0", "1.0", "0.0") + eng("1", "1.0", "0.0", "0.0"), want: 0},
		{name: "no sleep mode", in: "", absent: true},
		{name: "bad value dropped", in: series("0", "awake", "0.5") + series("0", "weights_offloaded", "1.0"), want: 1, bad: true},
		{name: "only a bad value", in: series("0", "awake", "NaN"), absent: true, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := modelserver.Parse(strings.NewReader(running + tc.in))
			if tc.bad {
				require.ErrorIs(t, err, telemetry.ErrPartial)
				assert.Contains(t, err.Error(), "asleep=")
			} else {
				require.NoError(t, err)
			}
			v, ok := res.Sample.Get(telemetry.Asleep)
			if tc.absent {
				assert.False(t, ok)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.want, v)
		})
	}
}
