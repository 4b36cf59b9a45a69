// Command httpclient balances the official OpenAI Go client across local
// OpenAI-compatible backends with inferlb's HTTP transport: the client is
// unchanged except for its http.Client, and its base URL names a logical
// host ("llm.internal") that the transport resolves to a backend per call.
//
// It starts fake vLLM servers on 127.0.0.1 that answer /v1/chat/completions
// (JSON or a server-sent event stream, a few milliseconds per token) and
// report their load in vLLM's endpoint-load-metrics header; one of them
// reports a nearly full KV cache, and another decodes 3x slower than the
// rest without saying so (a throttled GPU), which the balancer learns from
// the streamed answers' time per token. It sends a mix of plain and streamed chat
// completions, plus one conversation pinned by a session header, and prints
// how many calls each backend got and what the balancer learned. Last, it
// holds a few conversations on the Responses API, each follow-up naming the
// response it continues (previous_response_id), against backends that keep
// stored responses in memory as vLLM does, so a follow-up sent anywhere else
// fails with 404; and the same through a plain round-robin transport. Then it
// asks for a LoRA adapter that only one replica has loaded, through both: the
// others answer 404 at once, as vLLM does, and inferlb sends such a call on
// and then keeps the adapter's calls off them. Compare
// -affinity prefer (the default: a prompt's key owner keeps it while within
// its load bound) with -affinity off (pure load and telemetry).
//
//	go run ./examples/httpclient
//	go run ./examples/httpclient -calls 400 -workers 16 -affinity off
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// backend is a stand-in for one vLLM replica.
type backend struct {
	name     string
	kvCache  float64 // reported in every answer's load header
	perToken time.Duration
	running  atomic.Int64
	plain    atomic.Int64
	streamed atomic.Int64
	session  atomic.Int64    // calls of the pinned conversation
	adapters map[string]bool // LoRA adapters loaded here, besides the base model
	notFound atomic.Int64    // calls for a model not loaded here

	mu     sync.Mutex
	stored map[string]bool // response IDs this replica made (its in-memory store)
}

const tokens = 8

