package httpbalancer

import (
	"net/textproto"

	"github.com/inferlb/inferlb/telemetry/loadheader"
)

// The vLLM (ORCA) per-response load report: the client asks with
// loadFormatHeader and the server answers in loadHeader, e.g.
//
//	endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3
//
// Canonical forms, so the hot path indexes the header map without
// canonicalizing on every request.
var (
	loadHeader       = textproto.CanonicalMIMEHeaderKey(loadheader.Name)
	loadFormatHeader = textproto.CanonicalMIMEHeaderKey(loadheader.FormatName)
)
