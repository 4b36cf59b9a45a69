package modelserver_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

func TestParseVLLMLoRA(t *testing.T) {
	res, err := modelserver.Parse(strings.NewReader(string(readFile(t, "vllm-lora.txt"))))
	require.NoError(t, err)
	a := res.Sample.Adapters
	require.NotNil(t, a)
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", a.Base)
	assert.Equal(t, []string{"sql-lora", "chat-lora"}, a.Running, "the label set with the latest time")
	assert.Equal(t, []string{"law-lora"}, a.Waiting)
	adapter, full := res.Sample.SlotWait("math-lora")
	assert.True(t, adapter && full)
	adapter, full = res.Sample.SlotWait("meta-llama/Llama-3.1-8B-Instruct")
	assert.False(t, adapter || full, "the base model")
}

func TestParseVLLMLoRAEdges(t *testing.T) {
	const counts = `vllm:num_requests_running{model_name="base"} %v
vllm:num_requests_waiting{model_name="base"} %v
`
	info := func(maxLora, running, waiting string) string {
		return fmt.Sprintf("vllm:lora_requests_info{max_lora=%q,running_lora_adapters=%q,waiting_lora_adapters=%q} 1.7e9\n", maxLora, running, waiting)
	}
	parse := func(t *testing.T, in string) (telemetry.Sample, error) {
		t.Helper()
		res, err := modelserver.Parse(strings.NewReader(in))
		return res.Sample, err
	}

	t.Run("idle server keeps its last lists", func(t *testing.T) {
		s, err := parse(t, fmt.Sprintf(counts, 0, 0)+info("1", "sql", "chat"))
		require.NoError(t, err)
		require.NotNil(t, s.Adapters)
		assert.Empty(t, s.Adapters.Running, "nothing runs: the list is stale")
		assert.Empty(t, s.Adapters.Waiting)
		adapter, full := s.SlotWait("chat")
		assert.True(t, adapter)
		assert.False(t, full, "its slot is free")
	})
	t.Run("empty names and spaces", func(t *testing.T) {
		s, err := parse(t, fmt.Sprintf(counts, 3, 1)+info("4", "a,,b, c", ","))
		require.NoError(t, err)
		assert.Equal(t, []string{"a", "b", "c"}, s.Adapters.Running)
		assert.Empty(t, s.Adapters.Waiting)
	})
	t.Run("bounded lists", func(t *testing.T) {
		names := make([]string, 3*telemetry.MaxAdapterNames)
		for i := range names {
			names[i] = fmt.Sprintf("lora-%d", i)
		}
		s, err := parse(t, fmt.Sprintf(counts, 3, 1)+info("4", strings.Join(names, ","), ""))
		require.NoError(t, err)
		assert.Len(t, s.Adapters.Running, telemetry.MaxAdapterNames)
	})
	for _, bad := range []string{"", "0", "-2", "x", "NaN", "+Inf", "1e400"} {
		t.Run("max_lora "+bad, func(t *testing.T) {
			s, err := parse(t, fmt.Sprintf(counts, 3, 1)+info(bad, "sql", ""))
			require.Error(t, err)
			assert.True(t, errors.Is(err, telemetry.ErrPartial), "the load still reads: %v", err)
			assert.Contains(t, err.Error(), "lora_slots")
			assert.Nil(t, s.Adapters)
			_, ok := s.Get(telemetry.LoRASlots)
			assert.False(t, ok)
			v, _ := s.Get(telemetry.Running)
			assert.Equal(t, 3.0, v)
		})
	}
	// The value is the time the label set was set; one that is not a
	// number is malformed, dropped and counted as promapi counts it, and
	// the latest of the others is read.
	t.Run("a label set whose time is not a number", func(t *testing.T) {
		for _, v := range []string{"NaN", "+Inf"} {
			in := fmt.Sprintf(counts, 3, 1) + info("2", "sql", "") +
				strings.Replace(info("2", "chat", ""), "1.7e9", v, 1)
			s, err := parse(t, in)
			require.ErrorIs(t, err, telemetry.ErrPartial, v)
			assert.Contains(t, err.Error(), "lora_slots="+v)
			require.NotNil(t, s.Adapters, v)
			assert.Equal(t, []string{"sql"}, s.Adapters.Running, v)
		}
	})
	// A label set the exposition parser cannot read (a value in Go's
	// syntax but not the format's, labels without their comma) is
	// malformed too, whatever time it seems to hold: dropped and counted,
	// and the latest of the others read. It was taken for the latest
	// and the others cut before the parser saw them, which then dropped
	// it: no adapters at all.
	t.Run("a label set the parser cannot read", func(t *testing.T) {
		for fault, later := range map[string]string{
			"hex float":       strings.Replace(info("2", "chat", ""), "1.7e9", "0x1p40", 1),
			"digit separator": strings.Replace(info("2", "chat", ""), "1.7e9", "1_800_000_000", 1),
			"no comma":        strings.Replace(strings.Replace(info("2", "chat", ""), "1.7e9", "1.8e9", 1), `",waiting`, `" waiting`, 1),
		} {
			t.Run(fault, func(t *testing.T) {
				s, err := parse(t, fmt.Sprintf(counts, 3, 1)+info("2", "sql", "")+later)
				require.ErrorIs(t, err, telemetry.ErrPartial)
				require.NotNil(t, s.Adapters)
				assert.Equal(t, []string{"sql"}, s.Adapters.Running)
				v, _ := s.Get(telemetry.Running)
				assert.Equal(t, 3.0, v)
			})
		}
	})
	t.Run("no base model named", func(t *testing.T) {
		s, err := parse(t, "vllm:num_requests_running 3\n"+info("2", "sql", ""))
		require.NoError(t, err)
		assert.Nil(t, s.Adapters, "a request for the base model could not be told from one for an adapter")
		_, ok := s.Get(telemetry.LoRASlots)
		assert.False(t, ok)
	})
	t.Run("no LoRA", func(t *testing.T) {
		s, err := parse(t, fmt.Sprintf(counts, 3, 1))
		require.NoError(t, err)
		assert.Nil(t, s.Adapters)
	})
}

