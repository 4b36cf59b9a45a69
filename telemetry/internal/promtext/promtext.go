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
// carry a _total suffix the family name lacks, and four more types. A body
// served as OpenMetrics that lacks its closing # EOF was cut short, and
// Fetch returns an error (ErrNoEOF) rather than part of an exposition.
//
// A sample may carry the time it was measured: a Prometheus federation
// endpoint or a caching sidecar serves what was scraped earlier, each
// sample with its scrape's time. Parse keeps it (in milliseconds, as the
// text format has it, whichever format it came in), and MeasuredAt says
// when an exposition's values were measured when every sample says so.
//
// Memory follows the body, not the series in it: a metric object costs tens
// of times its line, and a wrong URL (a kube-state-metrics, a federation
// endpoint) can answer with up to the body limit of series. ParseSelected
// builds objects only for the metrics an adapter reads, and for at most
// MaxSamples sample lines; the rest are dropped and counted.
package promtext

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families maps a metric name to its family.
type Families map[string]*dto.MetricFamily

// MaxSamples bounds the sample lines a parse builds metric objects for (each
// costs an adapter about 2 KiB). dcgm-exporter's gauges for a node of 8 GPUs
// split into 56 MIG instances, or a model server's load gauges per engine,
// rank and model, are a few hundred.
const MaxSamples = 1 << 13

// Parse is ParseSelected with every metric selected.
func Parse(data []byte) (fams Families, skipped int, err error) {
	return ParseSelected(data, nil)
}

// ParseSelected parses a text exposition, or an OpenMetrics one (told by its closing
// "# EOF" line), which it first rewrites into the text format: exemplars
// and the UNIT, HELP and EOF lines are dropped, timestamps (float seconds)
// become the text format's milliseconds, a counter's TYPE line names its
// _total samples, and families of
// the types the text format lacks (info, stateset, gaugehistogram, unknown)
// are read as untyped. On a clean parse err is nil. Otherwise err is
// expfmt's error and Parse re-parses line by line, keeping every sample line
// that parses alone (as an untyped sample), also once an OpenMetrics
// timestamp or exemplar after its value is dropped, and counting the others
// in skipped.
//
// Only the lines about metrics keep selects are parsed: samples by their
// metric name, HELP and TYPE lines by the name they describe (keep sees
// the name as written, without quotes; nil selects every metric). A line
// without a readable name is parsed, for the parser to count. Sample lines
// past MaxSamples are dropped, counted in skipped and reported in err.
// A text exposition's last line without a line feed (a body cut short, its
// value perhaps a prefix of the real one) is dropped, counted in skipped and
// reported in err, whatever metric it names. ParseSelected never panics.
func ParseSelected(data []byte, keep func(name []byte) bool) (fams Families, skipped int, err error) {
	defer func() {
		if r := recover(); r != nil {
			fams, skipped, err = Families{}, 1, fmt.Errorf("exposition parser panicked: %v", r)
		}
	}()
	var cut error
	if bytes.IndexByte(data, '\r') >= 0 {
		// CRLF line ends (an exporter on Windows, a proxy that rewrote
		// them): expfmt rejects the CR, and the line-by-line pass read
		// every value but reported the body as partial, every round.
		// A copy: data is the caller's.
		data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	}
	if isOpenMetrics(data) {
		data = fromOpenMetrics(data)
	} else if data, cut = dropUnterminated(data); cut != nil {
		skipped = 1
	}
	data, over := selectLines(data, keep)
	fams, n, err := parse(data)
	skipped += n
	for _, e := range []error{cut, overLimit(over)} {
		switch {
		case e == nil:
		case err == nil:
			err = e
		default:
			err = fmt.Errorf("%w; %w", err, e)
		}
	}
	return fams, skipped + over, err
}

func overLimit(over int) error {
	if over == 0 {
		return nil
	}
	return fmt.Errorf("%d sample lines past the first %d dropped", over, MaxSamples)
}

