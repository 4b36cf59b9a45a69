package httpbalancer_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// With more calls in flight to one endpoint than net/http keeps idle
// connections per host (2 by default), every call past the second dialed
// anew after each burst: the default Base keeps enough idle connections
// for a burst to come back on the connections of the last one.
func TestDefaultBaseKeepsABurstsConnections(t *testing.T) {
	const burst = 8
	dials := func(t *testing.T, base http.RoundTripper) int64 {
		var dialed atomic.Int64
		var mu sync.Mutex
		arrived, all := 0, make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			arrived++
			if arrived == burst { // the whole burst is in flight: answer it
				close(all)
				arrived, all = 0, make(chan struct{})
				mu.Unlock()
			} else {
				wait := all
				mu.Unlock()
				<-wait
			}
			_, _ = w.Write([]byte(`{"choices":[]}`))
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				dialed.Add(1)
			}
		}
		srv.Start()
		defer srv.Close()
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{Addr: strings.TrimPrefix(srv.URL, "http://")}},
			Base:      base,
		})
		require.NoError(t, err)
		defer func() { _ = tr.Close() }()
		if base != nil {
			defer base.(*http.Transport).CloseIdleConnections()
		}
		client := &http.Client{Transport: tr}
		for range 3 {
			var wg sync.WaitGroup
			for i := range burst {
				wg.Go(func() {
					resp, err := client.Post("http://llm.internal/v1/chat/completions", "application/json",
						strings.NewReader(chatBody(i, false)))
					if !assert.NoError(t, err) {
						return
					}
					// Read to the end: net/http returns the connection to
					// its idle pool before the read of EOF returns.
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				})
			}
			wg.Wait()
		}
		return dialed.Load()
	}
	assert.Equal(t, int64(burst), dials(t, nil), "three bursts of 8 ride on the first burst's 8 connections")
	// The pool net/http keeps by default loses 6 of 8 after each burst.
	assert.Equal(t, int64(burst+2*(burst-2)), dials(t, http.DefaultTransport.(*http.Transport).Clone()))
}
