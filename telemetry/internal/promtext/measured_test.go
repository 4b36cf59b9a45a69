package promtext_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

func TestMeasuredAt(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want time.Time // zero: not known
	}{
		{"federation: the oldest sample's time", "a 1 1767225590250\nb{x=\"y\"} 2 1767225588000\n", time.UnixMilli(1767225588000)},
		{"one sample without a time", "a 1 1767225590250\nb 2\n", time.Time{}},
		{"none with a time", "a 1\n", time.Time{}},
		{"no sample", "# TYPE a gauge\n", time.Time{}},
		{"OpenMetrics: float seconds", "# TYPE a gauge\na 1 1767225590.25\nb 2 1767225591 # {t=\"x\"} 1 1767225000\n# EOF\n", time.UnixMilli(1767225590250)},
		{"OpenMetrics: an exemplar's time is not the sample's", "# TYPE a gauge\na 1 # {t=\"x\"} 1 1767225000\n# EOF\n", time.Time{}},
		{"line by line: a bad line does not hide the others' times", "a 1 1767225590250\nb{x=y} 2\nc 3 1767225589000\n", time.UnixMilli(1767225589000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fams, _, _ := promtext.Parse([]byte(tc.in))
			require.NotNil(t, fams)
			at, ok := promtext.MeasuredAt(fams)
			assert.Equal(t, !tc.want.IsZero(), ok)
			assert.True(t, at.Equal(tc.want), "got %v, want %v", at, tc.want)
		})
	}
}
