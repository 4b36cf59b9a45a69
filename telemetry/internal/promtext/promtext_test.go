package promtext_test

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		names   []string
		skipped int
		err     bool
	}{
		{name: "clean", in: "# TYPE a gauge\na 1\nb{x=\"y\"} 2\n", names: []string{"a", "b"}},
		{name: "bad line in the middle keeps what follows", in: "a 1\nb{x=y} 2\nc 3\n", names: []string{"a", "c"}, skipped: 1, err: true},
		{name: "duplicate HELP loses types, not values", in: "# HELP a x\na 1\n# HELP a x\na{k=\"v\"} 2\n", names: []string{"a"}, err: true},
		{name: "truncated last line", in: "a 1\nb{x=\"", names: []string{"a"}, skipped: 1, err: true},
		// "b 12" may be all that came of "b 128": it is not read.
		{name: "truncated last value", in: "a 1\nb 12", names: []string{"a"}, skipped: 1, err: true},
		{name: "blanks after the last line feed", in: "a 1\n  \t", names: []string{"a"}},
		{name: "OpenMetrics needs no line feed after # EOF", in: "a 1\n# EOF", names: []string{"a"}},
		{name: "empty", in: ""},
		{name: "CRLF line ends", in: "# TYPE a gauge\r\na 1\r\nb{x=\"y\"} 2\r\n", names: []string{"a", "b"}},
		{name: "CRLF with a bad line", in: "a 1\r\nb{x=y} 2\r\nc 3\r\n", names: []string{"a", "c"}, skipped: 1, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fams, skipped, err := promtext.Parse([]byte(tt.in))
			assert.Equal(t, tt.err, err != nil, "err: %v", err)
			assert.Equal(t, tt.skipped, skipped)
			var names []string
			for n := range fams {
				names = append(names, n)
			}
			assert.ElementsMatch(t, tt.names, names)
		})
	}
}

func TestValueAndLabel(t *testing.T) {
	fams, _, err := promtext.Parse([]byte("# TYPE c counter\nc_total{k=\"v\"} 3\n# TYPE g gauge\ng NaN\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n"))
	require.NoError(t, err)
	v, ok := promtext.Value(fams["c_total"].Metric[0])
	assert.True(t, ok)
	assert.Equal(t, 3.0, v)
	assert.Equal(t, "v", promtext.Label(fams["c_total"].Metric[0], "k"))
	assert.Equal(t, "", promtext.Label(fams["c_total"].Metric[0], "nope"))
	_, ok = promtext.Value(fams["g"].Metric[0])
	assert.False(t, ok, "NaN is no value")
	_, ok = promtext.Value(fams["h"].Metric[0])
	assert.False(t, ok, "a histogram has no single value")
}

// allocPerLine returns the bytes Parse allocates per line of data.
func allocPerLine(data []byte, lines int) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, _ = promtext.Parse(data)
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(lines)
}

// One malformed line (Triton's documented histogram lines are real ones)
// sends Parse line by line. That pass must cost about what the clean parse
// does, not an order of magnitude more: parsing runs after the scrape,
// outside the round's timeout, on up to 16 MiB of a target's answer (a
// fresh parser per line allocated 12x the clean parse's bytes, and a 16 MiB
// exposition took 7 s). Bytes allocated are deterministic where time is not.
func TestParseLineByLineCostsAboutACleanParse(t *testing.T) {
	const lines = 5000
	var clean bytes.Buffer
	for range lines {
		clean.WriteString("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n")
	}
	bad := append([]byte("bad{ line\n"), clean.Bytes()...)
	cleanCost, fallbackCost := allocPerLine(clean.Bytes(), lines), allocPerLine(bad, lines)
	t.Logf("bytes per line: clean %d, line by line %d", cleanCost, fallbackCost)
	assert.Less(t, fallbackCost, 3*cleanCost)
}

// Parse reads data; it must not write into it.
func TestParseLeavesItsInputAlone(t *testing.T) {
	in := []byte("a 1\r\nb{x=y} 2  \nc 3\t\n")
	orig := bytes.Clone(in)
	_, _, err := promtext.Parse(in)
	require.Error(t, err)
	assert.Equal(t, string(orig), string(in))
}

