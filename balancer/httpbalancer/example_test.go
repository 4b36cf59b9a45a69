package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// Wrap an http.Client: the URL's host is a logical name, and each request
// goes to the endpoint the balancer picks.
func ExampleNewTransport() {
	var endpoints []inferlb.Endpoint
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, `{"backend":%d}`, i)
		}))
		defer srv.Close()
		endpoints = append(endpoints, inferlb.Endpoint{Addr: srv.URL})
	}
	// Base left nil: the Transport's own clone of http.DefaultTransport,
	// tuned for model servers, whose idle connections Close closes.
	t, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: endpoints})
	if err != nil {
		panic(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}

	for i := range 4 {
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"question %d"}]}`, i)
		resp, err := client.Post("http://llm.internal/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // the call ends, and is reported, here
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	var picks uint64
	for _, s := range t.Balancer().Stats() {
		picks += s.Picks
	}
	fmt.Println("picks:", picks)
	// Output:
	// 200 OK
	// 200 OK
	// 200 OK
	// 200 OK
	// picks: 4
}

// Follow a Kubernetes headless service (one A record per ready pod): the
// Transport re-resolves the name every Interval, and a scrape Source that
// lists t.Endpoints() each round follows the same pods.
func ExampleDiscovery() {
	t, err := httpbalancer.NewTransport(httpbalancer.Options{
		Discovery: &httpbalancer.Discovery{
			Target:  "vllm.inference.svc.cluster.local:8000",
			Network: "ip4", // in a dual-stack cluster, one endpoint per pod
			Labels:  map[string]string{"model": "llama-3-8b"},
			// LookupHost nil is the system resolver; a fixed answer here.
			LookupHost: func(ctx context.Context, host string) ([]string, error) {
				return []string{"10.0.0.6", "10.0.0.5", "fd00::5"}, nil
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.Close()

	src := &modelserver.Source{Targets: func() []modelserver.Target {
		var ts []modelserver.Target
		for _, e := range t.Endpoints() {
			ts = append(ts, modelserver.Target{EndpointID: e.Key(), URL: "http://" + e.Addr + "/metrics"})
		}
		return ts
	}}
	targets := src.Targets()
	slices.SortFunc(targets, func(a, b modelserver.Target) int { return strings.Compare(a.EndpointID, b.EndpointID) })
	for _, tg := range targets {
		fmt.Println(tg.EndpointID, tg.URL)
	}
	// A telemetry.Poller over src, publishing into t.Balancer(), then
	// scrapes the pods Discovery found.

	// Output:
	// 10.0.0.5:8000 http://10.0.0.5:8000/metrics
	// 10.0.0.6:8000 http://10.0.0.6:8000/metrics
}

// Start empty and take the endpoints from Update (a config watcher's
// answers, say). Until the first Update every call fails at once with
// balancer.ErrNoEndpoints; an Update with bad entries applies the rest and
// names each bad one by its index.
func ExampleTransport_Update() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"object":"chat.completion"}`)
	}))
	defer srv.Close()

	t, err := httpbalancer.NewTransport(httpbalancer.Options{})
	if err != nil {
		panic(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}
	call := func() {
		resp, err := client.Post("http://llm.internal/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			fmt.Println("no endpoints yet:", errors.Is(err, balancer.ErrNoEndpoints))
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	call()

	err = t.Update([]inferlb.Endpoint{
		{ID: "vllm-0", Addr: srv.URL},
		{ID: "vllm-1", Addr: "10.0.0.7"}, // no port: skipped
	})
	fmt.Println(err)
	for _, e := range t.Endpoints() {
		fmt.Println("routing to", e.ID)
	}
	call()
	// Output:
	// no endpoints yet: true
	// inferlb: endpoint 1 ("vllm-1"): Addr "10.0.0.7" is not host:port or http(s)://host[:port] (no port: give one, "10.0.0.7:<port>", or a scheme for its default, "http://10.0.0.7"); skipped
	// routing to vllm-0
	// 200 OK
}

// A session header (Options.SessionHeader, default X-Session-Id) keeps a
// conversation's turns on one endpoint, where its prefix is cached; a
// tenant header (Options.TenantHeader, default X-Tenant-Id) confines a
// tenant to its shard of BalancerOptions.TenantShardSize endpoints. Both
// are taken as sent: a gateway sets them from the authenticated caller.
func ExampleOptions_sessionAndTenant() {
	served := map[string]map[string]bool{} // header value -> backends
	var mu sync.Mutex
	var endpoints []inferlb.Endpoint
	for i := range 4 {
		name := fmt.Sprintf("vllm-%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			for _, k := range []string{r.Header.Get("X-Session-Id"), r.Header.Get("X-Tenant-Id")} {
				if k != "" {
					if served[k] == nil {
						served[k] = map[string]bool{}
					}
					served[k][name] = true
				}
			}
			mu.Unlock()
			fmt.Fprint(w, `{"object":"chat.completion"}`)
		}))
		defer srv.Close()
		endpoints = append(endpoints, inferlb.Endpoint{ID: name, Addr: srv.URL})
	}
	t, err := httpbalancer.NewTransport(httpbalancer.Options{
		Endpoints:       endpoints,
		BalancerOptions: balancer.Options{AffinitySeed: 7355608, TenantShardSize: 2},
	})
	if err != nil {
		panic(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}

	send := func(header, value string, turn int) {
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"turn %d"}]}`, turn)
		req, err := http.NewRequest("POST", "http://llm.internal/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(header, value)
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for turn := range 20 {
		send("X-Session-Id", "conversation-42", turn)
		send("X-Tenant-Id", "team-a", turn)
	}
	fmt.Println("backends of the session:", len(served["conversation-42"]))
	fmt.Println("backends of the tenant, at most 2:", len(served["team-a"]) <= 2)
	// Output:
	// backends of the session: 1
	// backends of the tenant, at most 2: true
}
