// Package promtext reads Prometheus text expositions for the telemetry
// adapters: a tolerant parse on top of expfmt and a bounded HTTP scrape.
//
// expfmt stops at the first malformed line and discards the rest. Real
// exporters do emit malformed lines (Triton's documented histogram lines lack
// `_bucket`), and one bad family must not hide the gauges routing needs, so
// on error Parse falls back to parsing each sample line on its own and
// reports how many lines it had to skip.
//
// Fetch asks for the text format, and the exporters the adapters read answer
// with it: dcgm-exporter, Triton (prometheus-cpp) and TGI only ever write it,
// and vLLM, SGLang and trtllm-serve (Python's prometheus_client) write
// OpenMetrics only to an Accept header that names it. A server that ignores
// the header, or a proxy in front of one, may still answer OpenMetrics, so
// Parse reads that too: it is the text format plus exemplars and float
// timestamps after the value, # UNIT and # EOF lines, counters whose samples
// carry a _total suffix the family name lacks, and four more types.
package promtext

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families maps a metric name to its family.
type Families map[string]*dto.MetricFamily

// Parse parses a text exposition, or an OpenMetrics one (told by its closing
// "# EOF" line), which it first rewrites into the text format: exemplars,
// timestamps (which no adapter reads) and the UNIT, HELP and EOF lines are
// dropped, a counter's TYPE line names its _total samples, and families of
// the types the text format lacks (info, stateset, gaugehistogram, unknown)
// are read as untyped. On a clean parse err is nil. Otherwise err is
// expfmt's error and Parse re-parses line by line, keeping every sample line
// that parses alone (as an untyped sample), also once an OpenMetrics
// timestamp or exemplar after its value is dropped, and counting the others
// in skipped. Parse never panics.
func Parse(data []byte) (fams Families, skipped int, err error) {
	defer func() {
		if r := recover(); r != nil {
			fams, skipped, err = Families{}, 1, fmt.Errorf("exposition parser panicked: %v", r)
		}
	}()
	if isOpenMetrics(data) {
		data = fromOpenMetrics(data)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	all, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err == nil {
		return Families(all), 0, nil
	}
	first := err
	fams = Families{}
	// One parser, reader and line buffer for every line: a parser's
	// bufio.Reader alone is 4 KiB, and a fresh one per line made this pass
	// cost an order of magnitude more than a clean parse. The line is
	// copied, not appended to in place, so data is left as it was.
	var (
		rd  bytes.Reader
		buf []byte
	)
	for line := range bytes.Lines(data) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		buf = append(append(buf[:0], line...), '\n')
		rd.Reset(buf)
		one, err := p.TextToMetricFamilies(&rd)
		if err != nil {
			// An exemplar or a float timestamp (OpenMetrics in a body
			// without its # EOF) hides a readable value: retry without.
			n, ok := samplePrefix(line)
			if !ok || n == len(line) {
				skipped++
				continue
			}
			buf = append(append(buf[:0], line[:n]...), '\n')
			rd.Reset(buf)
			if one, err = p.TextToMetricFamilies(&rd); err != nil {
				skipped++
				continue
			}
		}
		for name, f := range one {
			if have, ok := fams[name]; ok {
				have.Metric = append(have.Metric, f.Metric...)
			} else {
				fams[name] = f
			}
		}
	}
	// skipped may be 0: every sample line parsed alone and the fault was in
	// the comments (a second TYPE line). Types were lost, values were not.
	return fams, skipped, first
}

// isOpenMetrics reports whether data's last line is OpenMetrics' "# EOF",
// which every OpenMetrics exposition ends with and no text one needs.
func isOpenMetrics(data []byte) bool {
	data = bytes.TrimRight(data, " \t\r\n")
	last := data[bytes.LastIndexByte(data, '\n')+1:]
	return string(bytes.TrimSpace(last)) == "# EOF"
}

// fromOpenMetrics rewrites an OpenMetrics exposition as a text one with the
// same samples (see Parse). A sample line it cannot read is kept as it is,
// for the line-by-line pass to count.
func fromOpenMetrics(data []byte) []byte {
	out := make([]byte, 0, len(data))
	for line := range bytes.Lines(data) {
		line = bytes.TrimSpace(line)
		switch {
		case len(line) == 0:
			continue
		case line[0] == '#':
			out = appendTypeLine(out, line)
			continue
		}
		if n, ok := samplePrefix(line); ok {
			line = line[:n]
		}
		out = append(append(out, line...), '\n')
	}
	return out
}

