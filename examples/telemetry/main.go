// Command telemetry routes chat completions with the model servers' own
// /metrics, scraped by a telemetry.Poller into the HTTP transport's
// Balancer, as the README's Telemetry section describes:
//
//	go run ./examples/telemetry
//
// It starts four fake vLLM replicas on 127.0.0.1 that answer
// /v1/chat/completions and serve a vLLM V1 /metrics exposition: two idle,
// one whose KV cache is 97% full with a queue (other callers' load, which
// this process cannot see in its own calls), and one put to sleep
// (vllm:engine_sleep_state). It sends the same calls through a Transport
// without telemetry and through one whose Balancer a modelserver.Source
// feeds, and prints how many each replica got.
//
// A sample counts only under the ID the Balancer knows the endpoint by
// (Endpoint.ID, else Addr exactly as given, scheme included), so the
// scrape targets are built from Transport.Endpoints, by Endpoint.Key. Last,
// the program scrapes with targets named by host:port instead: every sample
// is dropped, and the Poller's OnError says so with a
// telemetry.UnknownEndpointsError that names the unknown IDs and the ones
// the Balancer knows (the telemetry Store's DroppedUnknown counts them
// too), which is where to look when telemetry seems to change nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

const model = "llama-3-8b"

// replica is a stand-in for one vLLM server: it answers every chat at
// once and reports the fixed state it was given on /metrics.
type replica struct {
	name    string
	state   string // for the table
	metrics string // the /metrics exposition
	calls   atomic.Int64
}

