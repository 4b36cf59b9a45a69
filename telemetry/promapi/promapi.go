// Package promapi reads a whole fleet's load from a Prometheus server with
// one instant query per round, through its HTTP API (/api/v1/query).
//
// Scraping every model server from every client costs clients × servers
// requests per interval; asking the Prometheus server that already scrapes
// them costs one request per client, and every client sees the same numbers.
// The price is freshness: values are as old as Prometheus' last scrape.
//
// Each Sample field has a PromQL expression that returns one series per
// endpoint, named by a label (EndpointLabel, "instance" by default). Source
// joins them with `or`, tagging each with a synthetic label, so a round is a
// single request whatever the number of fields:
//
//	label_replace((<waiting expr>), "inferlb_field", "waiting", "", "") or
//	label_replace((<running expr>), "inferlb_field", "running", "", "") or ...
package promapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferlb/inferlb/telemetry"
)

// DefaultEndpointLabel is the label that names an endpoint: Prometheus sets
// "instance" to the scraped host:port, usually the address clients call.
const DefaultEndpointLabel = "instance"

// fieldLabel carries the field name through the combined query. It is not
// prefixed with "__" because PromQL drops such labels from results.
const fieldLabel = "inferlb_field"

// DefaultQueries read vLLM (both metric generations), SGLang and
// TensorRT-LLM (trtllm-serve) servers and dcgm-exporter GPUs scraped under
// the same instance label (they aggregate by instance, so with another
// EndpointLabel give Queries of your own that keep it), as
// modelserver.Parse reads one server: counts add up over a server's separate
// batches (vLLM's engine="N", SGLang's dp_rank) and over nothing else: not
// over the processes that export one batch (SGLang's tensor- and
// pipeline-parallel ranks, with tp_rank, pp_rank and moe_ep_rank labels:
// their largest counts once), not over SGLang's per-priority breakdown of a
// total (priority="" is the total, and matches series without the label),
// and not over copies of one series that differ in labels Prometheus added
// (two scrape jobs that select the same pods, such as a ServiceMonitor and
// a PodMonitor, or HA replicas read without deduplication): summed, those
// would double a server's count. Usage takes the max over a server's series.
func DefaultQueries() map[telemetry.Field]string {
	return map[telemetry.Field]string{
		telemetry.Running:      `sum by (instance) (max by (instance, engine, dp_rank) ({__name__=~"vllm:num_requests_running|sglang:num_running_reqs|trtllm_num_requests_running",priority=""}))`,
		telemetry.Waiting:      `sum by (instance) (max by (instance, engine, dp_rank) ({__name__=~"vllm:num_requests_waiting|sglang:num_queue_reqs|trtllm_num_requests_waiting",priority=""}))`,
		telemetry.KVCacheUsage: `max by (instance) ({__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|sglang:token_usage|trtllm_kv_cache_utilization"})`,
		telemetry.GPUUtil:      `max by (instance) (DCGM_FI_DEV_GPU_UTIL) / 100`,
	}
}

// DefaultMaxBodyBytes bounds a query response.
const DefaultMaxBodyBytes = 64 << 20

// Source queries a Prometheus server once per Collect. The zero value is not
// usable: URL is required. Fields must not change while Collect runs.
type Source struct {
	// URL is the server's base URL, e.g. http://prometheus:9090 (a path
	// prefix, as behind a proxy, is kept).
	URL string
	// Queries maps each field to a PromQL expression returning one series
	// per endpoint with EndpointLabel set. nil means DefaultQueries. Values
	// use the field's unit (see telemetry.Field): fractions in 0..1, bytes.
	Queries map[telemetry.Field]string
	// EndpointLabel names the endpoint in results; "" means "instance".
	// DefaultQueries keep only "instance": another label needs Queries that
	// aggregate by it.
	EndpointLabel string
	// EndpointID translates a label value into an endpoint ID and may
	// reject it (ok false) to skip series of servers the caller does not
	// route to. nil uses the label value as the ID.
	EndpointID func(labelValue string) (id string, ok bool)
	// Client does the requests; nil means http.DefaultClient. Collect's
	// context bounds each round.
	Client *http.Client
	// MaxBodyBytes bounds the response; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
}

var _ telemetry.Source = (*Source)(nil)

// Query returns the combined PromQL expression Collect sends, for logging
// or for trying it in Prometheus' UI. Fields are in Field order.
func (s *Source) Query() string {
	qs := s.Queries
	if qs == nil {
		qs = DefaultQueries()
	}
	fields := make([]telemetry.Field, 0, len(qs))
	for f := range qs {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteString(" or ")
		}
		fmt.Fprintf(&b, "label_replace((%s), %q, %q, \"\", \"\")", qs[f], fieldLabel, f.String())
	}
	return b.String()
}

