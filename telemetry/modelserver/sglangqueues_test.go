package modelserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// In prefill/decode disaggregation an SGLang server holds requests ahead of
// its waiting queue: a prefill server in its bootstrap queue (exported as
// num_prefill_prealloc_queue_reqs before the rename to
// num_prefill_bootstrap_queue_reqs), a decode server in its prealloc and
// transfer queues. They are queued work a new request comes after, so they
// count as waiting. The prefill inflight queue (prefill done, KV cache being
// sent) and the grammar queue (a new request enters the waiting queue ahead
// of it) do not. See the SGLang extractor in engines.go for the sources.
func TestParseSGLangDisaggregationQueuesAreWaiting(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]float64
	}{
		{
			// Priority scheduling and all schedulers exporting: the totals
			// are priority="" and the two TP ranks report one scheduler.
			name: "decode server: prealloc and transfer queues",
			in: `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 10
sglang:num_running_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 10
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 2
sglang:num_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 2
# TYPE sglang:num_grammar_queue_reqs gauge
sglang:num_grammar_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 5
sglang:num_grammar_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 5
# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge
sglang:num_prefill_bootstrap_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 0
sglang:num_prefill_bootstrap_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 0
# TYPE sglang:num_prefill_inflight_queue_reqs gauge
sglang:num_prefill_inflight_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 0
sglang:num_prefill_inflight_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 0
# TYPE sglang:num_decode_prealloc_queue_reqs gauge
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 3
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="0"} 1
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="1"} 2
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 3
# TYPE sglang:num_decode_transfer_queue_reqs gauge
sglang:num_decode_transfer_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 4
sglang:num_decode_transfer_queue_reqs{engine_type="decode",tp_rank="1",pp_rank="0",moe_ep_rank="0",priority=""} 4
`,
			want: map[string]float64{"running": 10, "waiting": 2 + 3 + 4},
		},
		{
			// The older name of the bootstrap queue; two data-parallel
			// ranks are separate queues.
			name: "prefill server: bootstrap queue, not inflight",
			in: `sglang:num_running_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 1
sglang:num_running_reqs{engine_type="prefill",tp_rank="1",pp_rank="0",moe_ep_rank="1",dp_rank="1"} 1
sglang:num_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 1
sglang:num_queue_reqs{engine_type="prefill",tp_rank="1",pp_rank="0",moe_ep_rank="1",dp_rank="1"} 0
sglang:num_grammar_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 2
sglang:num_grammar_queue_reqs{engine_type="prefill",tp_rank="1",pp_rank="0",moe_ep_rank="1",dp_rank="1"} 0
sglang:num_prefill_prealloc_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 6
sglang:num_prefill_prealloc_queue_reqs{engine_type="prefill",tp_rank="1",pp_rank="0",moe_ep_rank="1",dp_rank="1"} 5
sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 7
sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",tp_rank="1",pp_rank="0",moe_ep_rank="1",dp_rank="1"} 7
sglang:num_decode_prealloc_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 0
sglang:num_decode_transfer_queue_reqs{engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 0
`,
			want: map[string]float64{"running": 2, "waiting": 1 + 6 + 5},
		},
		{
			name: "unified server: the grammar queue is not waiting",
			in: `sglang:num_running_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 8
sglang:num_queue_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 3
sglang:num_grammar_queue_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 4
sglang:num_prefill_bootstrap_queue_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0
sglang:num_decode_prealloc_queue_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0
sglang:num_decode_transfer_queue_reqs{engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0
`,
			want: map[string]float64{"running": 8, "waiting": 3},
		},
		{
			// The queues add to the waiting queue; without its reading
			// Waiting is unknown, not the other queues alone.
			name: "no waiting queue reading: waiting unknown",
			in: `sglang:num_running_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 1
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 3
`,
			want: map[string]float64{"running": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := modelserver.Parse(strings.NewReader(tt.in))
			require.NoError(t, err)
			assert.Equal(t, modelserver.SGLang, res.Engine)
			assert.Equal(t, tt.want, fields(res.Sample))
		})
	}
}