// vLLM never drops a label set of vllm:lora_requests_info: every mix of
// running and waiting adapters a server has had stays exported with the
// time it was last set, so a long-running multi-LoRA server exports
// thousands. Past the parser's bound of 8192 series the rest were
// dropped, newest label sets (exported last) first: the state read was an
// old one (adapters long gone from the batch) and every round was partial.
// Only the latest label set is read, so only it needs to be kept.
func TestParseVLLMLoRAManyLabelSets(t *testing.T) {
	var b strings.Builder
	b.WriteString("vllm:num_requests_running{model_name=\"base\"} 3\nvllm:num_requests_waiting{model_name=\"base\"} 1\n# TYPE vllm:lora_requests_info gauge\n")
	const n = 20000
	for i := range n {
		fmt.Fprintf(&b, "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a%d\",waiting_lora_adapters=\"\"} %d.5\n", i, 1700000000+i)
	}
	// A label set set again last keeps its place (the first) with the latest time.
	in := strings.Replace(b.String(), `running_lora_adapters="a0",waiting_lora_adapters=""} 1700000000.5`, `running_lora_adapters="a0",waiting_lora_adapters=""} 1800000000`, 1)
	for name, in := range map[string]string{"newest last": b.String(), "newest first": in} {
		res, err := modelserver.Parse(strings.NewReader(in))
		require.NoError(t, err, name)
		require.NotNil(t, res.Sample.Adapters, name)
		want := fmt.Sprintf("a%d", n-1)
		if name == "newest first" {
			want = "a0"
		}
		assert.Equal(t, []string{want}, res.Sample.Adapters.Running, name)
		v, _ := res.Sample.Get(telemetry.Running)
		assert.Equal(t, 3.0, v, name)
	}
}

// A server of two data-parallel engines exports one lora_requests_info,
// without an engine label, holding whichever engine logged last: it is
// read without adapters rather than as the server's slots.
func TestParseVLLMLoRAWithTwoEnginesIsLeftOut(t *testing.T) {
	const in = `vllm:num_requests_running{engine="0",model_name="base"} 2
vllm:num_requests_running{engine="1",model_name="base"} 3
vllm:num_requests_waiting{engine="0",model_name="base"} 0
vllm:num_requests_waiting{engine="1",model_name="base"} 1
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat,law",waiting_lora_adapters=""} 1.7e9
`
	res, err := modelserver.Parse(strings.NewReader(in))
	require.NoError(t, err)
	assert.Nil(t, res.Sample.Adapters, "one engine's state is not the server's")
	_, ok := res.Sample.Get(telemetry.LoRASlots)
	assert.False(t, ok)
	r, _ := res.Sample.Get(telemetry.Running)
	assert.Equal(t, 5.0, r, "the counts are read as before")
	adapter, full := res.Sample.SlotWait("sql")
	assert.False(t, adapter || full, "no call waits for a slot it may have")

	// One engine, labelled: read as before.
	const one = `vllm:num_requests_running{engine="0",model_name="base"} 2
vllm:num_requests_waiting{engine="0",model_name="base"} 0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat,law",waiting_lora_adapters=""} 1.7e9
`
	res, err = modelserver.Parse(strings.NewReader(one))
	require.NoError(t, err)
	require.NotNil(t, res.Sample.Adapters)
	assert.Equal(t, []string{"chat", "law"}, res.Sample.Adapters.Running)
}