// baseModel is the model every replica serves.
const baseModel = "llama-3-8b"

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/responses" {
		b.respond(w, r)
		return
	}
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	b.running.Add(1)
	defer b.running.Add(-1)
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Model != baseModel && !b.adapters[req.Model] {
		// vLLM's answer for a model (a LoRA adapter) it has not loaded.
		b.notFound.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"The model `+"`%s`"+` does not exist.","type":"NotFoundError","param":null,"code":404}}`, req.Model)
		return
	}
	if r.Header.Get("X-Session-Id") != "" {
		b.session.Add(1)
	}
	if r.Header.Get("Endpoint-Load-Metrics-Format") != "" {
		w.Header().Set("Endpoint-Load-Metrics", fmt.Sprintf(
			"TEXT named_metrics.kv_cache_usage_perc=%.2f, named_metrics.num_requests_running=%d",
			b.kvCache, b.running.Load()))
	}
	if !req.Stream {
		b.plain.Add(1)
		time.Sleep(tokens * b.perToken)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":0,"model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"answer from %s"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}`, req.Model, b.name, tokens, 8+tokens)
		return
	}
	b.streamed.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range tokens {
		time.Sleep(b.perToken)
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":%q,"+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", req.Model, i)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// respond serves the Responses API with an in-memory store, as vLLM does:
// a follow-up naming a response this replica did not make is not found.
func (b *backend) respond(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Previous string `json:"previous_response_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	if req.Previous != "" && !b.stored[req.Previous] {
		b.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"response %s not found","type":"invalid_request_error"}}`, req.Previous)
		return
	}
	if b.stored == nil {
		b.stored = map[string]bool{}
	}
	id := fmt.Sprintf("resp_%s_%d", strings.ReplaceAll(b.name, "-", ""), len(b.stored))
	b.stored[id] = true
	b.mu.Unlock()
	time.Sleep(tokens * b.perToken)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q,"object":"response","created_at":0,"status":"completed","model":%q,`+
		`"output":[{"type":"message","id":"msg_0","status":"completed","role":"assistant",`+
		`"content":[{"type":"output_text","text":"answer from %s","annotations":[]}]}]}`, id, req.Model, b.name)
}

func main() {
	calls := flag.Int("calls", 200, "chat completions to send")
	workers := flag.Int("workers", 8, "concurrent callers")
	affinity := flag.String("affinity", "prefer", "how prompt affinity steers picks: prefer, off or strict")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		log.Fatalf("unexpected arguments %q: every setting is a flag (-h lists them)", flag.Args())
	case *calls < 1:
		log.Fatalf("-calls %d: must be at least 1", *calls)
	case *workers < 1:
		log.Fatalf("-workers %d: must be at least 1", *workers)
	}
	mode, err := balancer.ParseAffinityMode(*affinity)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := run(context.Background(), os.Stdout, config{calls: *calls, workers: *workers, affinity: mode}); err != nil {
		log.Fatal(err)
	}
}

// config is what the flags set.
type config struct {
	calls, workers int
	affinity       balancer.AffinityMode
}

// outcome is what run counts, by transport ("inferlb", "round-robin") for
// the last two comparisons.
type outcome struct {
	failed     int64          // chat completions of the first batch that failed
	lost       map[string]int // Responses API conversations that lost their stored response, of conversations
	loraFailed map[string]int // LoRA-adapter calls that failed, of loraCalls
}

// The Responses API conversations (four turns each) and the LoRA-adapter
// calls made through each transport.
const (
	conversations = 8
	loraCalls     = 20
)

// run starts the backends, sends the calls and writes the report to out.
func run(ctx context.Context, out io.Writer, cfg config) (outcome, error) {
	res := outcome{lost: map[string]int{}, loraFailed: map[string]int{}}
	backends := []*backend{
		{name: "vllm-0", kvCache: 0.30, perToken: 2 * time.Millisecond, adapters: map[string]bool{"sql-lora": true}},
		{name: "vllm-1", kvCache: 0.35, perToken: 2 * time.Millisecond},
		{name: "vllm-2", kvCache: 0.97, perToken: 2 * time.Millisecond}, // nearly full
		{name: "vllm-3", kvCache: 0.30, perToken: 6 * time.Millisecond}, // 3x slower per token
	}
	var endpoints []inferlb.Endpoint
	for _, b := range backends {
		srv := httptest.NewServer(b) // listens on 127.0.0.1
		defer srv.Close()
		endpoints = append(endpoints, inferlb.Endpoint{ID: b.name, Addr: srv.URL})
	}

	transport, err := httpbalancer.NewTransport(httpbalancer.Options{
		Endpoints:       endpoints,
		LoadReports:     true, // ask for vLLM's per-response load header and route on it
		BalancerOptions: balancer.Options{Affinity: cfg.affinity},
	})
	if err != nil {
		return res, err
	}
	defer transport.Close()
	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: transport}),
		option.WithBaseURL("http://llm.internal/v1/"),
		option.WithAPIKey("unused"),
	)

	jobs := make(chan int)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.workers {
		wg.Go(func() {
			for i := range jobs {
				if err := chat(ctx, client, i); err != nil {
					failed.Add(1)
					log.Printf("call %d: %v", i, err)
				}
			}
		})
	}
	for i := range cfg.calls {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)

	// One conversation, five turns, pinned by its session header: every
	// turn lands where the previous ones left their KV cache.
	for turn := range 5 {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    baseModel,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("turn %d", turn))},
		}, option.WithHeader("X-Session-Id", "user-42"))
		if err != nil {
			return res, err
		}
	}
	res.failed = failed.Load()

	fmt.Fprintf(out, "%d calls (every other one streamed) from %d workers in %v, %d failed\n\n",
		cfg.calls, cfg.workers, elapsed.Round(time.Millisecond), failed.Load())
	stats := map[string]balancer.EndpointStats{}
	for _, s := range transport.Balancer().Stats() {
		stats[s.ID] = s
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tKV cache\tplain\tstreamed\tshare\tTTFT (EWMA)\ttime/token (EWMA)\tsession turns\t")
	for _, b := range backends {
		n := b.plain.Load() + b.streamed.Load() - b.session.Load()
		fmt.Fprintf(tw, "%s\t%.0f%%\t%d\t%d\t%.0f%%\t%s\t%s\t%d\t\n", b.name, 100*b.kvCache,
			b.plain.Load()-b.session.Load(), b.streamed.Load(), 100*float64(n)/float64(cfg.calls),
			ewma(stats[b.name].TTFT), ewma(stats[b.name].TimePerOutputToken), b.session.Load())
	}
	_ = tw.Flush()

	// The same client through inferlb and through a plain round robin,
	// without the client's own retries, for the last two comparisons.
	compare := []struct {
		name   string
		client openai.Client
	}{
		{"inferlb", newClient(transport)},
		{"round-robin", newClient(&roundRobin{hosts: endpoints})},
	}

	// Conversations on the Responses API: each follow-up sends only its new
	// input and names the response it continues, which only the replica
	// that made it has.
	fmt.Fprintln(out)
	for _, c := range compare {
		client := c.client
		lost := 0
		for conv := range conversations {
			prev := ""
			for turn := range 4 {
				params := responses.ResponseNewParams{
					Model: baseModel,
					Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("conversation %d, turn %d", conv, turn))},
				}
				if prev != "" {
					params.PreviousResponseID = openai.String(prev)
				}
				resp, err := client.Responses.New(ctx, params)
				if err != nil {
					lost++
					break // a 404: the conversation is lost
				}
				prev = resp.ID
			}
		}
		res.lost[c.name] = lost
		fmt.Fprintf(out, "Responses API through %s: %d of %d four-turn conversations lost their stored response\n", c.name, lost, conversations)
	}

	// A LoRA adapter loaded on vllm-0 alone, and nothing in the endpoint
	// list says so: the other replicas answer its calls 404 at once.
	fmt.Fprintln(out)
	for _, c := range compare {
		client := c.client
		var before int64
		for _, b := range backends {
			before += b.notFound.Load()
		}
		failed := 0
		for i := range loraCalls {
			_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     "sql-lora",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("query %d", i))},
				MaxTokens: openai.Int(tokens),
			})
			if err != nil {
				failed++
			}
		}
		var met int64
		for _, b := range backends {
			met += b.notFound.Load()
		}
		res.loraFailed[c.name] = failed
		fmt.Fprintf(out, "LoRA adapter on vllm-0 only, through %s: %d of %d calls failed (%d 404s met on the way)\n", c.name, failed, loraCalls, met-before)
	}
	return res, nil
}

// ewma prints a latency average, "-" when there is none yet (no streamed
// answer from that backend), not a 0s that reads as fast.
func ewma(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(100 * time.Microsecond).String()
}

// newClient is the OpenAI client over rt, without retries of its own.
func newClient(rt http.RoundTripper) openai.Client {
	return openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: rt}),
		option.WithBaseURL("http://llm.internal/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
	)
}

// roundRobin is the plain alternative: rotate the backend per request.
type roundRobin struct {
	hosts []inferlb.Endpoint
	n     atomic.Uint64
}

func (rr *roundRobin) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	u, err := url.Parse(rr.hosts[rr.n.Add(1)%uint64(len(rr.hosts))].Addr)
	if err != nil {
		return nil, err
	}
	out.URL.Scheme, out.URL.Host, out.Host = u.Scheme, u.Host, ""
	return http.DefaultTransport.RoundTrip(out)
}

// chat sends call i: streamed when i is odd, each with its own prompt.
func chat(ctx context.Context, client openai.Client, i int) error {
	params := openai.ChatCompletionNewParams{
		Model: baseModel,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a concise assistant."),
			openai.UserMessage(fmt.Sprintf("Question %d: what is %d + %d?", i, i, i)),
		},
		MaxTokens: openai.Int(tokens),
	}
	if i%2 == 0 {
		_, err := client.Chat.Completions.New(ctx, params)
		return err
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if text.Len() == 0 {
		return io.ErrUnexpectedEOF
	}
	return nil
}
