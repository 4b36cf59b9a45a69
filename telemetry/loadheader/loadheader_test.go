package loadheader_test

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/loadheader"
)

// fields flattens a Sample into name -> value for readable comparisons.
func fields(s telemetry.Sample) map[string]float64 {
	out := map[string]float64{}
	for f := range telemetry.NumFields {
		if v, ok := s.Get(telemetry.Field(f)); ok {
			out[telemetry.Field(f).String()] = v
		}
	}
	return out
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    map[string]float64
		partial bool // error wraps telemetry.ErrPartial, fields still returned
		err     bool // error and no fields
	}{
		{
			name:  "vllm text",
			value: "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3",
			want:  map[string]float64{"kv_cache_usage": 0.4, "waiting": 3},
		},
		{
			name: "text from a data-parallel server: one entry per engine",
			value: "TEXT named_metrics.kv_cache_usage_perc=0.9, named_metrics.kv_cache_usage_perc=0.2, " +
				"named_metrics.num_requests_waiting=3.0, named_metrics.num_requests_waiting=1.0, " +
				"named_metrics.num_requests_running=2, named_metrics.num_requests_running=5",
			want: map[string]float64{"kv_cache_usage": 0.9, "waiting": 4, "running": 7},
		},
		{
			name:    "an engine's bad entry does not bend the sum",
			value:   "TEXT named_metrics.num_requests_waiting=3, named_metrics.num_requests_waiting=-2",
			want:    map[string]float64{"waiting": 3},
			partial: true,
		},
		{
			name:    "json null is no reading, not zero",
			value:   `JSON {"named_metrics": {"num_requests_waiting": null, "kv_cache_usage_perc": 0.5}}`,
			want:    map[string]float64{"kv_cache_usage": 0.5},
			partial: true,
		},
		{
			name:    "json from Python with NaN and Infinity keeps the finite values",
			value:   `JSON {"named_metrics": {"num_requests_waiting": 3, "kv_cache_usage_perc": NaN, "num_requests_running": Infinity}, "cpu_utilization": -Infinity}`,
			want:    map[string]float64{"waiting": 3},
			partial: true,
		},
		{
			name:  "json strings that spell NaN are left alone",
			value: `JSON {"named_metrics": {"NaN": 1, "num_requests_waiting": 2}}`,
			want:  map[string]float64{"waiting": 2},
		},
		{
			name:  "text with orca top-level keys and unknown keys",
			value: "TEXT cpu_utilization=0.25, mem_utilization=0.9, application_utilization=0.5, named_metrics.num_requests_running=7, named_metrics.custom=1, rps_fractional=10",
			want:  map[string]float64{"cpu_util": 0.25, "app_util": 0.5, "running": 7},
		},
		{
			name:  "lower-case prefix, stray spaces and empty pairs",
			value: "  text  named_metrics.num_requests_waiting = 2 ,, ",
			want:  map[string]float64{"waiting": 2},
		},
		{
			name:  "vllm doc spelling kv_cache_utilization",
			value: "TEXT named_metrics.kv_cache_utilization=0.75",
			want:  map[string]float64{"kv_cache_usage": 0.75},
		},
		{
			name:  "vllm json",
			value: `JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3.0}}`,
			want:  map[string]float64{"kv_cache_usage": 0.4, "waiting": 3},
		},
		{
			name:  "json with top-level utilizations, snake and camel case",
			value: `JSON {"cpu_utilization": 0.3, "applicationUtilization": 0.6, "namedMetrics": {"num_requests_running": 4}}`,
			want:  map[string]float64{"cpu_util": 0.3, "app_util": 0.6, "running": 4},
		},
		{
			name:    "text with one bad number keeps the rest",
			value:   "TEXT named_metrics.kv_cache_usage_perc=abc, named_metrics.num_requests_waiting=3",
			want:    map[string]float64{"waiting": 3},
			partial: true,
		},
		{
			name:    "text pair without equals sign",
			value:   "TEXT named_metrics.num_requests_waiting=3, garbage",
			want:    map[string]float64{"waiting": 3},
			partial: true,
		},
		{
			name:    "nan, negative and percent-scaled values are rejected",
			value:   "TEXT named_metrics.kv_cache_usage_perc=40, named_metrics.num_requests_waiting=-1, cpu_utilization=NaN, named_metrics.num_requests_running=2",
			want:    map[string]float64{"running": 2},
			partial: true,
		},
		{
			name:    "a count no server reaches is rejected",
			value:   "TEXT named_metrics.num_requests_running=1e15, named_metrics.num_requests_waiting=2",
			want:    map[string]float64{"waiting": 2},
			partial: true,
		},
		{
			// Each engine's count passes, their sum does not: no count,
			// counted, rather than the first engine's alone with
			// nothing said (Sample.Set refuses the sum).
			name:    "engines' counts that add up past MaxRequests are rejected",
			value:   "TEXT named_metrics.num_requests_running=600000, named_metrics.num_requests_running=600000, named_metrics.num_requests_running=5, named_metrics.num_requests_waiting=2",
			want:    map[string]float64{"waiting": 2},
			partial: true,
		},
		{
			name:    "json with an out-of-range value",
			value:   `JSON {"named_metrics": {"kv_cache_usage_perc": 1.5, "num_requests_waiting": 1}}`,
			want:    map[string]float64{"waiting": 1},
			partial: true,
		},
		{
			name:    "json with a string value keeps the rest",
			value:   `JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": "3"}}`,
			want:    map[string]float64{"kv_cache_usage": 0.4},
			partial: true,
		},
		{
			name:    "protobuf json writes a NaN as a string",
			value:   `JSON {"cpuUtilization": "NaN", "namedMetrics": {"kv_cache_usage_perc": 0.4}}`,
			want:    map[string]float64{"kv_cache_usage": 0.4},
			partial: true,
		},
		{
			name:    "json with a number past float64",
			value:   `JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 1e400}}`,
			want:    map[string]float64{"kv_cache_usage": 0.4},
			partial: true,
		},
		{
			name:    "json with named metrics that are not an object",
			value:   `JSON {"named_metrics": [3], "cpu_utilization": 0.5, "application_utilization": true}`,
			want:    map[string]float64{"cpu_util": 0.5},
			partial: true,
		},
		{name: "json with only a string value", value: `JSON {"named_metrics": {"num_requests_waiting": "3"}}`, err: true},
		{name: "json that is not an object", value: `JSON [1]`, err: true},
		{name: "empty", value: "", err: true},
		{name: "no prefix", value: "named_metrics.kv_cache_usage_perc=0.4", err: true},
		{name: "binary form", value: "BIN Cg0KBGZvbxIFCgNiYXI=", err: true},
		{name: "text with nothing known", value: "TEXT named_metrics.custom=1", err: true},
		{name: "text with only bad values", value: "TEXT named_metrics.num_requests_waiting=x", err: true},
		{name: "broken json", value: `JSON {"named_metrics": {`, err: true},
		{name: "python json NaN", value: `JSON {"named_metrics": {"kv_cache_usage_perc": NaN}}`, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := loadheader.Parse(tt.value)
			assert.True(t, s.Time.IsZero(), "parsers leave Time to the caller")
			switch {
			case tt.err:
				require.Error(t, err)
				assert.NotErrorIs(t, err, telemetry.ErrPartial)
				assert.True(t, s.Empty())
			case tt.partial:
				require.ErrorIs(t, err, telemetry.ErrPartial)
				assert.Equal(t, tt.want, fields(s))
			default:
				require.NoError(t, err)
				assert.Equal(t, tt.want, fields(s))
			}
		})
	}
}