// appendTypeLine appends the text format's version of an OpenMetrics
// comment line: the TYPE line of a gauge, histogram or summary as it is, a
// counter's for its samples' name (OpenMetrics names the family foo and
// its samples foo_total), nothing for other types (their samples read as
// untyped) and other lines.
func appendTypeLine(out, line []byte) []byte {
	f := bytes.Fields(line)
	if len(f) != 4 || string(f[0]) != "#" || string(f[1]) != "TYPE" {
		return out
	}
	switch string(f[3]) {
	case "gauge", "histogram", "summary":
		out = append(out, line...)
	case "counter":
		if f[2][0] == '"' {
			return out // a quoted name: read the samples as untyped
		}
		out = append(append(append(out, "# TYPE "...), f[2]...), "_total counter"...)
	default:
		return out
	}
	return append(out, '\n')
}

// samplePrefix returns the length of line's leading name, labels and value,
// and whether what follows them is nothing or what OpenMetrics allows there:
// a timestamp, then an exemplar ("# {labels} value [timestamp]"). line has
// no surrounding space.
func samplePrefix(line []byte) (int, bool) {
	i := 0
	for i < len(line) && line[i] != '{' && !blank(line[i]) {
		i++
	}
	if i < len(line) && line[i] == '{' {
		var ok bool
		if i, ok = skipLabels(line, i); !ok {
			return 0, false
		}
	}
	i = skipBlanks(line, i)
	end := token(line, i)
	if end == i {
		return 0, false
	}
	i = skipBlanks(line, end)
	if i < len(line) && line[i] != '#' { // a timestamp
		if i = number(line, i); i < 0 {
			return 0, false
		}
	}
	if i == len(line) {
		return end, true
	}
	if line[i] != '#' {
		return 0, false
	}
	i = skipBlanks(line, i+1)
	if i == len(line) || line[i] != '{' {
		return 0, false
	}
	i, ok := skipLabels(line, i)
	if !ok {
		return 0, false
	}
	if i = number(line, skipBlanks(line, i)); i < 0 { // the exemplar's value
		return 0, false
	}
	if i < len(line) {
		if i = number(line, i); i < 0 { // its timestamp
			return 0, false
		}
	}
	return end, i == len(line)
}

// skipLabels returns the index after the label set that opens at line[i]
// ('{'), skipping braces inside quoted values, and false if it does not close.
func skipLabels(line []byte, i int) (int, bool) {
	quoted := false
	for i++; i < len(line); i++ {
		switch c := line[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i + 1, true
		}
	}
	return 0, false
}

// number parses the number token at line[i] and returns the index after the
// blanks that follow it, or -1 if there is no number.
func number(line []byte, i int) int {
	end := token(line, i)
	if end == i {
		return -1
	}
	if _, err := strconv.ParseFloat(string(line[i:end]), 64); err != nil {
		return -1
	}
	return skipBlanks(line, end)
}

func token(line []byte, i int) int {
	for i < len(line) && !blank(line[i]) {
		i++
	}
	return i
}

func skipBlanks(line []byte, i int) int {
	for i < len(line) && blank(line[i]) {
		i++
	}
	return i
}

func blank(c byte) bool { return c == ' ' || c == '\t' }

// Value returns m's value for a gauge, counter or untyped family, and false
// for other types or a non-finite value.
func Value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Label returns the value of m's label name, or "".
func Label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// DefaultMaxBytes bounds a scraped body: a vLLM or dcgm-exporter exposition
// is tens to hundreds of KiB, so 16 MiB means a misconfigured target, not a
// big one.
const DefaultMaxBytes = 16 << 20

// accept asks for the classic text format, the one Parse reads.
const accept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// Fetch GETs url with client (nil means http.DefaultClient) and returns the
// body, at most maxBytes of it (<= 0 means DefaultMaxBytes). A non-2xx
// status or a larger body is an error.
func Fetch(ctx context.Context, client *http.Client, url string, maxBytes int64) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("GET %s: status %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading body: %w", url, err)
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("GET %s: %w (limit %d bytes)", url, ErrTooLarge, maxBytes)
	}
	return body, nil
}

// ErrTooLarge reports a body over the limit.
var ErrTooLarge = errors.New("body too large")
