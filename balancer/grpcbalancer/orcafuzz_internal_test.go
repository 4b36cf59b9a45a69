package grpcbalancer

import (
	"math"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"

	"github.com/inferlb/inferlb/telemetry"
)

// orcaRef is sampleFromORCA's model: a utilization is read when positive
// and finite, reported bad when else and not 0; a named metric, or else
// the named utilization of the name, is read when a value the field can
// hold, and reported bad when not; of a field's names the largest value
// read stands.
func orcaRef(r *v3orcapb.OrcaLoadReport) (map[telemetry.Field]float64, bool) {
	want := map[telemetry.Field]float64{}
	bad := false
	for f, v := range map[telemetry.Field]float64{telemetry.CPUUtil: r.CpuUtilization, telemetry.AppUtil: r.ApplicationUtilization} {
		switch {
		case v == 0:
		case v > 0 && !math.IsInf(v, 1):
			want[f] = v
		default:
			bad = true
		}
	}
	for _, m := range namedMetrics {
		v, ok := r.NamedMetrics[m.name]
		if !ok {
			if v, ok = r.Utilization[m.name]; !ok {
				continue
			}
		}
		count := m.field == telemetry.Running || m.field == telemetry.Waiting
		if !(v >= 0) || math.IsInf(v, 1) || m.fraction && v > 1 || count && v > telemetry.MaxRequests {
			bad = true
			continue
		}
		if old, ok := want[m.field]; !ok || v > old {
			want[m.field] = v
		}
	}
	return want, bad
}

// FuzzSampleFromORCA: whatever load report a server sends, per call or out
// of band, the sample holds what orcaRef reads of it, stamped now, and
// says it was bad exactly when orcaRef does.
func FuzzSampleFromORCA(f *testing.F) {
	f.Add(0.5, 0.0, "kv_cache_usage_perc", 0.4, "num_requests_waiting", 3.0, "kv_cache_usage", 0.9)
	f.Add(math.NaN(), -1.0, "kv_cache_usage", math.NaN(), "queue_depth", math.Inf(1), "num_requests_running", -3.0)
	f.Add(math.Inf(1), 2.0, "gpu_cache_usage_perc", 1.7, "num_requests_running", 2e6, "prefix_cache_hit_rate", 0.25)
	f.Add(0.0, 0.0, "kv_cache_utilization", 0.0, "num_requests_waiting", 1.0, "num_requests_waiting", 9.0)
	f.Fuzz(func(t *testing.T, cpu, app float64, k1 string, v1 float64, k2 string, v2 float64, u string, uv float64) {
		r := &v3orcapb.OrcaLoadReport{CpuUtilization: cpu, ApplicationUtilization: app,
			NamedMetrics: map[string]float64{k1: v1, k2: v2}, Utilization: map[string]float64{u: uv}}
		now := time.Unix(1767225600, 0)
		s, bad := sampleFromORCA(r, now)
		want, wantBad := orcaRef(r)
		if !s.Time.Equal(now) || bad != wantBad {
			t.Fatalf("%v: time %v bad %v, want bad %v", r, s.Time, bad, wantBad)
		}
		for fl := range telemetry.NumFields {
			got, ok := s.Get(telemetry.Field(fl))
			w, wok := want[telemetry.Field(fl)]
			if ok != wok || got != w {
				t.Fatalf("%v: %s = %v (%v), want %v (%v)", r, telemetry.Field(fl), got, ok, w, wok)
			}
		}
	})
}
