package promapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/promapi"
)

// Expositions the test exporters serve, one per engine generation the
// default queries cover.
var exporters = map[string]string{
	"vllm-v1": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.95
`,
	"vllm-older": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.2
`,
	"sglang": `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",pp_rank="0",tp_rank="0"} 4
sglang:num_running_reqs{model_name="m",pp_rank="1",tp_rank="0"} 5
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",pp_rank="0",tp_rank="0"} 2
sglang:num_queue_reqs{model_name="m",pp_rank="1",tp_rank="0"} 1
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",pp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{model_name="m",pp_rank="1",tp_rank="0"} 0.7
`,
	// Two data-parallel ranks of two tensor-parallel ranks each, every
	// scheduler exporting (--enable-metrics-for-all-schedulers), with
	// priority scheduling's breakdown next to each total.
	"sglang-dp": `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",priority="",pp_rank="0",tp_rank="0"} 6
sglang:num_running_reqs{dp_rank="0",model_name="m",priority="",pp_rank="0",tp_rank="1"} 6
sglang:num_running_reqs{dp_rank="0",model_name="m",priority="1",pp_rank="0",tp_rank="0"} 6
sglang:num_running_reqs{dp_rank="1",model_name="m",priority="",pp_rank="0",tp_rank="0"} 2
sglang:num_running_reqs{dp_rank="1",model_name="m",priority="",pp_rank="0",tp_rank="1"} 2
sglang:num_running_reqs{dp_rank="1",model_name="m",priority="1",pp_rank="0",tp_rank="0"} 2
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m",priority="",pp_rank="0",tp_rank="0"} 3
sglang:num_queue_reqs{dp_rank="0",model_name="m",priority="",pp_rank="0",tp_rank="1"} 3
sglang:num_queue_reqs{dp_rank="1",model_name="m",priority="",pp_rank="0",tp_rank="0"} 1
sglang:num_queue_reqs{dp_rank="1",model_name="m",priority="",pp_rank="0",tp_rank="1"} 1
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 0.4
sglang:token_usage{dp_rank="1",model_name="m",pp_rank="0",tp_rank="0"} 0.6
`,
	// A server that two scrape jobs select (a ServiceMonitor and a
	// PodMonitor over the same pods, or a chart's own and yours): its
	// series come twice, differing in the job label.
	"vllm-twice": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 6
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
`,
	// A vLLM server with LoRA adapters: the label set it set last counts.
	"vllm-lora": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.4
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7649312028718123e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="law"} 1.7649312110233219e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat",waiting_lora_adapters=""} 1.7649312079182e+09
`,
	// Two data-parallel engines with LoRA: the one gauge, without an
	// engine label, holds whichever engine logged last, and is not read.
	"vllm-lora-dp": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 2
vllm:num_requests_running{engine="1",model_name="llama"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7649312110233219e+09
`,
	// vLLM 0.9 to 0.10 export the renamed KV gauge under both names, with
	// the same labels. timestamp() drops the names, and two equal series
	// in one vector failed the whole query (HTTP 422): one such server
	// left the fleet without telemetry.
	"vllm-both": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
`,
	// A prefill/decode-disaggregated SGLang decode server, two TP ranks
	// exporting: requests in its prealloc and transfer queues wait ahead
	// of its waiting queue (modelserver reads it so); the grammar and
	// prefill inflight queues do not count.
	"sglang-pd": `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 10
sglang:num_running_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 10
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 2
sglang:num_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 2
# TYPE sglang:num_grammar_queue_reqs gauge
sglang:num_grammar_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 5
# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge
sglang:num_prefill_bootstrap_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 0
sglang:num_prefill_bootstrap_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 0
# TYPE sglang:num_prefill_inflight_queue_reqs gauge
sglang:num_prefill_inflight_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 7
# TYPE sglang:num_decode_prealloc_queue_reqs gauge
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 3
sglang:num_decode_prealloc_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 3
# TYPE sglang:num_decode_transfer_queue_reqs gauge
sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 4
sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 4
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 0.6
`,
	// trtllm-serve's gauges, named and labelled as
	// tensorrt_llm/metrics/collector.py writes them (see
	// modelserver/testdata/trtllm-serve.txt).
	"trtllm": `# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="llama-8b"} 5.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="trtllm",model_name="llama-8b"} 2.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="llama-8b"} 0.62
# TYPE trtllm_kv_cache_hit_rate gauge
trtllm_kv_cache_hit_rate{engine_type="trtllm",model_name="llama-8b"} 0.4
`,
	// Sleep mode (--enable-sleep-mode), as vllm/v1/metrics/loggers.py
	// exports it: two data-parallel engines put to sleep at level 1, and
	// a server caught mid-way, one engine awake.
	"vllm-sleep": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 0
vllm:num_requests_running{model_name="m",engine="1"} 0
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="awake"} 0.0
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="weights_offloaded"} 1.0
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="discard_all"} 0.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="awake"} 0.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="weights_offloaded"} 1.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="discard_all"} 0.0
`,
	"vllm-waking": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 0
vllm:num_requests_running{model_name="m",engine="1"} 0
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="awake"} 1.0
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{model_name="m",engine="0",sleep_state="discard_all"} 0.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="awake"} 0.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{model_name="m",engine="1",sleep_state="discard_all"} 1.0
`,
	"vllm-dp": `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.8
`,
}

