// Command quickstart shows inferlb's HTTP transport beside round-robin on a
// small simulated fleet, in under a minute, with no GPU and no network:
//
//	go run ./examples/quickstart
//
// It starts four OpenAI-compatible backends on 127.0.0.1 (httptest servers
// whose engine is the fleet simulator's vLLM-style replica, run four times
// faster than real time), then sends the same seeded workload twice: once
// through a plain round-robin http.RoundTripper and once through
// httpbalancer.Transport. The workload is 16 long documents, each asked
// about by several users: a prefix cache can serve the document to every
// user of the replica that holds it, but no replica's cache holds them all.
// Each policy gets a fresh fleet, so neither inherits the other's caches.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// Workload and fleet. The replica is the simulator's 32B-on-H100 model
// with its KV cache cut to 30,000 tokens, so that 16 documents of 3,000
// tokens (48,000) overflow one replica but fit the fleet; times are model
// time, i.e. wall time x speedup.
const (
	replicas  = 4
	kvTokens  = 30_000
	speedup   = 4.0
	documents = 16
	users     = 4
	docTokens = 3000
	question  = 100
	answer    = 32
	model     = "qwen3-32b"
	seedKey   = 0x9e3779b97f4a7c15 // the fleet's shared affinity seed: a public constant for a reproducible demo; a real fleet uses a secret, or anyone can aim traffic at one server
)

func main() {
	rate := flag.Float64("rate", 40, "offered load, requests per second of model time")
	dur := flag.Duration("duration", 60*time.Second, "arrival window, model time")
	seed := flag.Uint64("seed", 1, "workload seed")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		log.Fatalf("unexpected arguments %q: every setting is a flag (-h lists them)", flag.Args())
	case !(*rate > 0) || math.IsInf(*rate, 0):
		log.Fatalf("-rate %v: must be a positive number of requests per second", *rate)
	case *dur <= 0:
		log.Fatalf("-duration %v: must be positive", *dur)
	}

	fmt.Printf("quickstart: %d simulated vLLM replicas (32B model, %dk-token KV cache each), %d documents x %d users,\n",
		replicas, kvTokens/1000, documents, users)
	fmt.Printf("%d-token document + %d-token question -> %d-token streamed answer, %.0f req/s for %v (model time, run %gx faster)\n",
		docTokens, question, answer, *rate, *dur, speedup)
	// Nothing else prints until both runs are done: say how long that is.
	fmt.Printf("Running round-robin, then inferlb: about %v of wall time...\n\n",
		(time.Duration(float64(2**dur)/speedup) + time.Second).Round(time.Second))

	var rows []result
	for _, policy := range []string{"round-robin", "inferlb"} {
		rows = append(rows, runPolicy(policy, *rate, *dur, *seed))
	}
	printTable(os.Stdout, rows)
	fmt.Println("\nTimes are model time. tok/s: answer tokens streamed per second; cache hit: the share of")
	fmt.Println("prompt tokens a replica found in its prefix cache (the rest it had to prefill).")
	fmt.Println("The same comparison at fleet scale, with more policies:")
	fmt.Println("  go run ./benchmarks/cmd/fleetsim -scenario shared-prefix")
}

type result struct {
	policy           string
	requests, failed int
	tokens           int64
	window           time.Duration
	ttft, e2e        []time.Duration
	hit              float64
}

// fleet starts the backends and returns their addresses and a stop func.
func fleet() ([]string, []*fleetsim.LiveServer, func()) {
	p := fleetsim.LLMServer()
	p.KVTokens = kvTokens
	var addrs []string
	var engines []*fleetsim.LiveServer
	var servers []*httptest.Server
	for range replicas {
		e := fleetsim.NewLiveServer(p, 1, speedup)
		s := httptest.NewServer(&backend{engine: e})
		engines = append(engines, e)
		servers = append(servers, s)
		addrs = append(addrs, s.Listener.Addr().String())
	}
	return addrs, engines, func() {
		for i := range servers {
			engines[i].Close()
			servers[i].Close()
		}
	}
}

