package loadheader_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/loadheader"
)

// Mutation sample 4 over Parse: each case names the mutant it kills.
func TestParseMutationSample4(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        map[string]float64
		partial     bool
		kills       string
	}{
		{
			name:  "text with protobuf's camelCase utilizations",
			value: "TEXT cpuUtilization=0.3, applicationUtilization=0.6",
			want:  map[string]float64{"cpu_util": 0.3, "app_util": 0.6},
			kills: `loadField without "cpuUtilization"`,
		},
		{
			name:  "json count whose first digit is 9",
			value: `JSON {"named_metrics": {"num_requests_waiting": 9, "num_requests_running": 95}}`,
			want:  map[string]float64{"waiting": 9, "running": 95},
			kills: "loadNumber reading a value that begins with 9 as not a number",
		},
		{
			name:  "json null at the top level is no reading, and no fault",
			value: `JSON {"cpu_utilization": null, "named_metrics": {"num_requests_waiting": 2}}`,
			want:  map[string]float64{"waiting": 2},
			kills: `loadNumber not reading "null" as absent`,
		},
		{
			name:    "json named metrics of the wrong kind alone is a fault",
			value:   `JSON {"named_metrics": [3], "cpu_utilization": 0.5}`,
			want:    map[string]float64{"cpu_util": 0.5},
			partial: true,
			kills:   "an UnmarshalTypeError not counted as a bad entry",
		},
		{
			name:    "json's second spelling, unreadable and below the first, is a fault",
			value:   `JSON {"cpu_utilization": 0.5, "cpuUtilization": -1}`,
			want:    map[string]float64{"cpu_util": 0.5},
			partial: true,
			kills:   "the fuller-spelling check not validating the second value: -1 dropped unseen",
		},
		{
			name:    "json key with an escaped quote, then a NaN",
			value:   `JSON {"named_metrics": {"x\"": 1, "num_requests_waiting": 2, "kv_cache_usage_perc": NaN}}`,
			want:    map[string]float64{"waiting": 2},
			partial: true,
			kills:   "nonFiniteAsNull not skipping an escaped quote: the NaN read as in a string, the report lost",
		},
		{
			name:  "a full KV cache",
			value: "TEXT named_metrics.kv_cache_usage_perc=1, named_metrics.num_requests_waiting=0",
			want:  map[string]float64{"kv_cache_usage": 1, "waiting": 0},
			kills: "validLoad rejecting a KV-cache usage of exactly 1",
		},
		{
			name:    "an engine's waiting count no server reaches does not drop the others'",
			value:   "TEXT named_metrics.num_requests_waiting=3, named_metrics.num_requests_waiting=1e15",
			want:    map[string]float64{"waiting": 3},
			partial: true,
			kills:   "validLoad not bounding Waiting: the sum passed MaxRequests and the count was dropped",
		},
		{
			name:    "an engine's infinite utilization does not drop the others'",
			value:   "TEXT cpu_utilization=0.5, cpu_utilization=Inf",
			want:    map[string]float64{"cpu_util": 0.5},
			partial: true,
			kills:   "validLoad admitting +Inf: the repeat's max was refused and the field dropped",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := loadheader.Parse(tc.value)
			if tc.partial {
				require.ErrorIs(t, err, telemetry.ErrPartial, "kills: %s", tc.kills)
			} else {
				require.NoError(t, err, "kills: %s", tc.kills)
			}
			assert.Equal(t, tc.want, fields(s), "kills: %s", tc.kills)
		})
	}
}

// The error names the first unreadable entry, not a later one. Kills
// parseLoadText overwriting firstBad with each pair without '='.
func TestParseNamesTheFirstBadEntry(t *testing.T) {
	_, err := loadheader.Parse("TEXT first-garbage, named_metrics.num_requests_waiting=3, second-garbage")
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "first-garbage")
	assert.Contains(t, err.Error(), "2 unreadable entries")
}