// Collect runs the combined query and returns one observation per endpoint,
// stamped with Prometheus' evaluation time. Series without the endpoint
// label, with an unknown field, with a value that is not a finite number
// in the field's range, of the wrong shape, or of endpoints past the first
// MaxEndpoints are skipped; if any were, the error wraps
// telemetry.ErrPartial. When one endpoint has several series for a field
// the largest value wins (the conservative reading). The answer is read
// series by series, never held whole, so its cost follows the observations
// kept rather than the series sent.
func (s *Source) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	if s.URL == "" {
		return nil, errors.New("promapi: Source.URL is empty")
	}
	if len(s.Queries) == 0 && s.Queries != nil {
		return nil, errors.New("promapi: Source.Queries is empty")
	}
	for f, q := range s.Queries {
		if int(f) >= telemetry.NumFields {
			return nil, fmt.Errorf("promapi: Source.Queries has %v, which is not a telemetry field", f)
		}
		if strings.TrimSpace(q) == "" {
			return nil, fmt.Errorf("promapi: Source.Queries[%v] is empty", f)
		}
	}
	label := s.EndpointLabel
	if label == "" {
		label = DefaultEndpointLabel
	}
	c := collector{src: s, label: label, at: map[string]int{}}
	warnings, err := s.query(ctx, s.Query(), &c)
	if err != nil {
		return nil, err
	}
	switch {
	case c.skipped > 0:
		return c.obs, fmt.Errorf("%w: promapi: %d series skipped; first: %s", telemetry.ErrPartial, c.skipped, c.firstSkip)
	case len(warnings) > 0:
		// The answer may lack series: what came is good, the round is partial.
		return c.obs, fmt.Errorf("%w: promapi: Prometheus warned the result may be incomplete: %s", telemetry.ErrPartial, warnings[0])
	}
	return c.obs, nil
}

// MaxEndpoints bounds the endpoints one answer yields observations for: a
// Store tracks no more by default (telemetry.DefaultMaxEndpoints). Series
// of further endpoints are skipped and counted.
const MaxEndpoints = telemetry.DefaultMaxEndpoints

// collector folds an answer's series into observations one at a time, as
// they are decoded: an answer is never held whole, so what it costs follows
// the observations kept, not the series sent.
type collector struct {
	src       *Source
	label     string
	obs       []telemetry.Observation
	at        map[string]int // endpoint ID -> index in obs
	skipped   int
	firstSkip string
}

// skip counts a skipped series and reports whether it is the first, which
// the caller then describes in firstSkip (formatting every one would cost
// more than the series).
func (c *collector) skip() bool {
	c.skipped++
	return c.skipped == 1
}

// add folds one series: when one endpoint has several series for a field
// the largest value wins.
func (c *collector) add(metric map[string]string, value [2]any) {
	f, ok := telemetry.ParseField(metric[fieldLabel])
	if !ok {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("series %v has no known %s label", metric, fieldLabel)
		}
		return
	}
	lv, ok := metric[c.label]
	if !ok || lv == "" {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("%s series has no %q label (keep it in the query's by clause)", f, c.label)
		}
		return
	}
	id := lv
	if c.src.EndpointID != nil {
		if id, ok = c.src.EndpointID(lv); !ok {
			return // not ours: not an error
		}
	}
	ts, v, err := sampleValue(value)
	if err != nil || !valid(f, v) {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("%s for %s: value %v (%v)", f, lv, value[1], err)
		}
		return
	}
	j, seen := c.at[id]
	if !seen {
		if len(c.obs) == MaxEndpoints {
			if c.skip() {
				c.firstSkip = fmt.Sprintf("%s for %s: more than %d endpoints in one answer", f, lv, MaxEndpoints)
			}
			return
		}
		if len(c.obs) == cap(c.obs) {
			// Doubled, not append's quarter at a time past a few
			// hundred: the copies of a big fleet's observations would
			// cost five times the last one.
			grown := make([]telemetry.Observation, len(c.obs), min(max(2*cap(c.obs), 64), MaxEndpoints))
			copy(grown, c.obs)
			c.obs = grown
		}
		j = len(c.obs)
		c.at[id] = j
		c.obs = append(c.obs, telemetry.Observation{EndpointID: id, Sample: telemetry.Sample{Time: ts}})
	}
	smp := &c.obs[j].Sample
	if cur, had := smp.Get(f); !had || v > cur {
		smp.Set(f, v)
	}
	if ts.After(smp.Time) {
		smp.Time = ts
	}
}

