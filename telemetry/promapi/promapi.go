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
// batches (vLLM's engine="N", SGLang's dp_rank) but not over the processes
// that export one batch (SGLang's tensor- and pipeline-parallel ranks, with
// tp_rank, pp_rank and moe_ep_rank labels: their largest counts once), and
// not over SGLang's per-priority breakdown of a total (priority="" is the
// total, and matches series without the label); usage takes the max over a
// server's series.
func DefaultQueries() map[telemetry.Field]string {
	return map[telemetry.Field]string{
		telemetry.Running:      `sum by (instance) (max without (tp_rank, pp_rank, moe_ep_rank) ({__name__=~"vllm:num_requests_running|sglang:num_running_reqs|trtllm_num_requests_running",priority=""}))`,
		telemetry.Waiting:      `sum by (instance) (max without (tp_rank, pp_rank, moe_ep_rank) ({__name__=~"vllm:num_requests_waiting|sglang:num_queue_reqs|trtllm_num_requests_waiting",priority=""}))`,
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

// apiResponse is the envelope of every /api/v1 answer.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	// Warnings come with a "success" whose result may be incomplete
	// (Thanos and Mimir partial responses, a remote read that failed).
	Warnings []string `json:"warnings"`
}

type vectorData struct {
	ResultType string `json:"resultType"`
	Result     []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"` // [unix seconds (number), value (string)]
	} `json:"result"`
}

// Collect runs the combined query and returns one observation per endpoint,
// stamped with Prometheus' evaluation time. Series without the endpoint
// label, with an unknown field, or with a value that is not a finite number
// in the field's range are skipped; if any were, the error wraps
// telemetry.ErrPartial. When one endpoint has several series for a field
// the largest value wins (the conservative reading).
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
	body, warnings, err := s.post(ctx, s.Query())
	if err != nil {
		return nil, err
	}
	var data vectorData
	if err := json.Unmarshal(body, &data); err != nil {
		return nil, fmt.Errorf("promapi: decoding query data: %w", err)
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("promapi: query returned a %q, want a vector (instant query of series)", data.ResultType)
	}
	label := s.EndpointLabel
	if label == "" {
		label = DefaultEndpointLabel
	}
	var obs []telemetry.Observation
	at := map[string]int{}
	skipped := 0
	var firstSkip string
	skip := func(format string, args ...any) {
		skipped++
		if firstSkip == "" {
			firstSkip = fmt.Sprintf(format, args...)
		}
	}
	for _, r := range data.Result {
		f, ok := telemetry.ParseField(r.Metric[fieldLabel])
		if !ok {
			skip("series %v has no known %s label", r.Metric, fieldLabel)
			continue
		}
		lv, ok := r.Metric[label]
		if !ok || lv == "" {
			skip("%s series has no %q label (keep it in the query's by clause)", f, label)
			continue
		}
		id := lv
		if s.EndpointID != nil {
			if id, ok = s.EndpointID(lv); !ok {
				continue // not ours: not an error
			}
		}
		ts, v, err := sampleValue(r.Value)
		if err != nil || !valid(f, v) {
			skip("%s for %s: value %v (%v)", f, lv, r.Value[1], err)
			continue
		}
		j, seen := at[id]
		if !seen {
			j = len(obs)
			at[id] = j
			obs = append(obs, telemetry.Observation{EndpointID: id, Sample: telemetry.Sample{Time: ts}})
		}
		smp := &obs[j].Sample
		if cur, had := smp.Get(f); !had || v > cur {
			smp.Set(f, v)
		}
		if ts.After(smp.Time) {
			smp.Time = ts
		}
	}
	switch {
	case skipped > 0:
		return obs, fmt.Errorf("%w: promapi: %d series skipped; first: %s", telemetry.ErrPartial, skipped, firstSkip)
	case len(warnings) > 0:
		// The answer may lack series: what came is good, the round is partial.
		return obs, fmt.Errorf("%w: promapi: Prometheus warned the result may be incomplete: %s", telemetry.ErrPartial, warnings[0])
	}
	return obs, nil
}

// post sends the query and returns the envelope's data and warnings.
func (s *Source) post(ctx context.Context, query string) (json.RawMessage, []string, error) {
	endpoint := strings.TrimSuffix(s.URL, "/") + "/api/v1/query"
	form := url.Values{"query": {query}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, nil, fmt.Errorf("promapi: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("promapi: query: %w", err)
	}
	defer resp.Body.Close()
	limit := s.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("promapi: reading response: %w", err)
	}
	if int64(len(raw)) > limit {
		return nil, nil, fmt.Errorf("promapi: response larger than %d bytes", limit)
	}
	var env apiResponse
	jerr := json.Unmarshal(raw, &env)
	switch {
	case jerr == nil && env.Status == "error":
		// Prometheus explains bad queries (400, 422) and overload (503) here.
		return nil, nil, fmt.Errorf("promapi: query failed (HTTP %d, %s): %s", resp.StatusCode, env.ErrorType, env.Error)
	case resp.StatusCode/100 != 2:
		return nil, nil, fmt.Errorf("promapi: query: HTTP %s", resp.Status)
	case jerr != nil:
		return nil, nil, fmt.Errorf("promapi: decoding response: %w", jerr)
	case env.Status != "success":
		return nil, nil, fmt.Errorf("promapi: response status %q, want \"success\"", env.Status)
	}
	return env.Data, env.Warnings, nil
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
