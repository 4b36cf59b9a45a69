// Package promapi reads a whole fleet's load from a Prometheus server with
// one instant query per round, through its HTTP API (/api/v1/query).
//
// Scraping every model server from every client costs clients × servers
// requests per interval; asking the Prometheus server that already scrapes
// them costs one request per client, and every client sees the same numbers.
// The price is freshness: values are as old as Prometheus' last scrape, so
// each field is stamped with when that scrape took it (Timestamps: the
// timestamp() of its raw series), not with when the query ran. A Source
// polled more often than Prometheus scrapes then presents one scrape as one
// reading, however often it reads it: the balancer, which counts the calls
// it sent an endpoint since a reading's time, keeps counting them, and a
// reading past a Store's maximum age is stale, not made fresh by a query.
// For the same reason, poll it with PollerOptions.MinInterval negative: a
// round run early after the balancer dropped an endpoint's readings (a
// reconnect) returns the scrape Prometheus took before the drop, which the
// Store refuses.
//
// Each Sample field has a PromQL expression that returns one series per
// endpoint, named by a label (EndpointLabel, "instance" by default). Source
// joins them with `or`, tagging each with a synthetic label, so a round is a
// single request whatever the number of fields:
//
//	label_replace((<running expr>), "inferlb_field", "running", "", "") or
//	label_replace((<waiting expr>), "inferlb_field", "waiting", "", "") or ...
//	label_replace((<running time expr>), "inferlb_time", "running", "", "") or ...
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
// TensorRT-LLM (trtllm-serve) servers, and the dcgm-exporter GPUs they use
// (see GPUs below); they aggregate by instance, so with another
// EndpointLabel give Queries of your own that keep it. They read the
// servers as modelserver.Parse reads one server: counts add up over a
// server's separate batches (vLLM's engine="N", SGLang's dp_rank) and over
// nothing else: not
// over the processes that export one batch (SGLang's tensor- and
// pipeline-parallel ranks, with tp_rank, pp_rank and moe_ep_rank labels:
// their largest counts once), not over SGLang's per-priority breakdown of a
// total (priority="" is the total, and matches series without the label),
// and not over copies of one series that differ in labels Prometheus added
// (two scrape jobs that select the same pods, such as a ServiceMonitor and
// a PodMonitor, or HA replicas read without deduplication): summed, those
// would double a server's count. Waiting is, as there, the waiting queue
// plus the queues of prefill/decode disaggregation ahead of it (SGLang's
// bootstrap, prealloc and transfer queues), each a count of its own. Usage
// takes the max over a server's series.
//
// LoRASlots reads vLLM's vllm:lora_requests_info (servers started with
// --enable-lora), whose labels are its state: the query keeps, per
// instance, the label set with the latest value (the time vLLM set it)
// and adds the server's model_name (its base model) from its running
// count; see Queries for the labels a query of that field must return.
// A server of several data-parallel engines has none (its one gauge holds
// the engine that logged last), as modelserver.Parse reads it.
//
// Asleep reads vLLM's vllm:engine_sleep_state (servers started with
// --enable-sleep-mode): 1 - its sleep_state="awake" series, the least
// over a server's data-parallel engines, so a server is asleep only when
// every engine is (as modelserver.Parse reads it: vLLM sleeps and wakes
// them together). Servers without the metric get no Asleep.
//
// GPUs: dcgm-exporter runs once per node and exports every GPU of it, so
// its series' instance is the exporter's address (node or pod IP, port
// 9400), never a model server's, and a node's GPUs serve several servers.
// Its series name the GPU (gpu, UUID, pci_bus_id, device, modelName, the
// node in Hostname or hostname), and with Kubernetes pod mapping
// (--kubernetes, DCGM_EXPORTER_KUBERNETES=true; the GPU Operator's default)
// the pod it is allocated to: pod, namespace and container. GPUUtil joins
// a GPU to a server through that pod (a MIG instance's utilization is
// its DCGM_FI_PROF_GR_ENGINE_ACTIVE, as package dcgm reads it: MIG
// instances have no GPU_UTIL): it is the busiest GPU of the pod
// whose running-count series (vLLM's, SGLang's or trtllm-serve's) carry
// the same namespace and pod labels, as the Prometheus Operator's
// ServiceMonitor and PodMonitor add to a target's series (with
// kubernetes_sd_configs, relabel __meta_kubernetes_namespace and
// __meta_kubernetes_pod_name to namespace and pod). Where Prometheus renamed
// the exporter's pod and namespace to exported_pod and exported_namespace
// (a scrape without honor_labels, whose own pod and namespace are the
// exporter's), those are read. So you must run dcgm-exporter with pod
// mapping and scrape the model servers with namespace and pod labels. The
// other join it makes is by instance, for a scrape config that relabels
// an exporter's instance to its one server's. A GPU that neither joins to
// a model server (no pod mapping, a GPU of another workload, servers
// scraped without pod labels, or no relabeling) is left out: no endpoint
// gets a GPU reading rather than one of another endpoint's GPUs, or of a
// whole node. Outside Kubernetes, give GPU queries of your own, or read
// the exporters with package dcgm (ByHost, ByPod or your own Mapping).
//
// GPUMemUsed and GPUMemTotal join the same way and read what package dcgm
// reads: of a server's GPUs, the one with the highest memory pressure
// (both fields from that one GPU, so their ratio is its pressure), its
// total being DCGM_FI_DEV_FB_USED + FB_FREE + FB_RESERVED (0 where an
// older exporter lacks it) and its used memory total - FB_FREE, in bytes.
func DefaultQueries() map[telemetry.Field]string {
	return map[telemetry.Field]string{
		telemetry.Running:      `sum by (instance) (max by (instance, engine, dp_rank) (` + runningSeries + `))`,
		telemetry.Waiting:      `sum by (instance) (max by (instance, __name__, engine, dp_rank) (` + waitingSeries + `))`,
		telemetry.KVCacheUsage: `max by (instance) (` + kvSeries + `)`,
		telemetry.GPUUtil:      `max by (instance) (` + serverGPUs(`max by (namespace, pod) (`+gpuPods(gpuUtilSeries)+`)`, gpuUtilSeries) + `) / 100`,
		telemetry.GPUMemUsed:   worstGPUMem(gpuUsedMiB),
		telemetry.GPUMemTotal:  worstGPUMem(gpuTotalMiB),
		telemetry.LoRASlots:    loraQuery,
		telemetry.Asleep:       `min by (instance) (1 - max by (instance, engine) (` + sleepSeries + `))`,
	}
}

