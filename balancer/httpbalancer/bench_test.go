package httpbalancer_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// benchChat is a small non-streaming chat completion, as an agent or RAG
// pipeline sends by the million.
var benchChat = []byte(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":32,"temperature":0}`)

// benchChatEscaped is a chat completion in Chinese as Python clients send
// it (json.dumps' ensure_ascii: every character a \uXXXX escape).
var benchChatEscaped = []byte(`{"model":"qwen-2.5-7b","messages":[{"role":"system","content":` +
	strconv.QuoteToASCII("你是一个乐于助人的助手。请用简洁的中文回答。") + `},{"role":"user","content":` +
	strconv.QuoteToASCII("法国的首都是哪里？\n请简单说明它的历史。") + `}],"max_tokens":32,"temperature":0}`)

var benchReply = []byte(`{"id":"x","object":"chat.completion","created":1,"model":"llama-3-8b","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":25,"completion_tokens":2,"total_tokens":27}}`)

// benchServer answers every call with benchReply, doing as little as a
// server can, so the comparison charges the transport with everything.
func benchServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(benchHandler))
	b.Cleanup(srv.Close)
	return srv
}

// benchHandler answers a call with benchReply.
func benchHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(benchReply)
}

// BenchmarkChatCompletion compares one small chat completion over loopback
// through a bare http.Transport and through the balancing Transport (same
// http.Transport underneath), in the same run. The difference is the
// transport's cost: body peek and inspection, affinity key, pick, URL
// rewrite and the body wrapper that reports the outcome at EOF.
func BenchmarkChatCompletion(b *testing.B) {
	servers := []*httptest.Server{benchServer(b), benchServer(b), benchServer(b)}
	run := func(b *testing.B, client *http.Client, url string) {
		b.ReportAllocs()
		for b.Loop() {
			req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(benchChat))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatal(resp.Status)
			}
		}
	}
	b.Run("bare/servers=1", func(b *testing.B) {
		base := http.DefaultTransport.(*http.Transport).Clone()
		defer base.CloseIdleConnections()
		run(b, &http.Client{Transport: base}, servers[0].URL+"/v1/chat/completions")
	})
	// The floor for spreading calls over three servers at all: the least a
	// RoundTripper can do (rotate the host), so endpoints=3 is compared with
	// the cost of spreading, not with one warm connection.
	b.Run("bare-roundrobin/servers=3", func(b *testing.B) {
		base := http.DefaultTransport.(*http.Transport).Clone()
		defer base.CloseIdleConnections()
		rr := &roundRobin{base: base}
		for _, s := range servers {
			rr.hosts = append(rr.hosts, strings.TrimPrefix(s.URL, "http://"))
		}
		run(b, &http.Client{Transport: rr}, chatURL)
	})
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("inferlb/endpoints=%d", n), func(b *testing.B) {
			base := http.DefaultTransport.(*http.Transport).Clone()
			defer base.CloseIdleConnections()
			eps := make([]inferlb.Endpoint, n)
			for i := range eps {
				eps[i] = inferlb.Endpoint{Addr: strings.TrimPrefix(servers[i].URL, "http://")}
			}
			tr, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: eps, Base: base})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			run(b, &http.Client{Transport: tr}, chatURL)
		})
	}
}

// BenchmarkChatCompletionPaired measures the same comparison as
// BenchmarkChatCompletion, but alternates the two clients call by call and
// times each call, so both see the same machine load: on a shared machine
// the load drifts between sub-benchmarks by more than the difference being
// measured. It reports the mean of each as bare-ns/call and inferlb-ns/call,
// and overhead-% = 100 * (inferlb / bare - 1); and the same ratio of the
// median calls as overhead-med-%, which a stall of the machine (another
// process, a garbage collection landing on one side) moves far less.
//
// control pairs the bare client with a second bare client (its own
// http.Transport, as the balancing Transport's Base is): its overheads
// are the measurement's noise floor, which is what a figure of the other
// two must be read against. rewrite-only pairs it with a RoundTripper that
// does nothing but send a shallow copy of the request to the endpoint's
// host: the cost of being a routing RoundTripper at all, before any
// inspection, pick or outcome.
func BenchmarkChatCompletionPaired(b *testing.B) {
	for _, p := range pairings {
		b.Run(p.name, func(b *testing.B) { benchPaired(b, p.o, p.lb, benchServer(b).URL) })
	}
}