// dropUnterminated drops a text exposition's last line when no line feed
// ends it, and says so. The format ends every line with one, and a body cut
// short (a server that died writing a body without a length, whose end the
// client sees as a clean one) ends inside a line: its value may be a
// prefix of the real one, "12" of "128", so it is not read at all.
// Whitespace after the last line feed is no line.
func dropUnterminated(data []byte) ([]byte, error) {
	if len(bytes.TrimRight(data, " \t\r\n")) == 0 || data[len(data)-1] == '\n' {
		return data, nil
	}
	i := bytes.LastIndexByte(data, '\n') + 1
	if len(bytes.TrimSpace(data[i:])) == 0 {
		return data, nil
	}
	return data[:i], fmt.Errorf("last line %.64q has no line feed: the body may be cut short", data[i:])
}

func parse(data []byte) (fams Families, skipped int, err error) {
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

// The kinds of line selectLines tells apart.
const (
	otherLine   = iota // blank, or a comment other than HELP and TYPE
	metaLine           // HELP or TYPE
	sampleLine         // a sample
	unnamedLine        // a line that names no metric the way either of those does
)

// selectLines returns the lines of data keep selects (see ParseSelected),
// with at most MaxSamples sample (and unnamed) lines, and how many more it
// dropped. It returns data itself when it would keep every line.
func selectLines(data []byte, keep func(name []byte) bool) (out []byte, over int) {
	if keep == nil {
		n := 0
		for line := range bytes.Lines(data) {
			if _, kind := lineName(line); kind >= sampleLine {
				n++
			}
		}
		if n <= MaxSamples {
			return data, 0
		}
		keep = func([]byte) bool { return true }
	}
	samples := 0
	for line := range bytes.Lines(data) {
		name, kind := lineName(line)
		switch {
		case kind == otherLine, kind != unnamedLine && !keep(name):
			continue
		case kind == metaLine:
		case samples == MaxSamples:
			over++
			continue
		default:
			samples++
		}
		out = append(out, line...)
	}
	return out, over
}

// lineName returns the metric a line is about and what kind of line it is.
func lineName(line []byte) ([]byte, int) {
	i := skipBlanks(line, 0)
	if i == len(line) || line[i] == '\n' || line[i] == '\r' {
		return nil, otherLine
	}
	if line[i] == '#' {
		i = skipBlanks(line, i+1)
		end := token(line, i)
		if kw := string(line[i:end]); kw != "HELP" && kw != "TYPE" {
			return nil, otherLine
		}
		name, _ := metricName(line, skipBlanks(line, end))
		if len(name) == 0 {
			return nil, otherLine // the parser ignores it too
		}
		return name, metaLine
	}
	if line[i] == '{' { // {"name", label="value"}
		i = skipBlanks(line, i+1)
		if i == len(line) || line[i] != '"' {
			return nil, unnamedLine
		}
	}
	name, ok := metricName(line, i)
	if !ok || len(name) == 0 {
		return nil, unnamedLine
	}
	return name, sampleLine
}

// metricName returns the name at line[i]: a quoted one without its quotes,
// or a bare one up to a brace or a blank.
func metricName(line []byte, i int) ([]byte, bool) {
	if i < len(line) && line[i] == '"' {
		for j := i + 1; j < len(line); j++ {
			switch line[j] {
			case '\\':
				j++
			case '"':
				return line[i+1 : j], true
			}
		}
		return nil, false
	}
	j := i
	for j < len(line) && line[j] != '{' && !blank(line[j]) && line[j] != '\n' && line[j] != '\r' {
		j++
	}
	return line[i:j], true
}

// SampleValue returns the metric name of a sample line (as ParseSelected's
// keep sees it) and its value, with ok false when line is no sample line
// or its value does not parse (what follows the value, an OpenMetrics
// timestamp or exemplar, is allowed). Surrounding space is ignored.
func SampleValue(line []byte) (name []byte, v float64, ok bool) {
	line = bytes.TrimSpace(line)
	name, kind := lineName(line)
	if kind != sampleLine {
		return nil, 0, false
	}
	i, n, fits := sampleValue(line)
	if !fits {
		return name, 0, false
	}
	// The format's numbers are strconv's less Go's hexadecimal floats and
	// digit separators ("0x1p4", "1_0"), which the parser refuses, as
	// expfmt's own parseFloat does: read here, such a line's value was
	// one the parse then dropped.
	if bytes.ContainsAny(line[i:n], "pP_") {
		return name, 0, false
	}
	v, err := strconv.ParseFloat(string(line[i:n]), 64)
	return name, v, err == nil
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
			ts, hasTS := openMetricsTimestamp(line, n)
			line = line[:n]
			if hasTS {
				out = append(append(append(out, line...), ' '), ts...)
				out = append(out, '\n')
				continue
			}
		}
		out = append(append(out, line...), '\n')
	}
	return out
}