// query sends the query and folds the answer's series into c; it returns
// the answer's warnings.
func (s *Source) query(ctx context.Context, query string, c *collector) ([]string, error) {
	endpoint := strings.TrimSuffix(s.URL, "/") + "/api/v1/query"
	form := url.Values{"query": {query}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, fmt.Errorf("promapi: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("promapi: query: %w", err)
	}
	defer resp.Body.Close()
	limit := s.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	body := &io.LimitedReader{R: resp.Body, N: limit + 1}
	env, derr := c.decode(json.NewDecoder(body))
	// Drain a little so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 4096))
	var inData *dataError
	switch {
	case body.N <= 0:
		return nil, fmt.Errorf("promapi: response larger than %d bytes", limit)
	case derr == nil && env.status == "error":
		// Prometheus explains bad queries (400, 422) and overload (503) here.
		return nil, fmt.Errorf("promapi: query failed (HTTP %d, %s): %s", resp.StatusCode, env.errorType, env.errMsg)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("promapi: query: HTTP %s", resp.Status)
	case derr != nil && errors.As(derr, &inData) && !malformed(derr):
		return nil, fmt.Errorf("promapi: decoding query data: %w", inData.err)
	case derr != nil:
		return nil, fmt.Errorf("promapi: decoding response: %w", derr)
	case env.status != "success":
		return nil, fmt.Errorf("promapi: response status %q, want \"success\"", env.status)
	case !env.data:
		return nil, errors.New("promapi: decoding query data: the answer has no data")
	case env.resultType != "vector":
		return nil, fmt.Errorf("promapi: query returned a %q, want a vector (instant query of series)", env.resultType)
	}
	return env.warnings, nil
}

// envelope is what an /api/v1 answer says besides its series.
type envelope struct {
	status, errorType, errMsg string
	// warnings come with a "success" whose result may be incomplete
	// (Thanos and Mimir partial responses, a remote read that failed).
	warnings   []string
	data       bool // the answer has a data object
	resultType string
}

// dataError marks an answer whose data object is not a result of series.
type dataError struct{ err error }

func (e *dataError) Error() string { return e.err.Error() }
func (e *dataError) Unwrap() error { return e.err }

// malformed reports whether err says the answer is not JSON (or is cut short).
func malformed(err error) bool {
	var syntax *json.SyntaxError
	return errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// decode reads an answer, folding the series of its data into c as they come.
func (c *collector) decode(dec *json.Decoder) (env envelope, err error) {
	if err := delim(dec, '{'); err != nil {
		return env, err
	}
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return env, err
		}
		switch key {
		case "status":
			err = dec.Decode(&env.status)
		case "errorType":
			err = dec.Decode(&env.errorType)
		case "error":
			err = dec.Decode(&env.errMsg)
		case "warnings":
			err = dec.Decode(&env.warnings)
		case "data":
			if err = c.decodeData(dec, &env); err != nil {
				err = &dataError{err}
			}
		default:
			err = dec.Decode(new(json.RawMessage))
		}
		if err != nil {
			return env, err
		}
	}
	return env, delim(dec, '}')
}

// decodeData reads the answer's data: null (an error's, at times) or an
// object holding the result.
func (c *collector) decodeData(dec *json.Decoder, env *envelope) error {
	t, err := dec.Token()
	switch {
	case err != nil:
		return err
	case t == nil:
		return nil // null: no data
	case t != json.Delim('{'):
		return fmt.Errorf("got %v where { belongs", t)
	}
	env.data = true
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return err
		}
		switch key {
		case "resultType":
			err = dec.Decode(&env.resultType)
		case "result":
			err = c.decodeResult(dec)
		default:
			err = dec.Decode(new(json.RawMessage))
		}
		if err != nil {
			return err
		}
	}
	return delim(dec, '}')
}

// decodeResult folds a result's series into c, one at a time. A series of
// the wrong shape (a label value that is not a string) is skipped and
// counted; the decoder has read past it.
func (c *collector) decodeResult(dec *json.Decoder) error {
	if err := delim(dec, '['); err != nil {
		return err
	}
	var r struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"` // [unix seconds (number), value (string)]
	}
	for dec.More() {
		if r.Metric == nil {
			r.Metric = map[string]string{}
		}
		clear(r.Metric)
		r.Value = [2]any{}
		err := dec.Decode(&r)
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			if c.skip() {
				c.firstSkip = fmt.Sprintf("series of the wrong shape: %v", err)
			}
			continue
		case err != nil:
			return err
		}
		c.add(r.Metric, r.Value)
	}
	return delim(dec, ']')
}

func objectKey(dec *json.Decoder) (string, error) {
	t, err := dec.Token()
	if err != nil {
		return "", err
	}
	k, ok := t.(string)
	if !ok {
		return "", fmt.Errorf("object key %v is not a string", t)
	}
	return k, nil
}

// delim reads the next token and checks that it is d.
func delim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("got %v where %v belongs", t, d)
	}
	return nil
}

// sampleValue decodes Prometheus' [seconds, "value"] pair.
func sampleValue(p [2]any) (time.Time, float64, error) {
	sec, ok := p[0].(float64)
	if !ok || math.IsNaN(sec) || math.IsInf(sec, 0) {
		return time.Time{}, 0, fmt.Errorf("timestamp %v is not a number", p[0])
	}
	str, ok := p[1].(string)
	if !ok {
		return time.Time{}, 0, fmt.Errorf("value %v is not a string", p[1])
	}
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return time.Time{}, 0, err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return time.Time{}, 0, errors.New("not finite")
	}
	whole, frac := math.Modf(sec)
	return time.Unix(int64(whole), int64(math.Round(frac*1e9))), v, nil
}

// valid reports whether v is in f's range.
func valid(f telemetry.Field, v float64) bool {
	switch f {
	case telemetry.GPUTemp:
		return true
	case telemetry.KVCacheUsage, telemetry.PrefixCacheHitRate, telemetry.GPUUtil:
		return v >= 0 && v <= 1
	}
	return v >= 0
}