// OpenMetrics (what a server that ignores our Accept header, or a proxy in
// front of one, may answer) differs from the text format in ways expfmt's
// text parser rejects line by line: exemplars after the value, timestamps
// in float seconds, and the info, stateset, gaugehistogram and unknown
// types. Those lines carry readable values; only malformed ones are skipped.
func TestParseOpenMetrics(t *testing.T) {
	const om = `# HELP vllm:num_requests_running Number of requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# HELP vllm:prefix_cache_hits Hits.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 10.0 # {trace_id="abc"} 0.5 1700000000.0
vllm:prefix_cache_hits_created{model_name="m"} 1.7e+09
# TYPE vllm:build info
vllm:build_info{version="0.11.0"} 1
# TYPE ttft_seconds histogram
# UNIT ttft_seconds seconds
ttft_seconds_bucket{le="0.1"} 2 # {trace_id="x#y} "} 0.05
ttft_seconds_bucket{le="+Inf"} 3
ttft_seconds_count 3
ttft_seconds_sum 0.4
ttft_seconds_created 1.7e+09
# TYPE temp_celsius gauge
# UNIT temp_celsius celsius
temp_celsius{hash="#1"} 41.5 1700000000.125
# TYPE state stateset
state{state="a"} 1
# TYPE other unknown
other 7 1700000000
# EOF
`
	fams, skipped, err := promtext.Parse([]byte(om))
	require.NoError(t, err)
	assert.Zero(t, skipped)
	val := func(name string) float64 {
		t.Helper()
		f, ok := fams[name]
		require.True(t, ok, "family %s missing; have %v", name, keys(fams))
		require.Len(t, f.Metric, 1)
		v, ok := promtext.Value(f.Metric[0])
		require.True(t, ok, name)
		return v
	}
	assert.Equal(t, 3.0, val("vllm:num_requests_running"))
	assert.Equal(t, 10.0, val("vllm:prefix_cache_hits_total"))
	assert.Equal(t, 1.0, val("vllm:build_info"))
	assert.Equal(t, 41.5, val("temp_celsius"))
	assert.Equal(t, "#1", promtext.Label(fams["temp_celsius"].Metric[0], "hash"))
	assert.Equal(t, 1.0, val("state"))
	assert.Equal(t, 7.0, val("other"))
	assert.Equal(t, dto.MetricType_GAUGE, fams["vllm:num_requests_running"].GetType())
	assert.Equal(t, dto.MetricType_COUNTER, fams["vllm:prefix_cache_hits_total"].GetType())
	require.Contains(t, fams, "ttft_seconds")
	assert.Equal(t, dto.MetricType_HISTOGRAM, fams["ttft_seconds"].GetType())
	assert.Equal(t, uint64(3), fams["ttft_seconds"].Metric[0].GetHistogram().GetSampleCount())
}

func TestParseOpenMetricsMalformedLinesStayCounted(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		names   []string
		skipped int
	}{
		{
			name:    "OpenMetrics with a bad line",
			in:      "# TYPE a gauge\na 1 # {t=\"x\"} 1\nb{x=y} 2 # {t=\"x\"} 1\nc 3 1.5\n# EOF\n",
			names:   []string{"a", "c"},
			skipped: 1,
		},
		{
			// No # EOF: not OpenMetrics, and invalid text format, but the
			// exemplar and float timestamp do not hide the values.
			name:    "text with exemplars and float timestamps",
			in:      "a 1 # {t=\"x\"} 1\nc 3 1.5\nd 4\n",
			names:   []string{"a", "c", "d"},
			skipped: 0,
		},
		{name: "trailing garbage", in: "a 1 x\nb 2 3 4\nc 3 # nope\nd 4\n", names: []string{"d"}, skipped: 3},
		{name: "unterminated exemplar", in: "a 1 # {t=\"x\n d 4\n", names: []string{"d"}, skipped: 1},
		{name: "exemplar without value", in: "a 1 # {t=\"x\"}\nd 4\n# EOF\n", names: []string{"d"}, skipped: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fams, skipped, err := promtext.Parse([]byte(tt.in))
			assert.Error(t, err)
			assert.Equal(t, tt.skipped, skipped)
			assert.ElementsMatch(t, tt.names, keys(fams))
		})
	}
}

