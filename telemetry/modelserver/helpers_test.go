package modelserver_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
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

// checkParse holds a Parse result to a table case: of engine, failing with
// an error that names wantErr (not ErrPartial, and an empty Sample), or,
// with partial set, an ErrPartial naming partial with want read, or no
// error and want read.
func checkParse(t *testing.T, res modelserver.Result, err error, engine modelserver.Engine, wantErr, partial string, want map[string]float64) {
	t.Helper()
	assert.Equal(t, engine, res.Engine)
	switch {
	case wantErr != "":
		require.Error(t, err)
		assert.NotErrorIs(t, err, telemetry.ErrPartial)
		assert.Contains(t, err.Error(), wantErr)
		assert.True(t, res.Sample.Empty())
		return
	case partial != "":
		require.ErrorIs(t, err, telemetry.ErrPartial)
		assert.Contains(t, err.Error(), partial)
	default:
		require.NoError(t, err)
	}
	assert.Equal(t, want, fields(res.Sample))
}
