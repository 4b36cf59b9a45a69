// Package promtext reads Prometheus text expositions for the telemetry
// adapters: a tolerant parse on top of expfmt and a bounded HTTP scrape.
//
// expfmt stops at the first malformed line and discards the rest. Real
// exporters do emit malformed lines (Triton's documented histogram lines lack
// `_bucket`), and one bad family must not hide the gauges routing needs, so
// on error Parse falls back to parsing each sample line on its own and
// reports how many lines it had to skip.
package promtext

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families maps a metric name to its family.
type Families map[string]*dto.MetricFamily

// Parse parses a text exposition. On a clean parse err is nil. Otherwise err
// is expfmt's error and Parse re-parses line by line, keeping every sample
// line that parses alone (as an untyped sample) and counting the others in
// skipped. Parse never panics.
func Parse(data []byte) (fams Families, skipped int, err error) {
	defer func() {
		if r := recover(); r != nil {
			fams, skipped, err = Families{}, 1, fmt.Errorf("exposition parser panicked: %v", r)
		}
	}()
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
			skipped++
			continue
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