func keys(f promtext.Families) []string {
	var out []string
	for n := range f {
		out = append(out, n)
	}
	return out
}

func TestParseSelected(t *testing.T) {
	in := "# HELP a help\n# TYPE a gauge\na{x=\"1\"} 1\n# TYPE b gauge\nb 2\nbad{x=y} 3\n{\"a\", x=\"2\"} 4\n{{{ junk\n  a{x=\"3\"} 5\n"
	var asked []string
	fams, skipped, err := promtext.ParseSelected([]byte(in), func(name []byte) bool {
		asked = append(asked, string(name))
		return string(name) == "a"
	})
	require.Error(t, err, "the unnamed line is parsed, and fails")
	assert.Equal(t, 1, skipped, "only the unnamed line: bad{x=y} is not a metric asked for")
	assert.Equal(t, []string{"a"}, keys(fams))
	assert.Len(t, fams["a"].Metric, 3)
	assert.Equal(t, []string{"a", "a", "a", "b", "b", "bad", "a", "a"}, asked)
}

func TestParseSelectedTypesSurvive(t *testing.T) {
	fams, skipped, err := promtext.ParseSelected([]byte("# TYPE a gauge\na 1\n# TYPE b counter\nb 2\n"),
		func(name []byte) bool { return string(name) == "a" })
	require.NoError(t, err)
	assert.Zero(t, skipped)
	assert.Equal(t, dto.MetricType_GAUGE, fams["a"].GetType())
	assert.Equal(t, []string{"a"}, keys(fams))
}

// Past MaxSamples sample lines are dropped and counted: a target that
// answers with a million series of a metric read costs a bounded parse.
func TestParseBoundsTheSamples(t *testing.T) {
	var b bytes.Buffer
	for i := range promtext.MaxSamples + 10 {
		fmt.Fprintf(&b, "a{i=\"%d\"} 1\n", i)
	}
	b.WriteString("other 1\n")
	for _, keep := range []func([]byte) bool{nil, func(n []byte) bool { return string(n) == "a" }} {
		over := 10 + btoi(keep == nil) // nil keeps "other" too, past the limit
		fams, skipped, err := promtext.ParseSelected(b.Bytes(), keep)
		require.ErrorContains(t, err, fmt.Sprintf("%d sample lines past the first", over))
		assert.Equal(t, over, skipped)
		assert.Len(t, fams["a"].Metric, promtext.MaxSamples)
	}
	_, skipped, err := promtext.Parse([]byte("a 1\nb{ 2\n"))
	assert.Equal(t, 1, skipped)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "past the first", "under the limit")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestSampleValue(t *testing.T) {
	for _, tt := range []struct {
		line, name string
		v          float64
		ok         bool
	}{
		{"a 3\n", "a", 3, true},
		{"  a{x=\"} y\"} 1.5e9\r\n", "a", 1.5e9, true},
		{"a{x=\"a b\"}7", "a", 7, true},
		{"{\"vllm:x\", y=\"1\"} 2 1700000000.5 # {t=\"1\"} 1\n", "vllm:x", 2, true},
		{"a{x=\"1\"} NaN\n", "a", math.NaN(), true},
		{"a{x=\"1\"} twelve\n", "a", 0, false},
		{"a{x=\"1\n", "a", 0, false},
		{"# TYPE a gauge\n", "", 0, false},
		{"\n", "", 0, false},
	} {
		name, v, ok := promtext.SampleValue([]byte(tt.line))
		assert.Equal(t, tt.name, string(name), tt.line)
		assert.Equal(t, tt.ok, ok, tt.line)
		if tt.ok && !math.IsNaN(tt.v) {
			assert.Equal(t, tt.v, v, tt.line)
		}
	}
}