func (r *replica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, r.metrics)
	case "/v1/chat/completions":
		_, _ = io.Copy(io.Discard, req.Body)
		r.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-%s","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`, r.name, model)
	default:
		http.NotFound(w, req)
	}
}

// exposition is a vLLM V1 /metrics body with the given load.
func exposition(running, waiting int, kv float64, asleep bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=%q} %d\n", model, running)
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=%q} %d\n", model, waiting)
	fmt.Fprintf(&b, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=%q} %g\n", model, kv)
	if asleep {
		b.WriteString("# TYPE vllm:engine_sleep_state gauge\n")
		for _, s := range []struct {
			state string
			v     int
		}{{"awake", 0}, {"weights_offloaded", 1}, {"discard_all", 0}} {
			fmt.Fprintf(&b, "vllm:engine_sleep_state{engine=\"0\",model_name=%q,sleep_state=%q} %d\n", model, s.state, s.v)
		}
	}
	return b.String()
}

type config struct {
	calls, workers int
	onError        func(error) // what the Pollers report, but the host:port round's unknown IDs
}

// result is what run measured, for the test.
type result struct {
	calls   map[string]map[string]int64 // policy -> replica -> calls
	dropped uint64                      // samples dropped as unknown with host:port targets
	unknown error                       // what the Poller's OnError got for them
}

func main() {
	calls := flag.Int("calls", 200, "chat completions per policy")
	workers := flag.Int("workers", 8, "concurrent callers")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		log.Fatalf("unexpected arguments %q: every setting is a flag (-h lists them)", flag.Args())
	case *calls < 1:
		log.Fatalf("-calls %d: must be at least 1", *calls)
	case *workers < 1:
		log.Fatalf("-workers %d: must be at least 1", *workers) // none would take the calls: run would wait for ever
	}
	if _, err := run(context.Background(), os.Stdout, config{calls: *calls, workers: *workers, onError: logError}); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, cfg config) (result, error) {
	res := result{calls: map[string]map[string]int64{}}
	replicas := []*replica{
		{name: "vllm-0", state: "idle", metrics: exposition(1, 0, 0.10, false)},
		{name: "vllm-1", state: "KV cache 97%, 12 queued", metrics: exposition(40, 12, 0.97, false)},
		{name: "vllm-2", state: "asleep", metrics: exposition(0, 0, 0, true)},
		{name: "vllm-3", state: "idle", metrics: exposition(2, 0, 0.12, false)},
	}
	var endpoints []inferlb.Endpoint
	for _, r := range replicas {
		srv := httptest.NewServer(r)
		defer srv.Close()
		// An ID of its own: telemetry targets name the endpoint by it.
		endpoints = append(endpoints, inferlb.Endpoint{ID: r.name, Addr: srv.URL})
	}

	fmt.Fprintf(out, "%d chat completions from %d workers per policy over %d fake vLLM replicas\n\n", cfg.calls, cfg.workers, len(replicas))
	for _, policy := range []string{"without telemetry", "with /metrics"} {
		t, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: endpoints})
		if err != nil {
			return res, err
		}
		stop := func() {}
		if policy == "with /metrics" {
			stop, err = scrape(ctx, t, func(e inferlb.Endpoint) string { return e.Key() }, cfg.onError)
			if err != nil {
				t.Close()
				return res, err
			}
		}
		for _, r := range replicas {
			r.calls.Store(0)
		}
		err = send(ctx, t, cfg)
		// The Poller stops first: one still publishing into the closed
		// Balancer, which knows no endpoint, would report every sample
		// as unknown.
		stop()
		t.Close()
		if err != nil {
			return res, fmt.Errorf("%s: %w", policy, err)
		}
		counts := map[string]int64{}
		for _, r := range replicas {
			counts[r.name] = r.calls.Load()
		}
		res.calls[policy] = counts
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replica\t/metrics says\twithout telemetry\twith /metrics\t")
	for _, r := range replicas {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", r.name, r.state, res.calls["without telemetry"][r.name], res.calls["with /metrics"][r.name])
	}
	if err := tw.Flush(); err != nil {
		return res, err
	}

	// The same scrape with targets named by host:port, not by the
	// endpoints' IDs: the Balancer knows no such endpoint and drops every
	// sample, counting it, and the Poller tells OnError (once while the
	// mistake stays the same).
	t, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: endpoints})
	if err != nil {
		return res, err
	}
	defer t.Close()
	p, err := newPoller(t, func(e inferlb.Endpoint) string { return strings.TrimPrefix(e.Addr, "http://") }, func(err error) {
		if errors.Is(err, telemetry.ErrUnknownEndpoint) {
			res.unknown = err
			return
		}
		cfg.onError(err)
	})
	if err != nil {
		return res, err
	}
	p.Poll(ctx) // one round: OnError runs on this goroutine
	st := t.Balancer().Telemetry().Stats()
	res.dropped = st.DroppedUnknown
	fmt.Fprintf(out, "\nTargets named by host:port instead of the endpoints' IDs: %d of %d samples dropped as unknown, none used. The Poller's OnError got:\n%v\n",
		st.DroppedUnknown, len(replicas), res.unknown)
	return res, nil
}

// logError logs what a Poller reports; its errors name their package
// ("telemetry: ...") already.
func logError(err error) { log.Print(err) }

// scrape starts a Poller (newPoller) into t's Balancer. It polls once
// before returning, so the first calls already see the readings; stop
// ends it.
func scrape(ctx context.Context, t *httpbalancer.Transport, id func(inferlb.Endpoint) string, onError func(error)) (stop func(), err error) {
	p, err := newPoller(t, id, onError)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p.Poll(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx) // until ctx ends
	}()
	return func() { cancel(); <-done }, nil
}

// newPoller returns a Poller that scrapes every endpoint of t, naming each
// target with id, into t's Balancer, and tells onError of what went wrong.
func newPoller(t *httpbalancer.Transport, id func(inferlb.Endpoint) string, onError func(error)) (*telemetry.Poller, error) {
	src := &modelserver.Source{Targets: func() []modelserver.Target {
		var ts []modelserver.Target
		for _, e := range t.Endpoints() { // follows Update and Discovery
			base := e.Addr // "http://127.0.0.1:port" here; "host:port" needs a scheme
			if !strings.Contains(base, "://") {
				base = "http://" + base
			}
			ts = append(ts, modelserver.Target{EndpointID: id(e), URL: base + "/metrics"})
		}
		return ts
	}}
	return telemetry.NewPoller(src, t.Balancer(), telemetry.PollerOptions{
		Interval: time.Second,
		OnError:  onError,
	})
}

// send makes cfg.calls chat completions, each with a prompt of its own,
// from cfg.workers goroutines, and fails at the first call that fails.
func send(ctx context.Context, t *httpbalancer.Transport, cfg config) error {
	client := &http.Client{Transport: t}
	jobs := make(chan int)
	errs := make(chan error, cfg.workers)
	var wg sync.WaitGroup
	for range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := chat(ctx, client, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
loop:
	for i := range cfg.calls {
		select {
		case jobs <- i:
		case err = <-errs:
			break loop
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

func chat(ctx context.Context, client *http.Client, i int) error {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"question %d"}],"max_tokens":64}`, model, i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm.internal/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil { // the call ends, and is reported, here
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}