// GPU memory per GPU, in MiB as dcgm-exporter gives it (see package dcgm):
// there is no total-memory metric, so the total is used + free + reserved
// (reserved counts as 0 when an older exporter does not export it), and
// used is what a new allocation cannot have, total - free.
const (
	gpuTotalMiB = `(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + (DCGM_FI_DEV_FB_RESERVED or 0 * DCGM_FI_DEV_FB_USED))`
	gpuUsedMiB  = `(` + gpuTotalMiB + ` - DCGM_FI_DEV_FB_FREE)`
	gpuMemPress = `(` + gpuUsedMiB + ` / ` + gpuTotalMiB + `)`
)

// worstGPUMem returns, in bytes, mib (one series per GPU) of the GPU with
// the highest memory pressure of each model server, joined as serverGPUs
// joins: the worst GPU of each pod (or of each instance, for an exporter
// relabelled to its one server) is chosen before the join, so GPUMemUsed
// and GPUMemTotal, each read with it, come from the same GPU.
func worstGPUMem(mib string) string {
	byPod := `max by (namespace, pod) (` + gpuPods(mib) + ` and topk by (namespace, pod) (1, ` + gpuPods(gpuMemPress) + `))`
	byInstance := `(` + mib + ` and topk by (instance) (1, ` + gpuMemPress + `))`
	return `max by (instance) (` + serverGPUs(byPod, byInstance) + `) * 1048576`
}

// loraQuery is DefaultQueries' LoRASlots: the latest label set of each
// instance's vllm:lora_requests_info, valued at its time, with the
// model_name of the instance's running count added (0 times it, so the
// value stays the time; one per instance, or group_left would fail the
// whole query). An instance of several data-parallel engines (its running
// count has more than one engine label) has none: the gauge, without an
// engine label, holds whichever engine logged last (see modelserver's
// loraInfo).
const loraQuery = `(topk by (instance) (1, max by (instance, max_lora, running_lora_adapters, waiting_lora_adapters) (` + loraSeries + `))` +
	` + on (instance) group_left (model_name) (0 * topk by (instance) (1, max by (instance, model_name) (vllm:num_requests_running))))` +
	` unless on (instance) (count by (instance) (count by (instance, engine) (vllm:num_requests_running)) > 1)`