var want = map[string]map[string]float64{
	// The label set vLLM set last, not the last line.
	"vllm-lora": {"running": 2, "waiting": 1, "kv_cache_usage": 0.4, "lora_slots": 2},
	// No lora_slots: see the exposition.
	"vllm-lora-dp": {"running": 3, "waiting": 0},
	"vllm-v1":      {"running": 3, "waiting": 7, "kv_cache_usage": 0.95},
	"vllm-older":   {"running": 1, "waiting": 0, "kv_cache_usage": 0.2},
	// Pipeline stages export the same batch: the largest counts once.
	"sglang":    {"running": 5, "waiting": 2, "kv_cache_usage": 0.7},
	"sglang-dp": {"running": 8, "waiting": 4, "kv_cache_usage": 0.6},
	// The waiting queue and the two PD queues ahead of it, each counted
	// once however many ranks export it.
	"sglang-pd": {"running": 10, "waiting": 2 + 3 + 4, "kv_cache_usage": 0.6},
	"vllm-both": {"running": 3, "waiting": 1, "kv_cache_usage": 0.25},
	"vllm-dp":   {"running": 7, "waiting": 5, "kv_cache_usage": 0.8},
	// Asleep only when every engine is.
	"vllm-sleep":  {"running": 0, "asleep": 1},
	"vllm-waking": {"running": 0, "asleep": 0},
	"trtllm":      {"running": 5, "waiting": 2, "kv_cache_usage": 0.62},
	// One server's requests, however many jobs scrape it.
	"vllm-twice": {"running": 4, "waiting": 6, "kv_cache_usage": 0.5},
}

// syncBuffer collects a child process's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// prometheusBinary returns the prometheus binary's path, or skips the test
// when there is none and INFERLB_REQUIRE_PROMETHEUS is unset.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("INFERLB_REQUIRE_PROMETHEUS") != "" {
			t.Fatalf("prometheus binary not found and INFERLB_REQUIRE_PROMETHEUS is set: %v", err)
		}
		t.Skip("prometheus binary not on PATH (apt-get install prometheus, or set INFERLB_REQUIRE_PROMETHEUS=1 to make this a failure)")
	}
	return bin
}

// prometheusServer is a Prometheus process a test started.
type prometheusServer struct {
	addr   string
	logs   *syncBuffer
	exited chan error // receives Wait's result once; a reader puts it back for the cleanup
}

// startPrometheus starts bin with config (temporary storage, a free port on
// 127.0.0.1) and kills it when the test ends. The port is found free and
// then handed to Prometheus, which binds it itself: a connection another
// test makes in between may take it, so a start whose bind fails is made
// again on another port.
func startPrometheus(t *testing.T, bin, config string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(config), 0o600))
	for attempt := 0; ; attempt++ {
		p := &prometheusServer{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), logs: &syncBuffer{}, exited: make(chan error, 1)}
		cmd := exec.Command(bin,
			"--config.file="+cfg,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data%d", attempt)),
			"--web.listen-address="+p.addr,
			"--log.level=warn",
		)
		cmd.Stdout, cmd.Stderr = p.logs, p.logs
		require.NoError(t, cmd.Start())
		go func() { p.exited <- cmd.Wait() }()
		if err := p.listening(30 * time.Second); err != nil && attempt < 4 && strings.Contains(p.logs.String(), "address already in use") {
			continue // exited: the port was taken
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-p.exited
		})
		return p
	}
}

// listening waits until p accepts connections, and returns the process's
// exit if it exits first (putting it back for the cleanup), or nil at the
// deadline, which leaves the failure to the test's own wait.
func (p *prometheusServer) listening(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.exited:
			p.exited <- err
			if err == nil {
				err = errors.New("exited")
			}
			return err
		default:
		}
		if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond) // an external process's startup, not a goroutine's
	}
	return nil
}