// openMetricsTimestamp returns the timestamp after the value that ends at
// line[n] (float seconds) as the text format writes one (integer
// milliseconds), and false when there is none or it does not fit.
func openMetricsTimestamp(line []byte, n int) ([]byte, bool) {
	i := skipBlanks(line, n)
	if i == len(line) || line[i] == '#' {
		return nil, false
	}
	sec, err := strconv.ParseFloat(string(line[i:token(line, i)]), 64)
	ms := math.Round(sec * 1e3)
	if err != nil || math.IsNaN(ms) || math.Abs(ms) >= 1<<62 {
		return nil, false
	}
	return strconv.AppendInt(nil, int64(ms), 10), true
}

// MeasuredAt returns when fams' values were measured, from their samples'
// own timestamps (a federation endpoint's, a caching sidecar's): the
// oldest, since a reading is as old as its oldest input. It returns false
// when some sample carries no timestamp, or there is none: such an
// exposition was measured when it was served.
func MeasuredAt(fams Families) (time.Time, bool) {
	oldest, n := int64(math.MaxInt64), 0
	for _, f := range fams {
		for _, m := range f.Metric {
			if m.TimestampMs == nil {
				return time.Time{}, false
			}
			oldest = min(oldest, m.GetTimestampMs())
			n++
		}
	}
	if n == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(oldest), true
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
	_, end, ok := sampleValue(line)
	return end, ok
}