// The raw series DefaultQueries read, one selector per field, which
// DefaultTimestamps reads the scrape times of: the metrics' names, and the
// matchers their selectors add.
const (
	runningNames = `vllm:num_requests_running|sglang:num_running_reqs|trtllm_num_requests_running`
	waitingNames = `vllm:num_requests_waiting|sglang:num_queue_reqs|` + sglangPDQueues + `|trtllm_num_requests_waiting`
	kvNames      = `vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|sglang:token_usage|trtllm_kv_cache_utilization`
	gpuUtilNames = `DCGM_FI_DEV_GPU_UTIL`
	loraNames    = `vllm:lora_requests_info`
	sleepNames   = `vllm:engine_sleep_state`
	sleepAwake   = `,sleep_state="awake"` // 1 awake, 0 asleep
	totals       = `,priority=""`         // SGLang's totals, not its per-priority breakdown

	runningSeries = `{__name__=~"` + runningNames + `"` + totals + `}`
	waitingSeries = `{__name__=~"` + waitingNames + `"` + totals + `}`
	kvSeries      = `{__name__=~"` + kvNames + `"}`
	gpuUtilSeries = `(` + gpuUtilNames + ` or 100 * ` + gpuEngineActive + `)`
	gpuUtilTimes  = `(timestamp(` + gpuUtilNames + `) or timestamp(` + gpuEngineActive + `))`
	loraSeries    = loraNames
	sleepSeries   = sleepNames + `{sleep_state="awake"}`
)

// gpuEngineActive stands for GPU_UTIL where a GPU has none: MIG instances
// have no GPU_UTIL, and their graphics-engine activity (a 0..1 ratio, in
// dcgm-exporter's default counters) is what package dcgm reads for them.
// Where a GPU has both, GPU_UTIL's series (labels equal but for the name)
// wins the `or` in gpuUtilSeries and gpuUtilTimes.
const gpuEngineActive = `DCGM_FI_PROF_GR_ENGINE_ACTIVE`

// gpuPods returns dcgm-exporter's series of sel with the pod a GPU is
// allocated to in pod and namespace: exported_pod and exported_namespace,
// where Prometheus moved the exporter's own labels when its target's pod
// and namespace (the exporter's) clashed with them, replace those.
func gpuPods(sel string) string {
	return `label_replace(label_replace(` + sel + `, "pod", "$1", "exported_pod", "(.+)"), "namespace", "$1", "exported_namespace", "(.+)")`
}

// serverGPUs returns the GPU series of the model servers, with their
// instance: byPod (one series per namespace and pod) joined to the servers'
// series of that pod, or else gpus whose instance is a server's (an
// exporter relabelled to its one server). A GPU that joins to no server is
// left out. The servers' series are counted, not read, so a value they
// have (NaN) does not spoil the GPU's.
func serverGPUs(byPod, gpus string) string {
	return `(` + byPod + ` + on (namespace, pod) group_right () (0 * count by (namespace, pod, instance) ({__name__=~"` + runningNames + `",pod!=""})))` +
		` or (` + gpus + ` and on (instance) {__name__=~"` + runningNames + `"})`
}

// sglangPDQueues are the queues a prefill/decode-disaggregated SGLang
// server holds requests in ahead of its waiting queue, which count as
// waiting (see modelserver.Parse), the bootstrap queue under its older
// name too (no release exports both). Each is a count of its own: the
// Waiting query groups by metric name before it sums.
const sglangPDQueues = `sglang:num_prefill_bootstrap_queue_reqs|sglang:num_prefill_prealloc_queue_reqs|sglang:num_decode_prealloc_queue_reqs|sglang:num_decode_transfer_queue_reqs`

// DefaultTimestamps say, for each field of DefaultQueries, when Prometheus
// scraped the values it read: the time of the oldest sample among the raw
// series the field's query reads, per instance. PromQL's timestamp() of a
// selector is the time of each series' latest sample, its scrape's start;
// of anything computed (an aggregation, a division) it would be the
// evaluation time, hence timestamp() first and the aggregation around it.
//
// The oldest, because a value is as old as its oldest input: a count summed
// over series that two scrapes took is no newer than the first of them.
// Read as older than it is, a reading has a few calls too many added to it
// (all those sent since its time) and expires a little early; read as newer,
// it would lose calls and outlive its age.
func DefaultTimestamps() map[telemetry.Field]string {
	return map[telemetry.Field]string{
		telemetry.Running:      scrapeTimes(runningNames, totals),
		telemetry.Waiting:      scrapeTimes(waitingNames, totals),
		telemetry.KVCacheUsage: scrapeTimes(kvNames, ""),
		telemetry.GPUUtil:      `min by (instance) (` + serverGPUs(`min by (namespace, pod) (`+gpuPods(gpuUtilTimes)+`)`, gpuUtilTimes) + `)`,
		telemetry.GPUMemUsed:   gpuMemTimes,
		telemetry.GPUMemTotal:  gpuMemTimes,
		telemetry.LoRASlots:    scrapeTimes(loraNames, ""),
		telemetry.Asleep:       scrapeTimes(sleepNames, sleepAwake),
	}
}

