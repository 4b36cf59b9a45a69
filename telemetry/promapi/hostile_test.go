package promapi_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// bigAnswer is a query answer of at least size bytes: series of distinct
// instances, as a query without its aggregation (or with a selector that
// matches far more than meant) returns on a big Prometheus.
func bigAnswer(size int) string {
	var b bytes.Buffer
	b.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"metric":{"instance":"10.%d.%d.%d:8000","inferlb_field":"waiting"},"value":[1767225600.5,"3"]}`, i>>16, i>>8&255, i&255)
	}
	b.WriteString(`]}}`)
	return b.String()
}

// An answer up to MaxBodyBytes (64 MiB by default) was read whole, then
// decoded whole into maps and boxed values before the first series was
// looked at: 19 times the body (304 MiB for 16 MiB), enough to take an
// embedding process past its memory limit from one answer. The cost must
// follow the body, and the observations kept are bounded.
func TestCollectCostFollowsTheBody(t *testing.T) {
	body := bigAnswer(16 << 20)
	src := fakeProm(t, 200, body, nil)
	var n int
	var err error
	a := testutil.Allocated(func() {
		obs, e := src.Collect(t.Context())
		n, err = len(obs), e
	})
	t.Logf("%d observations, %d MiB allocated for a %d MiB answer: %v", n, a>>20, len(body)>>20, err)
	assert.Less(t, a, 4*uint64(len(body)))
	require.ErrorIs(t, err, telemetry.ErrPartial, "endpoints past the bound are skipped and counted")
	assert.Equal(t, telemetry.DefaultMaxEndpoints, n)
}

// One series of the wrong shape (a label value that is not a string, from
// a proxy or a buggy federation layer) failed the whole answer: it is
// skipped and counted, and the rest is read.
func TestCollectSkipsASeriesOfTheWrongShape(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":5,"inferlb_field":"waiting"},"value":[1767225600,"9"]},
 {"metric":{"instance":"b","inferlb_field":"waiting"},"value":[1767225600,"4"]}
]}}`
	skipsAAndReadsB(t, body, "promapi: 1 series skipped; first: series of the wrong shape")
}

// skipsAAndReadsB checks an answer whose series for endpoint a is skipped
// and counted with want, and whose series b (waiting 4) is read.
func skipsAAndReadsB(t *testing.T, body, want string) {
	t.Helper()
	obs, err := fakeProm(t, 200, body, nil).Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), want)
	require.Len(t, obs, 1)
	assert.Equal(t, "b", obs[0].EndpointID)
	assert.Equal(t, map[string]float64{"waiting": 4}, fields(obs[0].Sample))
}

// An evaluation time past what int64 nanoseconds hold (the year 2262), or
// not positive, is no time a Prometheus server answers with: converted,
// it became a meaningless one (wrapped into the past, or left to overflow
// UnixNano), and the series went stale in a Store instead of being counted
// as skipped. It is skipped and counted, and the rest is read.
func TestCollectSkipsAnEvaluationTimeOutOfRange(t *testing.T) {
	for _, eval := range []string{"1e10", "9223372037", "1e20", "-1e20", "0", "-5"} {
		t.Run(eval, func(t *testing.T) {
			body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[` + eval + `,"9"]},
 {"metric":{"instance":"b","inferlb_field":"waiting"},"value":[1767225600,"4"]}
]}}`
			skipsAAndReadsB(t, body, "promapi: 1 series skipped; first: waiting for a")
		})
	}
}

// A timestamp series' value within a second of the int64-nanosecond bound
// passed its check and overflowed once rounded to milliseconds.
func TestCollectSkipsAStampAtTheNanosecondBound(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
 {"metric":{"instance":"a","inferlb_field":"waiting"},"value":[1767225600,"9"]},
 {"metric":{"instance":"a","inferlb_time":"waiting"},"value":[1767225600,"9223372036.8"]}
]}}`
	src := fakeProm(t, 200, body, nil)
	src.Queries = map[telemetry.Field]string{telemetry.Waiting: "w"}
	src.Timestamps = map[telemetry.Field]string{telemetry.Waiting: "t"}
	obs, err := src.Collect(t.Context())
	require.ErrorIs(t, err, telemetry.ErrPartial)
	assert.Contains(t, err.Error(), "waiting time for a")
	require.Len(t, obs, 1)
	assert.Equal(t, int64(1767225600), obs[0].Sample.Time.Unix(), "stamped with the evaluation time")
}