// Two spellings of one reading in a JSON report (vLLM's and its
// documentation's KV-cache names, snake and camel case) are read as the text
// form reads a repeat of a fraction: the fuller one, every time. Go's map
// order must not pick a different one on each response.
func TestParseJSONAliasesAreDeterministic(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  map[string]float64
	}{
		{`JSON {"named_metrics": {"kv_cache_usage_perc": 0.2, "kv_cache_utilization": 0.9}}`, map[string]float64{"kv_cache_usage": 0.9}},
		{`JSON {"named_metrics": {"kv_cache_utilization": 0.2, "kv_cache_usage_perc": 0.9}}`, map[string]float64{"kv_cache_usage": 0.9}},
		{`JSON {"namedMetrics": {"num_requests_waiting": 3}, "named_metrics": {"num_requests_waiting": 1}}`, map[string]float64{"waiting": 3}},
		{`JSON {"cpuUtilization": 0.2, "cpu_utilization": 0.7}`, map[string]float64{"cpu_util": 0.7}},
	} {
		for range 64 {
			s, err := loadheader.Parse(tc.value)
			require.NoError(t, err)
			require.Equal(t, tc.want, fields(s), tc.value)
		}
	}
}

func TestParseFormatError(t *testing.T) {
	_, err := loadheader.Parse("BIN abc")
	assert.True(t, errors.Is(err, loadheader.ErrFormat))
	assert.Contains(t, err.Error(), "BIN")
}