// gpuMemTimes is DefaultTimestamps' GPUMemUsed and GPUMemTotal: the
// scrape time of the GPUs' memory series, joined as their values are.
// FB_FREE, which both fields read, stands for the three: an exporter's
// series are of one scrape.
var gpuMemTimes = `min by (instance) (` + serverGPUs(`min by (namespace, pod) (`+gpuPods(`timestamp(DCGM_FI_DEV_FB_FREE)`)+`)`, `timestamp(DCGM_FI_DEV_FB_FREE)`) + `)`

// scrapeTimes returns the oldest scrape time, per instance, of the series of
// names ('|'-separated) with matchers added. Each name has a timestamp() of
// its own: timestamp() drops the metric name, and series of two names with
// the same labels (vLLM 0.9 to 0.10 export kv_cache_usage_perc and
// gpu_cache_usage_perc side by side) would be equal once it had, which
// PromQL rejects, failing the whole query and every field of the fleet
// with it. The `or` of the names' times keeps the first of equal ones:
// they are of one scrape.
func scrapeTimes(names, matchers string) string {
	var b strings.Builder
	b.WriteString("min by (instance) (")
	for i, n := range strings.Split(names, "|") {
		if i > 0 {
			b.WriteString(" or ")
		}
		b.WriteString(`timestamp({__name__="` + n + `"` + matchers + `})`)
	}
	b.WriteString(")")
	return b.String()
}

// DefaultMaxBodyBytes bounds a query response.
const DefaultMaxBodyBytes = 64 << 20