// TestRealPrometheus starts a Prometheus server of its own (temporary config
// and storage, a free port on 127.0.0.1) that scrapes the test exporters,
// then reads the fleet through promapi with the default queries.
func TestRealPrometheus(t *testing.T) {
	bin := prometheusBinary(t)

	// The exporters. Prometheus names each by its host:port instance label.
	idOf := map[string]string{} // instance -> exporter name
	var targets, again []string
	for name, body := range exporters {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		instance := strings.TrimPrefix(srv.URL, "http://")
		idOf[instance] = name
		targets = append(targets, fmt.Sprintf("%q", instance))
		if name == "vllm-twice" {
			again = append(again, fmt.Sprintf("%q", instance))
		}
	}

	prom := startPrometheus(t, bin, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: inference
    static_configs:
      - targets: [%s]
  - job_name: inference-again
    static_configs:
      - targets: [%s]
`, strings.Join(targets, ", "), strings.Join(again, ", ")))
	addr, logs, exited := prom.addr, prom.logs, prom.exited

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	src := &promapi.Source{
		URL:    "http://" + addr,
		Client: &http.Client{Transport: tr},
		EndpointID: func(instance string) (string, bool) {
			id, ok := idOf[instance]
			return id, ok
		},
	}

	// Prometheus is an external process: poll its API until the first
	// scrapes of all three exporters are visible, within a deadline.
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var got map[string]map[string]float64
	var adapters *telemetry.Adapters
	var lastErr error
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("prometheus exited early: %v\n%s", err, logs.String())
		case <-deadline:
			t.Fatalf("no complete fleet from prometheus within 60s; last: %v, %v\nprometheus log:\n%s", got, lastErr, logs.String())
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		if !bothJobsUp(ctx, src) {
			cancel()
			continue
		}
		obs, err := src.Collect(ctx)
		cancel()
		lastErr = err
		got = map[string]map[string]float64{}
		adapters = nil
		for _, o := range obs {
			got[o.EndpointID] = fields(o.Sample)
			if o.Sample.Adapters != nil {
				assert.Equal(t, "vllm-lora", o.EndpointID, "only vllm-lora reports LoRA")
				adapters = o.Sample.Adapters
			}
			assert.WithinDuration(t, time.Now(), o.Sample.Time, time.Minute, "stamped with the scrape time")
		}
		if err == nil && assert.ObjectsAreEqual(want, got) {
			break
		}
	}
	assert.Equal(t, want, got)
	if assert.NotNil(t, adapters) {
		assert.Equal(t, telemetry.Adapters{Base: "llama", Running: []string{"sql", "chat"}, Waiting: []string{"law"}}, *adapters)
	}

	// The same source through a Poller into a Store: one round, one query,
	// the whole fleet.
	var store telemetry.Store
	p, err := telemetry.NewPoller(src, &store, telemetry.PollerOptions{Timeout: 5 * time.Second})
	require.NoError(t, err)
	require.True(t, p.Poll(t.Context()))
	kv, ok := store.Latest("vllm-v1", time.Now(), time.Minute)
	require.True(t, ok)
	u, _ := kv.Get(telemetry.KVCacheUsage)
	assert.Equal(t, 0.95, u)
	assert.Equal(t, uint64(len(exporters)), p.Stats().Published)
}

// bothJobsUp reports whether Prometheus has scraped vllm-twice through
// both of its jobs: before that, its series would count once anyway.
func bothJobsUp(ctx context.Context, src *promapi.Source) bool {
	up := *src
	up.Queries = map[telemetry.Field]string{telemetry.Running: `sum by (instance) (up)`}
	obs, err := up.Collect(ctx)
	if err != nil {
		return false
	}
	for _, o := range obs {
		if n, _ := o.Sample.Get(telemetry.Running); o.EndpointID == "vllm-twice" && n == 2 {
			return true
		}
	}
	return false
}

// scrapeLog is a test exporter that records when it was scraped.
type scrapeLog struct {
	mu     sync.Mutex
	served []time.Time
}

// servedSince returns how many scrapes the exporter served at or after t.
func (l *scrapeLog) servedSince(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.served {
		if !at.Before(t) {
			n++
		}
	}
	return n
}

// last returns the time of the latest scrape served, zero before any.
func (l *scrapeLog) last() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.served) == 0 {
		return time.Time{}
	}
	return l.served[len(l.served)-1]
}

func (l *scrapeLog) exporter(t *testing.T, body string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		l.mu.Lock()
		l.served = append(l.served, time.Now())
		l.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Prometheus scrapes every few seconds, and a Source polled more often
// reads the same scrape several times. Each poll must present it under the
// time it was scraped, not under a new evaluation time: the balancer tells
// a new reading by its time, and one re-stamped on every poll would forget,
// poll after poll, the calls sent since the real scrape. A model server and
// its node's dcgm-exporter, scraped by separate jobs, keep their own times.
func TestRealPrometheusStampsTheScrapeTime(t *testing.T) {
	bin := prometheusBinary(t)
	var server, gpu scrapeLog
	instance := server.exporter(t, exporters["vllm-v1"])
	gpuTarget := gpu.exporter(t, "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 40\n"+
		"# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} 60000\n"+
		"# TYPE DCGM_FI_DEV_FB_FREE gauge\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} 21471\n")
	prom := startPrometheus(t, bin, fmt.Sprintf(`global:
  scrape_interval: 3s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: [%q]
  - job_name: dcgm
    scrape_interval: 4s
    static_configs:
      - targets: [%q]
    relabel_configs:
      - target_label: instance
        replacement: %q
`, instance, gpuTarget, instance))

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	src := &promapi.Source{URL: "http://" + prom.addr, Client: &http.Client{Transport: tr}}

	// Prometheus is an external process: poll until both jobs' first
	// scrapes are visible, within a deadline.
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ready := false; !ready; {
		select {
		case err := <-prom.exited:
			prom.exited <- err
			t.Fatalf("prometheus exited early: %v\n%s", err, prom.logs.String())
		case <-deadline:
			t.Fatalf("no scrape of both jobs within 60s\nprometheus log:\n%s", prom.logs.String())
		case <-tick.C:
		}
		obs, err := src.Collect(t.Context())
		var has telemetry.FieldSet
		for _, o := range obs {
			has |= o.Sample.Has
		}
		ready = err == nil && has.Has(telemetry.Running) && has.Has(telemetry.GPUUtil) && has.Has(telemetry.GPUMemUsed)
	}

	// Eight polls two 100 ms ticks apart: about 1.4 s, within one scrape
	// interval of either job. They read the scrape the first one read or
	// later ones; re-stamped readings would be eight. The bound counts the
	// scrapes the exporter served since the first reading's time (a scrape
	// is stamped when it starts, before its exporter answers) rather than
	// assuming the polls beat the 3 s interval: on a loaded machine the
	// queries can take long enough for another scrape to fall inside.
	var store telemetry.Store
	var got []telemetry.Observation
	rec := telemetry.SourceFunc(func(ctx context.Context) ([]telemetry.Observation, error) {
		obs, err := src.Collect(ctx)
		got = obs
		return obs, err
	})
	p, err := telemetry.NewPoller(rec, &store, telemetry.PollerOptions{Timeout: 5 * time.Second})
	require.NoError(t, err)
	const polls = 8
	exporter := map[telemetry.Field]*scrapeLog{telemetry.Running: &server, telemetry.GPUUtil: &gpu, telemetry.GPUMemUsed: &gpu}
	first := time.Now()
	seen := map[telemetry.Field]map[int64]bool{telemetry.Running: {}, telemetry.GPUUtil: {}, telemetry.GPUMemUsed: {}}
	for i := range polls {
		if i > 0 {
			<-tick.C
			<-tick.C
		}
		start := time.Now()
		require.True(t, p.Poll(t.Context()))
		lastServed := map[telemetry.Field]time.Time{telemetry.Running: server.last(), telemetry.GPUUtil: gpu.last(), telemetry.GPUMemUsed: gpu.last()}
		require.NotEmpty(t, got)
		for _, o := range got {
			assert.False(t, o.Sample.Time.After(start), "poll %d: %v is not a scrape time but the query's (poll started %v)", i, o.Sample.Time, start)
		}
		slot := store.Slot(instance)
		for f := range seen {
			at := time.Unix(0, slot.Observed(f))
			seen[f][at.UnixNano()] = true
			// Prometheus stamps a scrape when it starts, before the
			// exporter answers: no later than the last answer served.
			assert.False(t, at.After(lastServed[f]), "poll %d: %v observed at %v, after its exporter last served (%v)", i, f, at, lastServed[f])
		}
	}
	// The GPU's memory, joined by instance (the exporter relabelled to
	// its one server), without FB_RESERVED (an older exporter's).
	mem := map[string]float64{}
	for _, o := range got {
		for k, v := range fields(o.Sample) {
			mem[k] = v
		}
	}
	assert.Equal(t, 60000.0*(1<<20), mem["gpu_mem_used_bytes"])
	assert.Equal(t, 81471.0*(1<<20), mem["gpu_mem_total_bytes"])
	served := map[telemetry.Field]int{}
	for f, l := range exporter {
		oldest := int64(math.MaxInt64)
		for at := range seen[f] {
			oldest = min(oldest, at)
		}
		// Less 100 ms, for Prometheus aligning a scrape's stamp a few
		// milliseconds onto its schedule: scrapes are seconds apart.
		served[f] = l.servedSince(time.Unix(0, oldest).Add(-100 * time.Millisecond))
	}
	slot := store.Slot(instance)
	t.Logf("last poll: running scraped %v before it, gpu_util %v before it",
		time.Since(time.Unix(0, slot.Observed(telemetry.Running))), time.Since(time.Unix(0, slot.Observed(telemetry.GPUUtil))))
	for f, times := range seen {
		t.Logf("%v: %d distinct times over %d polls spanning %v, %d scrapes served since the first one read", f, len(times), polls, time.Since(first), served[f])
		assert.LessOrEqual(t, len(times), served[f], "%v: %d distinct scrape times over %d polls, but only %d scrapes were there to read", f, len(times), polls, served[f])
	}
}

// A Prometheus server scrapes less often than the Sink's readers accept
// (here every 2 s, against a max age of 100 ms): readings read through
// promapi carry their scrape's time, so they arrive too old to be used. The
// Poller must say so through OnError (a StaleSamplesError), and count them
// as the Store counts them, not leave only a counter climbing.
func TestRealPrometheusStaleReadingsReported(t *testing.T) {
	bin := prometheusBinary(t)
	var server scrapeLog
	instance := server.exporter(t, exporters["vllm-v1"])
	prom := startPrometheus(t, bin, fmt.Sprintf(`global:
  scrape_interval: 2s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: [%q]
`, instance))

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	src := &promapi.Source{URL: "http://" + prom.addr, Client: &http.Client{Transport: tr}}

	const maxAge = 100 * time.Millisecond
	// Prometheus is an external process: poll its API, within a deadline,
	// until a scrape is visible and already more than three max ages old
	// (a new scrape, every 2 s, makes the reading fresh again: wait for it
	// to age, and try again if a scrape lands between the check and the
	// round).
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for attempt := 0; ; attempt++ {
		select {
		case err := <-prom.exited:
			prom.exited <- err
			t.Fatalf("prometheus exited early: %v\n%s", err, prom.logs.String())
		case <-deadline:
			t.Fatalf("no round reported stale readings within 60s (%d attempts)\nprometheus log:\n%s", attempt, prom.logs.String())
		case <-tick.C:
		}
		obs, err := src.Collect(t.Context())
		if err != nil || len(obs) != 1 || time.Since(obs[0].Sample.Time) < 3*maxAge {
			continue
		}

		var store telemetry.Store
		store.ReadWithin(maxAge)
		var reported []error
		p, err := telemetry.NewPoller(src, &store, telemetry.PollerOptions{
			Timeout: 5 * time.Second,
			// Called from Poll, on this goroutine.
			OnError: func(err error) { reported = append(reported, err) },
		})
		require.NoError(t, err)
		require.True(t, p.Poll(t.Context()))
		st := p.Stats()
		if st.Stale == 0 {
			t.Logf("attempt %d: a fresh scrape landed before the round; again", attempt)
			continue
		}
		require.Len(t, reported, 1, "one report: %v", reported)
		require.ErrorIs(t, reported[0], telemetry.ErrStaleSamples)
		var se *telemetry.StaleSamplesError
		require.ErrorAs(t, reported[0], &se)
		assert.Equal(t, 1, se.Stale)
		assert.Equal(t, 1, se.Published)
		assert.Equal(t, maxAge, se.MaxAge)
		assert.Greater(t, se.Oldest, maxAge)
		assert.Less(t, se.Oldest, time.Minute, "a scrape's age, not the epoch's")
		assert.Equal(t, uint64(1), st.Stale)
		assert.Equal(t, uint64(1), st.Published)
		// The Store counts it as the Poller does: merged, but read by none.
		ss := store.Stats()
		assert.Equal(t, st.Stale, ss.ArrivedStale)
		assert.Zero(t, ss.Accepted)
		t.Logf("reported: %v", reported[0])
		return
	}
}