func TestParseTextDoesNotAllocate(t *testing.T) {
	v := "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3"
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := loadheader.Parse(v); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "the response path parses this header on every call")
}

// loadKeys are the keys Parse reads, one spelling a field, as vLLM writes
// them in each form.
var loadKeys = []struct {
	f          telemetry.Field
	text, json string // the JSON key under "named_metrics", or at the top
	named      bool
}{
	{telemetry.KVCacheUsage, "named_metrics.kv_cache_usage_perc", "kv_cache_usage_perc", true},
	{telemetry.Waiting, "named_metrics.num_requests_waiting", "num_requests_waiting", true},
	{telemetry.Running, "named_metrics.num_requests_running", "num_requests_running", true},
	{telemetry.CPUUtil, "cpu_utilization", "cpu_utilization", false},
	{telemetry.AppUtil, "application_utilization", "application_utilization", false},
}

// FuzzParse: whatever a server sends, Parse returns fields only with no
// error or a partial one, and only the fields it reads, each a value a
// server can measure; and what it read, written back as vLLM writes
// either form, reads back the same with no error.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3",
		`JSON {"named_metrics": {"kv_cache_usage_perc": 0.4}, "cpu_utilization": 0.2}`,
		"TEXT ,=,==,", "JSON", "BIN x", "",
		"TEXT named_metrics.num_requests_running=1e6, named_metrics.num_requests_running=1e6, cpu_utilization=0x1p-2",
		`JSON {"namedMetrics": {"kv_cache_utilization": 1, "num_requests_waiting": NaN}, "cpuUtilization": 3, "cpu_utilization": 2}`,
		`json {"named_metrics": null, "application_utilization": -Infinity, "x": "NaN"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		s, err := loadheader.Parse(v)
		if err != nil && !errors.Is(err, telemetry.ErrPartial) && !s.Empty() {
			t.Fatalf("a non-partial error must not return fields: %v", err)
		}
		if err == nil && s.Empty() {
			t.Fatal("success must return at least one field")
		}
		if !s.Time.IsZero() {
			t.Fatalf("Time %v: the caller stamps it", s.Time)
		}
		var text, named, top []string
		var read telemetry.FieldSet
		for _, k := range loadKeys {
			x, ok := s.Get(k.f)
			if !ok {
				continue
			}
			read |= 1 << k.f
			if x < 0 || math.IsInf(x, 0) || math.IsNaN(x) || k.f == telemetry.KVCacheUsage && x > 1 {
				t.Fatalf("%s = %v: no server measures it", k.f, x)
			}
			num := strconv.FormatFloat(x, 'g', -1, 64)
			text = append(text, k.text+"="+num)
			if k.named {
				named = append(named, strconv.Quote(k.json)+": "+num)
			} else {
				top = append(top, strconv.Quote(k.json)+": "+num)
			}
		}
		if s.Has != read {
			t.Fatalf("%q: fields %v, of which Parse reads only %v", v, s.Has, read)
		}
		if s.Empty() {
			return
		}
		js := `JSON {` + strings.Join(append(top, `"named_metrics": {`+strings.Join(named, ", ")+`}`), ", ") + `}`
		for _, again := range []string{"TEXT " + strings.Join(text, ", "), js} {
			s2, err := loadheader.Parse(again)
			if err != nil || !reflect.DeepEqual(fields(s2), fields(s)) {
				t.Fatalf("%q read %v; written back as %q, %v %v", v, fields(s), again, fields(s2), err)
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct{ name, v string }{
		{"text", "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3"},
		{"json", `JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3.0}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := loadheader.Parse(bc.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
