package httpbalancer_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
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
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	t, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: endpoints, Base: base})
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
