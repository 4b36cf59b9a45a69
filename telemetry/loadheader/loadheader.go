// Package loadheader reads the per-response load reports that vLLM and other
// ORCA-over-HTTP servers send in the endpoint-load-metrics header, into a
// telemetry.Sample. It depends on nothing but the standard library and
// package telemetry, so an HTTP transport can use it without pulling in a
// metrics parser.
package loadheader

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/inferlb/inferlb/telemetry"
)

// Name is the response header in which vLLM (and other ORCA-over-HTTP
// servers) report their load: `TEXT named_metrics.kv_cache_usage_perc=0.4,
// named_metrics.num_requests_waiting=3` or `JSON {"named_metrics": {...}}`.
const Name = "endpoint-load-metrics"

// FormatName is the request header that asks the server for a load
// report and names its format: "text" or "json". vLLM sends no report
// without it. Ask a data-parallel vLLM server for text: it builds its
// JSON report as a Python dict of its engines' gauges, which keeps one
// engine's value per key, while its text lists every engine's (see Parse).
// (vllm-project/vllm vllm/entrypoints/openai/orca_metrics.py,
// create_orca_header.)
const FormatName = "endpoint-load-metrics-format"

// ErrFormat is returned for a load header in a format this package does
// not read (ORCA's BIN, a base64 protobuf, or no format prefix at all).
var ErrFormat = errors.New("loadheader: unsupported endpoint-load-metrics format")

// loadField maps an ORCA key to the Sample field it feeds. Named metrics are
// the ones vLLM emits (see vllm/entrypoints/openai/orca_metrics.py);
// kv_cache_utilization is the spelling of vLLM's own documentation example.
func loadField(key string) (telemetry.Field, bool) {
	switch key {
	case "named_metrics.kv_cache_usage_perc", "named_metrics.kv_cache_utilization":
		return telemetry.KVCacheUsage, true
	case "named_metrics.num_requests_waiting":
		return telemetry.Waiting, true
	case "named_metrics.num_requests_running":
		return telemetry.Running, true
	case "cpu_utilization", "cpuUtilization":
		return telemetry.CPUUtil, true
	case "application_utilization", "applicationUtilization":
		return telemetry.AppUtil, true
	}
	return 0, false
}

// Parse parses the value of an endpoint-load-metrics header (see
// Name) in ORCA's TEXT or JSON form. It maps kv_cache_usage_perc (or
// kv_cache_utilization, the spelling of vLLM's documentation example) to
// KVCacheUsage, num_requests_waiting to Waiting, num_requests_running to
// Running, cpu_utilization to CPUUtil and application_utilization to AppUtil,
// and in JSON reads protobuf's camelCase spellings (cpuUtilization,
// applicationUtilization, namedMetrics) alike; other keys are ignored. A key repeated in TEXT is another data-parallel
// engine's (counts add up, the fullest cache stands); two spellings of one
// key in JSON are one reading, of which the larger stands.
//
// The returned Sample's Time is zero: the caller stamps the response's
// arrival time before publishing it. A value that is partly unreadable (a
// pair without '=', a non-number, a negative count, a fraction above 1)
// yields the readable fields and an error wrapping telemetry.ErrPartial; a
// value with nothing usable yields an error. It does not allocate for the
// TEXT form.
func Parse(value string) (telemetry.Sample, error) {
	value = strings.TrimSpace(value)
	format, rest, _ := strings.Cut(value, " ")
	switch {
	case strings.EqualFold(format, "TEXT"):
		return parseLoadText(rest)
	case strings.EqualFold(format, "JSON"):
		return parseLoadJSON(rest)
	case value == "":
		return telemetry.Sample{}, errors.New("loadheader: empty endpoint-load-metrics header")
	}
	return telemetry.Sample{}, fmt.Errorf("%w: prefix %.16q, want TEXT or JSON", ErrFormat, format)
}

func parseLoadText(s string) (telemetry.Sample, error) {
	var out telemetry.Sample
	var seen telemetry.FieldSet // fields set by this header: a repeat is another engine's
	var over telemetry.FieldSet // counts whose engines' sum passed telemetry.MaxRequests
	bad := 0
	var firstBad string
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, ",")
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		key, val, ok := strings.Cut(pair, "=")
		if !ok {
			bad++
			if firstBad == "" {
				firstBad = pair
			}
			continue
		}
		f, known := loadField(strings.TrimSpace(key))
		if !known {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || !validLoad(f, v) {
			bad++
			if firstBad == "" {
				firstBad = pair
			}
			continue
		}
		if over.Has(f) {
			continue // no count: see below
		}
		if seen.Has(f) {
			// vLLM reports one gauge per engine (data parallelism), each
			// under the same key: requests add up, and the fullest cache
			// speaks for the server, as a scrape of it is read.
			cur, _ := out.Get(f)
			if f == telemetry.Running || f == telemetry.Waiting {
				v += cur
			} else {
				v = max(v, cur)
			}
		}
		if !out.Set(f, v) {
			// The engines' counts add up past telemetry.MaxRequests,
			// which Set refuses: no count, rather than the engines
			// before this one's alone.
			out.Has &^= 1 << f
			over |= 1 << f
			bad++
			if firstBad == "" {
				firstBad = pair
			}
			continue
		}
		seen |= 1 << f
	}
	return loadResult(out, bad, firstBad)
}

