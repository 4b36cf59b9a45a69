package modelserver_test

import "github.com/inferlb/inferlb/telemetry"

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
