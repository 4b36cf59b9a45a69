package httpbalancer

import (
	"errors"
	"strconv"
	"strings"

	"github.com/inferlb/inferlb/telemetry"
)

// The vLLM (ORCA) per-response load report: the client asks with
// loadFormatHeader and the server answers in loadHeader, e.g.
//
//	endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3
//
// These mirror modelserver.LoadHeader and modelserver.LoadFormatHeader.
const (
	loadHeader       = "Endpoint-Load-Metrics"
	loadFormatHeader = "Endpoint-Load-Metrics-Format"
)

var errLoadReport = errors.New("inferlb: endpoint-load-metrics: not a TEXT load report")

// parseLoadHeader stands in for modelserver.ParseLoadHeader (same signature),
// which is being written concurrently; it understands the TEXT format only.
// Like that parser it leaves Time zero for the caller to stamp.
func parseLoadHeader(v string) (telemetry.Sample, error) {
	var s telemetry.Sample
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "TEXT ")
	if !ok {
		return s, errLoadReport
	}
	for kv := range strings.SplitSeq(rest, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch strings.TrimPrefix(strings.TrimSpace(k), "named_metrics.") {
		case "kv_cache_usage_perc", "kv_cache_utilization":
			s.Set(telemetry.KVCacheUsage, f)
		case "num_requests_waiting":
			s.Set(telemetry.Waiting, f)
		case "num_requests_running":
			s.Set(telemetry.Running, f)
		case "cpu_utilization":
			s.Set(telemetry.CPUUtil, f)
		case "application_utilization":
			s.Set(telemetry.AppUtil, f)
		}
	}
	if s.Empty() {
		return s, errLoadReport
	}
	return s, nil
}