// loadReport is ORCA's OrcaLoadReport as vLLM serializes it with Python's
// json.dumps (snake_case); the camelCase spellings are protobuf's JSON
// mapping, which other ORCA servers use. Values are kept raw and read one
// by one, so that one unreadable value (a string: protobuf's JSON writes a
// NaN as "NaN"; a number past float64) is a bad entry, as in the TEXT
// form, rather than the whole report: encoding/json would go on past it
// but leave a pointer to 0 where it stood, a reading no one made.
type loadReport struct {
	CPU        json.RawMessage            `json:"cpu_utilization"`
	CPUCamel   json.RawMessage            `json:"cpuUtilization"`
	App        json.RawMessage            `json:"application_utilization"`
	AppCamel   json.RawMessage            `json:"applicationUtilization"`
	Named      map[string]json.RawMessage `json:"named_metrics"` // null: no reading, not 0
	NamedCamel map[string]json.RawMessage `json:"namedMetrics"`
}

// loadNumber reads a raw JSON value as a number; null is absent.
func loadNumber(raw json.RawMessage) (v float64, present, ok bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, false
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, true, false // a string, a bool, an object or an array
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	return v, true, err == nil
}

func parseLoadJSON(s string) (telemetry.Sample, error) {
	var r loadReport
	bad := 0
	var firstBad string
	unmarshal := func(b []byte) error {
		err := json.Unmarshal(b, &r)
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// A value of the wrong kind where an object belongs
			// (named_metrics: 3, or the report itself): encoding/json
			// went on past it, and what it read stands.
			bad++
			firstBad = te.Field
			if firstBad == "" {
				firstBad = "(the report)"
			}
			return nil
		}
		return err
	}
	if err := unmarshal([]byte(s)); err != nil {
		// Python's json.dumps writes a float NaN or infinity as a bare
		// NaN or Infinity, which JSON has no word for: read those as null
		// (a bad entry) rather than lose the whole report.
		fixed, ok := nonFiniteAsNull(s)
		if !ok {
			return telemetry.Sample{}, fmt.Errorf("loadheader: endpoint-load-metrics JSON: %w", err)
		}
		r, bad, firstBad = loadReport{}, 0, ""
		if unmarshal(fixed) != nil {
			return telemetry.Sample{}, fmt.Errorf("loadheader: endpoint-load-metrics JSON: %w", err)
		}
	}
	var out telemetry.Sample
	try := func(key string, raw json.RawMessage, nullIsBad bool) {
		v, present, ok := loadNumber(raw)
		if !present && !nullIsBad {
			return
		}
		f, _ := loadField(key)
		// A field already read came under another spelling (snake and
		// camel case, kv_cache_usage_perc and kv_cache_utilization): one
		// reading twice, so the fuller one stands, as the text form reads
		// a repeat of a fraction, whatever order the map yields them in.
		if cur, had := out.Get(f); ok && had && validLoad(f, v) && v < cur {
			return
		}
		if !ok || !setLoad(&out, f, v) {
			bad++
			if firstBad == "" {
				firstBad = key
			}
		}
	}
	try("cpu_utilization", r.CPU, false)
	try("cpu_utilization", r.CPUCamel, false)
	try("application_utilization", r.App, false)
	try("application_utilization", r.AppCamel, false)
	for _, named := range []map[string]json.RawMessage{r.Named, r.NamedCamel} {
		for k, v := range named {
			if _, ok := loadField("named_metrics." + k); !ok {
				continue
			}
			// null: the server has no reading; not a 0
			try("named_metrics."+k, v, true)
		}
	}
	return loadResult(out, bad, firstBad)
}

// nonFiniteAsNull replaces the bare tokens NaN, Infinity and -Infinity
// outside strings with null; ok is false when there were none.
func nonFiniteAsNull(s string) (out []byte, ok bool) {
	inString, escaped := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		default:
			if tok := nonFiniteToken(s[i:]); tok != "" {
				out = append(out, "null"...)
				i += len(tok) - 1
				ok = true
				continue
			}
		}
		out = append(out, c)
	}
	return out, ok
}

func nonFiniteToken(s string) string {
	for _, tok := range [...]string{"-Infinity", "Infinity", "NaN"} {
		if strings.HasPrefix(s, tok) {
			return tok
		}
	}
	return ""
}

// setLoad validates v for f before storing it: counts and utilizations are
// never negative, and a KV-cache fraction above 1 is a unit mistake (a
// percentage), not a full cache, so it is rejected rather than clamped.
func setLoad(s *telemetry.Sample, f telemetry.Field, v float64) bool {
	return validLoad(f, v) && s.Set(f, v)
}

func validLoad(f telemetry.Field, v float64) bool {
	return v >= 0 && !math.IsInf(v, 0) && (f != telemetry.KVCacheUsage || v <= 1) &&
		(f != telemetry.Running && f != telemetry.Waiting || v <= telemetry.MaxRequests)
}

func loadResult(s telemetry.Sample, bad int, firstBad string) (telemetry.Sample, error) {
	switch {
	case bad == 0 && !s.Empty():
		return s, nil
	case bad == 0:
		return s, errors.New("loadheader: endpoint-load-metrics header carries no known metric")
	case s.Empty():
		return s, fmt.Errorf("loadheader: endpoint-load-metrics: %d unreadable entries, first %.64q", bad, firstBad)
	}
	return s, fmt.Errorf("%w: endpoint-load-metrics: %d unreadable entries, first %.64q", telemetry.ErrPartial, bad, firstBad)
}