// Source queries a Prometheus server once per Collect. The zero value is not
// usable: URL is required. Fields must not change while Collect runs.
type Source struct {
	// URL is the server's base URL, e.g. http://prometheus:9090 (a path
	// prefix, as behind a proxy, is kept, and so is a query, such as a
	// Thanos querier's ?dedup=true: the API's path goes before it).
	URL string
	// Queries maps each field to a PromQL expression returning one series
	// per endpoint with EndpointLabel set. nil means DefaultQueries. Values
	// use the field's unit (see telemetry.Field): fractions in 0..1, bytes.
	// A LoRASlots query is read from its labels, as vLLM exports its LoRA
	// state: max_lora (the slots), running_lora_adapters and
	// waiting_lora_adapters (comma-separated adapter names) and model_name
	// (the base model, required: without it a call for the base model looks
	// like one for an adapter); its value orders an endpoint's series, the
	// largest (latest) read. A KVCachePreallocated query returns 1 for
	// each server that reserves its KV cache at start but reports no
	// usage of it, such as TGI: `group by (instance) (tgi_queue_size)`
	// (see telemetry.KVCachePreallocated); DefaultQueries read no TGI,
	// Triton, TEI or llama.cpp server (package modelserver does), and join
	// GPUs to none of them.
	Queries map[telemetry.Field]string
	// Timestamps maps a field to a PromQL expression returning, per
	// endpoint (EndpointLabel set, as in Queries), when the values its
	// query reads were measured, in Unix seconds: typically the oldest
	// timestamp() of the raw series the query aggregates, as in
	// DefaultTimestamps. A field is stamped with that time (never later than
	// the evaluation time); a field without an expression here, or an
	// endpoint the expression returns nothing for, is stamped with the
	// evaluation time, which makes a value up to a scrape interval old look
	// fresh. Every key must be a field of the queries in use.
	//
	// nil means DefaultTimestamps when Queries is nil too, and none when
	// Queries is set (add DefaultTimestamps' entries, or your own, to stamp
	// your queries' fields); an empty map means none.
	Timestamps map[telemetry.Field]string
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

var _ telemetry.Validator = (*Source)(nil)

var _ telemetry.Source = (*Source)(nil)

// Query returns the combined PromQL expression Collect sends, for logging
// or for trying it in Prometheus' UI: the fields' queries in Field order,
// then their timestamp expressions (see Timestamps), each tagged with a
// label of its own, "inferlb_time", so one request carries both.
func (s *Source) Query() string {
	qs, ts := s.queries()
	var b strings.Builder
	for i, f := range sortedFields(qs) {
		if i > 0 {
			b.WriteString(" or ")
		}
		fmt.Fprintf(&b, "label_replace((%s), %q, %q, \"\", \"\")", qs[f], fieldLabel, f.String())
	}
	for _, f := range sortedFields(ts) {
		fmt.Fprintf(&b, " or label_replace((%s), %q, %q, \"\", \"\")", ts[f], timeLabel, f.String())
	}
	return b.String()
}

// timeLabel tags a timestamp expression's series with the field it stamps.
const timeLabel = "inferlb_time"

// queries returns the queries and timestamp expressions in use (see
// Queries and Timestamps).
func (s *Source) queries() (qs, ts map[telemetry.Field]string) {
	qs, ts = s.Queries, s.Timestamps
	if qs == nil {
		qs = DefaultQueries()
		if ts == nil {
			ts = DefaultTimestamps()
		}
	}
	return qs, ts
}

func sortedFields(m map[telemetry.Field]string) []telemetry.Field {
	fields := make([]telemetry.Field, 0, len(m))
	for f := range m {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	return fields
}

// Validate checks the configuration before any request (telemetry.Validator):
// NewPoller calls it, and so does every Collect.
func (s *Source) Validate() error {
	if s.URL == "" {
		return errors.New("promapi: Source.URL is empty")
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		// Not err itself: url.Parse's error quotes the URL, password and all,
		// and it would reach OnError's log at every round.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return fmt.Errorf("promapi: Source.URL is not a URL: %w", err)
	}
	if !strings.EqualFold(u.Scheme, "http") && !strings.EqualFold(u.Scheme, "https") || u.Host == "" {
		// "prometheus:9090" parses (scheme "prometheus"), and every round
		// would fail with "unsupported protocol scheme".
		return fmt.Errorf("promapi: Source.URL %q is not an http or https URL with a host", u.Redacted())
	}
	if s.MaxBodyBytes < 0 {
		return fmt.Errorf("promapi: Source.MaxBodyBytes is %d, want >= 0 (0 for the default)", s.MaxBodyBytes)
	}
	if len(s.Queries) == 0 && s.Queries != nil {
		return errors.New("promapi: Source.Queries is empty")
	}
	if s.Queries == nil && s.EndpointLabel != "" && s.EndpointLabel != DefaultEndpointLabel {
		// Every series would lack the label and be skipped, every round.
		return fmt.Errorf("promapi: Source.EndpointLabel is %q, but DefaultQueries (Queries nil) aggregate by %q and keep no other label: give Queries that keep %q", s.EndpointLabel, DefaultEndpointLabel, s.EndpointLabel)
	}
	for f, q := range s.Queries {
		if int(f) >= telemetry.NumFields {
			return fmt.Errorf("promapi: Source.Queries has %v, which is not a telemetry field", f)
		}
		if strings.TrimSpace(q) == "" {
			return fmt.Errorf("promapi: Source.Queries[%v] is empty", f)
		}
	}
	qs, _ := s.queries()
	for _, f := range sortedFields(s.Timestamps) { // sorted: the same field is named every time
		switch {
		case int(f) >= telemetry.NumFields:
			return fmt.Errorf("promapi: Source.Timestamps has %v, which is not a telemetry field", f)
		case strings.TrimSpace(s.Timestamps[f]) == "":
			return fmt.Errorf("promapi: Source.Timestamps[%v] is empty", f)
		case qs[f] == "":
			return fmt.Errorf("promapi: Source.Timestamps[%v] stamps a field with no query in Source.Queries", f)
		case s.EndpointLabel != "" && s.EndpointLabel != DefaultEndpointLabel && s.Timestamps[f] == DefaultTimestamps()[f]:
			// Every series of it would be skipped, every round.
			return fmt.Errorf("promapi: Source.Timestamps[%v] is DefaultTimestamps', which keeps only %q, but Source.EndpointLabel is %q: give one that keeps %q", f, DefaultEndpointLabel, s.EndpointLabel, s.EndpointLabel)
		}
	}
	return nil
}

// Collect runs the combined query and returns the endpoints' observations,
// each field stamped with when its values were measured (see Timestamps),
// else with Prometheus' evaluation time. An endpoint whose fields were
// measured at different times (a model server and its node's dcgm-exporter,
// scraped by separate jobs) gets one observation per time, which a
// telemetry.Store merges field by field. Series without the endpoint
// label, with an unknown field, with a value that is not a finite number
// in the field's range (or a timestamp that is not a positive one), with
// an evaluation time that is not a positive one before the year 2262, of the
// wrong shape, or of endpoints past the first MaxEndpoints are skipped; if
// any were, the error wraps telemetry.ErrPartial. When one endpoint has
// several series for a field the largest value wins (the conservative
// reading), and the oldest timestamp; when one of them was skipped as bad,
// the endpoint gives none of that field, as the largest of the rest may
// understate it. The answer is read series by series,
// never held whole, so its cost follows the observations kept rather than
// the series sent.
func (s *Source) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	if err := s.Validate(); err != nil {
		return nil, err
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
	obs := c.observations()
	switch {
	case c.skipped > 0:
		return obs, fmt.Errorf("%w: promapi: %d series skipped; first: %s", telemetry.ErrPartial, c.skipped, c.firstSkip)
	case len(warnings) > 0:
		// The answer may lack series: what came is good, the round is partial.
		return obs, fmt.Errorf("%w: promapi: Prometheus warned the result may be incomplete: %s", telemetry.ErrPartial, warnings[0])
	}
	return obs, nil
}

// MaxEndpoints bounds the endpoints one answer yields observations for: a
// Store tracks no more by default (telemetry.DefaultMaxEndpoints). Series
// of further endpoints are skipped and counted.
const MaxEndpoints = telemetry.DefaultMaxEndpoints

// collector folds an answer's series into observations one at a time, as
// they are decoded: an answer is never held whole, so what it costs follows
// the observations kept, not the series sent.
type collector struct {
	src   *Source
	label string
	// obs holds one observation per endpoint, its Time the evaluation
	// time; stamps[j], when j < len(stamps), the times obs[j]'s fields
	// were measured (unix ns, 0 for none): an answer without timestamp
	// series costs nothing for them.
	obs    []telemetry.Observation
	loraAt map[int]float64 // obs index -> value of the LoRASlots series read
	stamps [][telemetry.NumFields]int64
	at     map[string]int // endpoint ID -> index in obs
	// lost holds, by endpoint ID, the fields one of whose value series
	// was skipped as bad: the largest of the others may understate the
	// endpoint, so observations withholds them.
	lost      map[string]telemetry.FieldSet
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

// add folds one series: a field's value, or (tagged with timeLabel) when a
// field's values were measured. When one endpoint has several series for a
// field the largest value wins, and the oldest time.
func (c *collector) add(metric map[string]string, value [2]any) {
	name, isValue := metric[fieldLabel]
	tname, isStamp := metric[timeLabel]
	if isStamp && !isValue {
		name = tname
	}
	f, ok := telemetry.ParseField(name)
	if !ok || isValue == isStamp {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("series %v has no known %s or %s label", metric, fieldLabel, timeLabel)
		}
		return
	}
	what := f.String()
	if isStamp {
		what += " time"
	}
	lv, ok := metric[c.label]
	if !ok || lv == "" {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("%s series has no %q label (keep it in the query's by clause)", what, c.label)
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
	switch {
	case err != nil:
	case isStamp && (v <= 0 || v > maxUnixSeconds):
		err = errors.New("not a time in Unix seconds")
	case isValue && !valid(f, v):
		err = errors.New("out of the field's range")
	}
	if err != nil {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("%s for %s: value %v (%v)", what, lv, value[1], err)
		}
		if isValue && f != telemetry.LoRASlots {
			if c.lost == nil {
				c.lost = map[string]telemetry.FieldSet{}
			}
			c.lost[id] |= 1 << f
		}
		return
	}
	j, seen := c.at[id]
	if !seen {
		// A LoRA series whose labels give no state is skipped before it
		// makes its endpoint an observation: left with no field and no
		// time, it would take one of MaxEndpoints places.
		if isValue && f == telemetry.LoRASlots {
			if _, _, err := loraState(metric); err != nil {
				if c.skip() {
					c.firstSkip = fmt.Sprintf("lora_slots for %s: %v", lv, err)
				}
				return
			}
		}
		if len(c.obs) == MaxEndpoints {
			if c.skip() {
				c.firstSkip = fmt.Sprintf("%s for %s: more than %d endpoints in one answer", what, lv, MaxEndpoints)
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
		c.obs = append(c.obs, telemetry.Observation{EndpointID: id})
	}
	if isStamp {
		for len(c.stamps) <= j {
			c.stamps = append(c.stamps, [telemetry.NumFields]int64{})
		}
		// Float seconds with millisecond precision, as timestamp() gives.
		ns := int64(math.Round(v*1e3)) * 1e6
		if cur := c.stamps[j][f]; cur == 0 || ns < cur {
			c.stamps[j][f] = ns
		}
		return
	}
	smp := &c.obs[j].Sample
	if f == telemetry.LoRASlots {
		if !c.addLoRA(j, metric, v, lv) {
			return
		}
	} else if cur, had := smp.Get(f); !had || v > cur {
		smp.Set(f, v)
	}
	if ts.After(smp.Time) {
		smp.Time = ts
	}
}

// addLoRA reads a LoRASlots series (see Source.Queries) into obs[j]: the
// series with the largest value is the endpoint's latest LoRA state. It
// reports whether the series was read; a bad one is skipped and counted.
func (c *collector) addLoRA(j int, metric map[string]string, v float64, lv string) bool {
	if at, ok := c.loraAt[j]; ok && at >= v {
		return true // an older state
	}
	slots, base, err := loraState(metric)
	if err != nil {
		if c.skip() {
			c.firstSkip = fmt.Sprintf("lora_slots for %s: %v", lv, err)
		}
		return false
	}
	if c.loraAt == nil {
		c.loraAt = map[int]float64{}
	}
	c.loraAt[j] = v
	c.obs[j].Sample.SetAdapters(slots, &telemetry.Adapters{
		Base:    base,
		Running: telemetry.AdapterNames(metric["running_lora_adapters"]),
		Waiting: telemetry.AdapterNames(metric["waiting_lora_adapters"]),
	})
	return true
}

// loraState reads a LoRASlots series' labels: its slots (max_lora) and
// base model (model_name), or why they give no state.
func loraState(metric map[string]string) (slots float64, base string, err error) {
	slots, err = strconv.ParseFloat(metric["max_lora"], 64)
	base = metric["model_name"]
	switch {
	case err != nil || !(slots >= 1) || math.IsInf(slots, 0):
		return 0, "", fmt.Errorf("max_lora %q is not a slot count", metric["max_lora"])
	case base == "":
		return 0, "", errors.New("no model_name label (the base model)")
	}
	return slots, base, nil
}

// idleAdapters empties the running (waiting) adapters of a sample whose
// running (waiting) count is 0: the lists are the last vLLM logged before
// it went idle.
func idleAdapters(s *telemetry.Sample) {
	a := s.Adapters
	if a == nil {
		return
	}
	r, okR := s.Get(telemetry.Running)
	w, okW := s.Get(telemetry.Waiting)
	if okR && r == 0 && len(a.Running) > 0 || okW && w == 0 && len(a.Waiting) > 0 {
		b := *a
		if okR && r == 0 {
			b.Running = nil
		}
		if okW && w == 0 {
			b.Waiting = nil
		}
		s.Adapters = &b
	}
}

// maxUnixSeconds bounds a timestamp series' value and an evaluation time:
// past it, nanoseconds would overflow an int64 (the year 2262). It stops a
// second short of that, so rounding to milliseconds cannot carry past it.
const maxUnixSeconds = math.MaxInt64/1e9 - 1

// observations returns the observations, each field stamped with when it
// was measured (never later than the evaluation time), else with the
// evaluation time. An endpoint whose fields were measured at different
// times keeps the fields of the first in its place and has an observation
// for each other time appended. Endpoints with timestamps and no values
// are left out.
func (c *collector) observations() []telemetry.Observation {
	obs := c.obs
	for j := range obs {
		if lost := c.lost[obs[j].EndpointID]; lost != 0 {
			s := &obs[j].Sample
			s.Has &^= lost
			for f := range telemetry.NumFields {
				if lost.Has(telemetry.Field(f)) {
					s.Values[f] = 0
				}
			}
		}
		idleAdapters(&obs[j].Sample)
	}
	for j := range c.stamps {
		o := &obs[j]
		eval := o.Sample.Time.UnixNano()
		var moved telemetry.FieldSet
		first, base := int64(0), len(obs) // obs[base:] will hold o's other times

		for f := range telemetry.NumFields {
			if !o.Sample.Has.Has(telemetry.Field(f)) {
				continue
			}
			t := eval
			if st := c.stamps[j][f]; st != 0 && st < eval {
				t = st
			}
			if first == 0 {
				first = t
			}
			if t == first {
				continue
			}
			moved |= 1 << f
			k := base
			for k < len(obs) && obs[k].Sample.Time.UnixNano() != t {
				k++
			}
			if k == len(obs) {
				obs = append(obs, telemetry.Observation{EndpointID: o.EndpointID, Sample: telemetry.Sample{Time: time.Unix(0, t)}})
				o = &obs[j] // append may have moved it
			}
			if telemetry.Field(f) == telemetry.LoRASlots {
				obs[k].Sample.SetAdapters(o.Sample.Values[f], o.Sample.Adapters)
			} else {
				obs[k].Sample.Set(telemetry.Field(f), o.Sample.Values[f])
			}
		}
		if first != 0 {
			o.Sample.Time = time.Unix(0, first)
		}
		o.Sample.Has &^= moved
		if moved.Has(telemetry.LoRASlots) {
			o.Sample.Adapters = nil
		}
	}
	if len(c.stamps) > 0 || len(c.lost) > 0 {
		// Endpoints that only timestamp series named hold no field, nor
		// do those whose every field was withheld.
		obs = slices.DeleteFunc(obs, func(o telemetry.Observation) bool { return o.Sample.Empty() })
	}
	return obs
}

// query sends the query and folds the answer's series into c; it returns
// the answer's warnings.
func (s *Source) query(ctx context.Context, query string, c *collector) ([]string, error) {
	// The API's path goes after the URL's own, before its query (a
	// Thanos querier's ?dedup=true, a tenant parameter of a proxy), which
	// the server reads beside the form's.
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil, fmt.Errorf("promapi: Source.URL: %w", err) // Validate refuses it first
	}
	api := u.JoinPath("api/v1/query")
	endpoint := api.String()
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
	// One byte past the limit tells an answer at it from a larger one
	// (kept below math.MaxInt64, where it would overflow and read nothing).
	body := &io.LimitedReader{R: resp.Body, N: min(limit, math.MaxInt64-1) + 1}
	env, derr := c.decode(json.NewDecoder(body))
	// Drain a little so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 4096))
	// Each error about the answer names where it came from (the client's
	// own errors do): one Source's URL may be a Grafana, a login page or
	// a proxy rather than Prometheus, which only the URL and the answer's
	// Content-Type tell.
	at := " (POST " + api.Redacted() + ")"
	var inData *dataError
	switch {
	case body.N <= 0:
		return nil, fmt.Errorf("promapi: response larger than %d bytes%s", limit, at)
	case derr == nil && env.status == "error":
		// Prometheus explains bad queries (400, 422) and overload (503) here.
		return nil, fmt.Errorf("promapi: query failed (HTTP %d, %s): %s%s", resp.StatusCode, env.errorType, env.errMsg, at)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("promapi: query: HTTP %s%s", resp.Status, at)
	case derr != nil && errors.As(derr, &inData) && !malformed(derr):
		return nil, fmt.Errorf("promapi: decoding query data: %w%s", inData.err, at)
	case derr != nil:
		if ct := resp.Header.Get("Content-Type"); !servedJSON(ct) {
			at = fmt.Sprintf(" (POST %s answered Content-Type %q, not Prometheus' application/json)", api.Redacted(), ct)
		}
		return nil, fmt.Errorf("promapi: decoding response: %w%s", derr, at)
	case env.status != "success":
		return nil, fmt.Errorf("promapi: response status %q, want \"success\"%s", env.status, at)
	case !env.data:
		return nil, fmt.Errorf("promapi: decoding query data: the answer has no data%s", at)
	case env.resultType != "vector":
		return nil, fmt.Errorf("promapi: query returned a %q, want a vector (instant query of series)%s", env.resultType, at)
	}
	return env.warnings, nil
}

// servedJSON reports whether contentType names JSON, as Prometheus' API
// answers (application/json), in any spelling.
func servedJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
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

// decodeResult folds a result's series into c, one at a time; a null
// result has none. A series of the wrong shape (a label value that is not
// a string) is skipped and counted; the decoder has read past it.
func (c *collector) decodeResult(dec *json.Decoder) error {
	switch t, err := dec.Token(); {
	case err != nil:
		return err
	case t == nil:
		// null: no series. Prometheus 2.0 answered an `or` of empty
		// vectors so (prometheus/prometheus#3515), and frontends still
		// answer some empty results so (Google's managed Prometheus
		// frontend an aggregation over nothing, GoogleCloudPlatform/
		// prometheus-engine#1645; Cortex's once).
		return nil
	case t != json.Delim('['):
		return fmt.Errorf("got %v where [ belongs", t)
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
	if sec <= 0 || sec > maxUnixSeconds {
		// No evaluation time a server answers with: converted, it would
		// be a meaningless time (int64 seconds wrap, UnixNano overflows)
		// and the series would go stale instead of being counted.
		return time.Time{}, 0, fmt.Errorf("timestamp %v is not a time in Unix seconds", p[0])
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
	case telemetry.Running, telemetry.Waiting:
		return v >= 0 && v <= telemetry.MaxRequests
	case telemetry.KVCachePreallocated:
		return v == 1 // its only value (telemetry.Sample.Set refuses others)
	case telemetry.Asleep:
		return v == 0 || v == 1
	}
	return v >= 0
}