// BenchmarkChatCompletionProcess is BenchmarkChatCompletionPaired with the
// server in a process of its own (the test binary started again), as a
// model server is: in BenchmarkChatCompletionPaired the server's handler
// shares the client's heap, garbage collector, scheduler and CPU caches,
// so the server's half of every call is charged for the client's
// footprint too.
func BenchmarkChatCompletionProcess(b *testing.B) {
	url := processServer(b)
	for _, p := range pairings {
		b.Run(p.name, func(b *testing.B) { benchPaired(b, p.o, p.lb, url) })
	}
}

// pairings are the clients the paired benchmarks set against a bare one.
var pairings = []struct {
	name string
	o    httpbalancer.Options
	lb   pairedSide
}{
	{"default", httpbalancer.Options{}, sideInferlb},
	// Routing on path and headers only: what inspection costs.
	{"no-peek", httpbalancer.Options{MaxPeek: -1}, sideInferlb},
	{"control", httpbalancer.Options{}, sideBare},
	// The least a RoundTripper that routes can add: a shallow copy of
	// the request with the endpoint's host (roundRobin over one).
	{"rewrite-only", httpbalancer.Options{}, sideRewrite},
}

// pairedSide is what benchPaired pairs the bare client with.
type pairedSide int

const (
	sideInferlb pairedSide = iota // the balancing Transport
	sideBare                      // a second bare client (the control)
	sideRewrite                   // a RoundTripper that only rewrites the host
)

func benchPaired(b *testing.B, o httpbalancer.Options, side pairedSide, srvURL string) {
	bareBase := http.DefaultTransport.(*http.Transport).Clone()
	defer bareBase.CloseIdleConnections()
	lbBase := http.DefaultTransport.(*http.Transport).Clone()
	defer lbBase.CloseIdleConnections()
	o.Endpoints = []inferlb.Endpoint{{Addr: strings.TrimPrefix(srvURL, "http://")}}
	o.Base = lbBase
	tr, err := httpbalancer.NewTransport(o)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	bare, lb := &http.Client{Transport: bareBase}, &http.Client{Transport: tr}
	bareURL, lbURL := srvURL+"/v1/chat/completions", chatURL
	switch side {
	case sideBare:
		lb, lbURL = &http.Client{Transport: lbBase}, bareURL
	case sideRewrite:
		lb = &http.Client{Transport: &roundRobin{base: lbBase, hosts: []string{strings.TrimPrefix(srvURL, "http://")}}}
	}
	bareCalls, lbCalls := make([]time.Duration, 0, 1<<15), make([]time.Duration, 0, 1<<15)
	call := func(c *http.Client, url string) time.Duration {
		start := time.Now()
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(benchChat))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return time.Since(start)
	}
	var tBare, tLB time.Duration
	n := 0
	for b.Loop() {
		var db, dl time.Duration
		if n%2 == 0 { // alternate who goes first
			db = call(bare, bareURL)
			dl = call(lb, lbURL)
		} else {
			dl = call(lb, lbURL)
			db = call(bare, bareURL)
		}
		tBare, tLB = tBare+db, tLB+dl
		bareCalls, lbCalls = append(bareCalls, db), append(lbCalls, dl)
		n++
	}
	b.ReportMetric(float64(tBare.Nanoseconds())/float64(n), "bare-ns/call")
	b.ReportMetric(float64(tLB.Nanoseconds())/float64(n), "inferlb-ns/call")
	b.ReportMetric(100*(float64(tLB)/float64(tBare)-1), "overhead-%")
	slices.Sort(bareCalls)
	slices.Sort(lbCalls)
	b.ReportMetric(100*(float64(lbCalls[n/2])/float64(bareCalls[n/2])-1), "overhead-med-%")
}