func runPolicy(policy string, rate float64, dur time.Duration, seed uint64) result {
	addrs, engines, stop := fleet()
	defer stop()
	base := &http.Transport{MaxIdleConnsPerHost: 256}
	var rt http.RoundTripper
	switch policy {
	case "round-robin":
		rt = &roundRobin{addrs: addrs, base: base}
	default:
		var eps []inferlb.Endpoint
		for _, a := range addrs {
			eps = append(eps, inferlb.Endpoint{Addr: a})
		}
		t, err := httpbalancer.NewTransport(httpbalancer.Options{
			Endpoints: eps,
			Base:      base,
			// Every client process of one fleet shares the affinity seed,
			// so they agree on where each prompt lives (the transport's
			// prompt and session keys use the Balancer's seed).
			BalancerOptions: balancer.Options{AffinitySeed: seedKey},
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(1)
		}
		defer t.Close()
		rt = t
	}
	client := &http.Client{Transport: rt, Timeout: 5 * time.Minute}

	rng := rand.New(rand.NewPCG(seed, 0x9e37))
	docs := make([]string, documents)
	for d := range docs {
		docs[d] = fleetsim.Text(fleetsim.Segment{ID: uint64(1000 + d), Tokens: docTokens})
	}
	res := result{policy: policy}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var tokens atomic.Int64
	start := time.Now()
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speedup) }
	model := func(d time.Duration) time.Duration { return time.Duration(float64(d) * speedup) }
	next := time.Duration(0)
	for {
		next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if next >= dur {
			break
		}
		d, u := rng.IntN(documents), rng.IntN(users)
		body := chatBody(docs[d], fleetsim.Text(fleetsim.Segment{ID: uint64(1_000_000 + d*users + u), Tokens: question}))
		time.Sleep(time.Until(start.Add(wall(next))))
		wg.Go(func() {
			ttft, e2e, n, err := send(client, body)
			mu.Lock()
			defer mu.Unlock()
			res.requests++
			if err != nil {
				res.failed++ // what a broken stream delivered is not throughput
				return
			}
			tokens.Add(int64(n))
			res.ttft = append(res.ttft, model(ttft))
			res.e2e = append(res.e2e, model(e2e))
		})
	}
	wg.Wait()
	res.window = model(time.Since(start))
	res.tokens = tokens.Load()
	var hits, queries int64
	for _, e := range engines {
		st := e.Stats()
		hits += st.HitTokens
		queries += st.QueryTokens
	}
	if queries > 0 {
		res.hit = float64(hits) / float64(queries)
	}
	return res
}

func chatBody(doc, q string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"stream":     true,
		"max_tokens": answer,
		"messages": []map[string]string{
			{"role": "system", "content": "Answer questions about the document."},
			{"role": "user", "content": doc + "\n\nQuestion: " + q},
		},
	})
	return b
}

// send posts one streamed chat completion and times its first token and end.
func send(c *http.Client, body []byte) (ttft, e2e time.Duration, tokens int, err error) {
	start := time.Now()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://llm.fleet/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, 0, 0, fmt.Errorf("status %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
			continue
		}
		if tokens == 0 {
			ttft = time.Since(start)
		}
		tokens++
	}
	return ttft, time.Since(start), tokens, sc.Err()
}

// roundRobin is the baseline: each request goes to the next backend in turn,
// what a Kubernetes Service or a plain reverse proxy does.
type roundRobin struct {
	addrs []string
	base  http.RoundTripper
	next  atomic.Uint64
}

func (r *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	out.URL.Host = r.addrs[(r.next.Add(1)-1)%uint64(len(r.addrs))]
	out.Host = ""
	return r.base.RoundTrip(out)
}

func pct(xs []time.Duration, p float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := min(max(int(p/100*float64(len(s))+0.999999)-1, 0), len(s)-1)
	return fmt.Sprintf("%.2fs", s[k].Seconds())
}

func printTable(w io.Writer, rows []result) {
	fmt.Fprintf(w, "%-12s %8s %8s %9s %8s %8s %9s %8s %10s\n", "policy", "requests", "tok/s", "TTFT p50", "p90", "p99", "E2E p50", "p99", "cache hit")
	for _, r := range rows {
		fmt.Fprintf(w, "%-12s %8d %8.0f %9s %8s %8s %9s %8s %9.1f%%\n",
			r.policy, r.requests-r.failed, float64(r.tokens)/r.window.Seconds(),
			pct(r.ttft, 50), pct(r.ttft, 90), pct(r.ttft, 99), pct(r.e2e, 50), pct(r.e2e, 99), 100*r.hit)
		if r.failed > 0 {
			fmt.Fprintf(w, "%-12s %d requests failed\n", "", r.failed)
		}
	}
}
