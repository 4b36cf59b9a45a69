package httpbalancer_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

type timed struct {
	base http.RoundTripper
	d    time.Duration
	last *http.Request
}

func (t *timed) RoundTrip(r *http.Request) (*http.Response, error) {
	s := time.Now()
	resp, err := t.base.RoundTrip(r)
	t.d += time.Since(s)
	t.last = r
	return resp, err
}

func TestZZTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchReply)
	}))
	defer srv.Close()
	const n = 3000
	do := func(c *http.Client, url string) time.Duration {
		start := time.Now()
		for range n {
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(benchChat))
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return time.Since(start) / n
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	noop := httpbalancer.InspectorFunc(func(*http.Request, []byte, bool, *httpbalancer.Info) {})
	cfgs := map[string]httpbalancer.Options{
		"default":          {},
		"nopeek":           {MaxPeek: -1},
		"noinspect":        {Inspector: noop},
		"nopeek+noinspect": {MaxPeek: -1, Inspector: noop},
	}
	for range 2 {
		base := http.DefaultTransport.(*http.Transport).Clone()
		tb := &timed{base: base}
		d := do(&http.Client{Transport: tb}, srv.URL+"/v1/chat/completions")
		t.Logf("bare: %v/op, base %v/op", d, tb.d/n)
		base.CloseIdleConnections()
		for name, o := range cfgs {
			base2 := http.DefaultTransport.(*http.Transport).Clone()
			tb2 := &timed{base: base2}
			o.Endpoints = []inferlb.Endpoint{{Addr: addr}}
			o.Base = tb2
			tr, _ := httpbalancer.NewTransport(o)
			d = do(&http.Client{Transport: tr}, chatURL)
			t.Logf("%s: %v/op, base %v/op", name, d, tb2.d/n)
			base2.CloseIdleConnections()
		}
	}
}
