package promtext_test

import (
	"bytes"
	"runtime"
	"testing"

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
		{name: "empty", in: ""},
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
