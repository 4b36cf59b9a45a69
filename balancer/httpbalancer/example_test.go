package httpbalancer_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	"github.com/inferlb/inferlb"
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