// BenchmarkInspect is the inspector alone on the benchmark's body.
func BenchmarkInspect(b *testing.B) {
	r, _ := http.NewRequest(http.MethodPost, chatURL, nil)
	in := &httpbalancer.OpenAI{Keyer: nil}
	keyed := &httpbalancer.OpenAI{Keyer: cacheKeyer()}
	for _, tc := range []struct {
		name string
		in   *httpbalancer.OpenAI
		body []byte
	}{{"fields", in, benchChat}, {"fields+key", keyed, benchChat}, {"escaped+key", keyed, benchChatEscaped}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var info httpbalancer.Info
			for b.Loop() {
				info = httpbalancer.Info{}
				tc.in.Inspect(r, tc.body, true, &info)
			}
			if info.Model == "" {
				b.Fatal("no model")
			}
		})
	}
}

func cacheKeyer() *cache.Keyer { return cache.NewKeyer(1) }

// roundRobin is the minimal balancing RoundTripper: rotate the host.
type roundRobin struct {
	base  http.RoundTripper
	hosts []string
	n     atomic.Uint64
}

func (rr *roundRobin) RoundTrip(r *http.Request) (*http.Response, error) {
	out := *r
	u := *r.URL
	u.Host = rr.hosts[rr.n.Add(1)%uint64(len(rr.hosts))]
	out.URL, out.Host = &u, ""
	return rr.base.RoundTrip(&out)
}

// cannedBase answers without a network: what remains is the transport's own work.
type cannedBase struct{}

func (cannedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	_ = r.Body.Close()
	return &http.Response{
		StatusCode:    http.StatusOK,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(benchReply)),
		ContentLength: int64(len(benchReply)),
		Request:       r,
	}, nil
}

// BenchmarkTransportOverhead is the transport's own cost per call, with a
// Base that answers from memory: peek, inspection, affinity key, pick, URL
// rewrite, body wrapper and Done.
func BenchmarkTransportOverhead(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			eps := make([]inferlb.Endpoint, n)
			for i := range eps {
				eps[i] = inferlb.Endpoint{Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)}
			}
			tr, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: eps, Base: cannedBase{}})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			b.ReportAllocs()
			for b.Loop() {
				overheadCall(b, tr)
			}
		})
	}
	b.Run("canned-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			overheadCall(b, cannedBase{})
		}
	})
}

// overheadCall makes the overhead benchmarks' call through rt: the
// benchmark's chat completion, its answer read to the end and closed.
func overheadCall(b *testing.B, rt http.RoundTripper) {
	req, _ := http.NewRequest(http.MethodPost, chatURL, bytes.NewReader(benchChat))
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

// BenchmarkTransportOverheadCold is BenchmarkTransportOverhead with the CPU
// caches flushed of the transport's code and data before every call (8 MiB
// streamed, untimed), as they are on a real loopback call, where the
// kernel's network stack and net/http's goroutines run in between: it shows
// how much of the transport's cost there is cache misses rather than
// instructions. Compare transport with canned-only in the same run.
func BenchmarkTransportOverheadCold(b *testing.B) {
	evict := make([]byte, 8<<20)
	var sink byte
	flush := func() {
		for i := 0; i < len(evict); i += 64 {
			evict[i]++
		}
		sink += evict[len(evict)/2]
	}
	run := func(b *testing.B, rt http.RoundTripper) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			flush()
			b.StartTimer()
			overheadCall(b, rt)
		}
	}
	b.Run("transport", func(b *testing.B) {
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}, Base: cannedBase{}})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		run(b, tr)
	})
	b.Run("canned-only", func(b *testing.B) { run(b, cannedBase{}) })
	_ = sink
}

// benchServerEnv, set in a child's environment, makes the test binary a
// benchmark server (see TestMain) instead of running tests.
const benchServerEnv = "INFERLB_BENCH_SERVER"

// serveBench is the child's side of processServer: the bench handler on a
// loopback port, its address on stdout, until stdin closes.
func serveBench() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: http.HandlerFunc(benchHandler)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}

// processServer starts the test binary again as a benchmark server in its
// own process, as a model server is, and returns its base URL: the server
// then shares neither the client's heap and garbage collector nor its
// goroutine scheduler.
func processServer(b *testing.B) string {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), benchServerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("benchmark server: %v", err)
	}
	return "http://" + strings.TrimSpace(addr)
}