// sampleValue is samplePrefix that also returns where the value starts:
// after the name and the label set, if any, and the blanks after them
// (line[start:end] is the value's token).
func sampleValue(line []byte) (start, end int, ok bool) {
	i := 0
	for i < len(line) && line[i] != '{' && !blank(line[i]) {
		i++
	}
	if j := skipBlanks(line, i); j < len(line) && line[j] == '{' { // the parser allows blanks before it
		if i, ok = skipLabels(line, j); !ok {
			return 0, 0, false
		}
	}
	start = skipBlanks(line, i)
	i = start
	end = token(line, i)
	if end == i {
		return 0, 0, false
	}
	i = skipBlanks(line, end)
	if i < len(line) && line[i] != '#' { // a timestamp
		if i = number(line, i); i < 0 {
			return 0, 0, false
		}
	}
	if i == len(line) {
		return start, end, true
	}
	if line[i] != '#' {
		return 0, 0, false
	}
	i = skipBlanks(line, i+1)
	if i == len(line) || line[i] != '{' {
		return 0, 0, false
	}
	if i, ok = skipLabels(line, i); !ok {
		return 0, 0, false
	}
	if i = number(line, skipBlanks(line, i)); i < 0 { // the exemplar's value
		return 0, 0, false
	}
	if i < len(line) {
		if i = number(line, i); i < 0 { // its timestamp
			return 0, 0, false
		}
	}
	return start, end, i == len(line)
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
	v, ok := raw(m)
	if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// RawValue returns m's value as exported, NaN and infinities included (0
// for a histogram or summary), to name a dropped value as it was.
func RawValue(m *dto.Metric) float64 {
	v, _ := raw(m)
	return v
}

func raw(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
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
// status or a larger body is an error. Errors name url without its
// password (see Redacted).
//
// So is a body served as OpenMetrics (Content-Type
// application/openmetrics-text) whose last line is not "# EOF" (ErrNoEOF):
// every OpenMetrics exposition ends with that line, so one without it was
// cut short (a connection closed mid-body with no length to betray it, a
// proxy's size limit), and it may have been cut at a line boundary, where
// no line is left unfinished to tell. Parsed, its samples would read as the
// whole: a vLLM exposition cut before its queue gauge reads as a server
// with nothing queued. A body served under any other type, or none, is
// returned as it is: the text format has no end marker, so a cut there
// cannot be told from a short exposition, and a server that answers
// OpenMetrics under text/plain still ends it with # EOF, which Parse reads.
func Fetch(ctx context.Context, client *http.Client, url string, maxBytes int64) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		// url.Parse's error quotes the URL as given, password and all.
		return nil, fmt.Errorf("GET %s: %w", Redacted(url), parseCause(err))
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
		return nil, fmt.Errorf("GET %s: status %s", Redacted(url), resp.Status)
	}
	// One byte past the limit tells a body at it from a larger one; at
	// math.MaxInt64 that byte would overflow the count to a negative one,
	// which reads nothing.
	body, err := io.ReadAll(io.LimitReader(resp.Body, min(maxBytes, math.MaxInt64-1)+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading body: %w", Redacted(url), err)
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("GET %s: %w (limit %d bytes)", Redacted(url), ErrTooLarge, maxBytes)
	}
	if ct := resp.Header.Get("Content-Type"); servedOpenMetrics(ct) && !isOpenMetrics(body) {
		return nil, fmt.Errorf("GET %s: %w (Content-Type %q, %d bytes)", Redacted(url), ErrNoEOF, ct, len(body))
	}
	if isMarkup(body) {
		var where string
		if final := resp.Request.URL.String(); final != req.URL.String() {
			where = ", redirected to " + Redacted(final)
		}
		return nil, fmt.Errorf("GET %s: %w (Content-Type %q%s)", Redacted(url), ErrMarkup, resp.Header.Get("Content-Type"), where)
	}
	return body, nil
}

// ErrMarkup reports a body that is a web page (HTML, XML), not an
// exposition: a login page behind a redirect, a proxy's or an ingress's
// own page, a URL missing its /metrics path. Parsed, it read as an
// exposition without a single metric, "cut short" when its last line had
// no line feed, which sent users looking for a truncated scrape.
var ErrMarkup = errors.New("served a web page (HTML or XML), not a metrics exposition: check the URL and any proxy, ingress or login in front of the server")

// isMarkup reports whether body starts, after white space, with "<": no
// exposition line does (one starts with a metric name or "#"), while every
// HTML and XML document does.
func isMarkup(body []byte) bool {
	b := bytes.TrimLeft(body, " \t\r\n\ufeff")
	return len(b) > 0 && b[0] == '<'
}

// ErrTooLarge reports a body over the limit.
var ErrTooLarge = errors.New("body too large")

// ErrNoEOF reports a body served as OpenMetrics that does not end with the
// "# EOF" line every OpenMetrics exposition ends with (see Fetch).
var ErrNoEOF = errors.New("OpenMetrics body has no closing # EOF line: it was cut short, and none of it is read")

// servedOpenMetrics reports whether contentType names OpenMetrics, in any
// version: each of them ends an exposition with # EOF.
func servedOpenMetrics(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		// A parameter mime rejects (a stray semicolon, a bare token)
		// leaves the type itself readable.
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt == "application/openmetrics-text"
}
