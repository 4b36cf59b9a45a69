package httpbalancer_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

// benchChat is a small non-streaming chat completion, as an agent or RAG
// pipeline sends by the million.
var benchChat = []byte(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":32,"temperature":0}`)

var benchReply = []byte(`{"id":"x","object":"chat.completion","created":1,"model":"llama-3-8b","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":25,"completion_tokens":2,"total_tokens":27}}`)

// benchServer answers every call with benchReply, doing as little as a
// server can, so the comparison charges the transport with everything.
func benchServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchReply)
	}))
	b.Cleanup(srv.Close)
	return srv
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

// BenchmarkInspect is the inspector alone on the benchmark's body.
func BenchmarkInspect(b *testing.B) {
	r, _ := http.NewRequest(http.MethodPost, chatURL, nil)
	in := &httpbalancer.OpenAI{Keyer: nil}
	keyed := &httpbalancer.OpenAI{Keyer: cacheKeyer()}
	for _, tc := range []struct {
		name string
		in   *httpbalancer.OpenAI
	}{{"fields", in}, {"fields+key", keyed}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var info httpbalancer.Info
			for b.Loop() {
				info = httpbalancer.Info{}
				tc.in.Inspect(r, benchChat, true, &info)
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
