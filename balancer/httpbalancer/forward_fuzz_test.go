package httpbalancer_test

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// forwardStatuses are the answers FuzzRequestForwarded's server gives: a
// success, and those the transport reads a body of or sends a call on for
// (a refusal as too long, a model not served, an overload, a failure).
var forwardStatuses = []int{200, 400, 404, 413, 422, 429, 500, 503, 529}

// FuzzRequestForwarded: a call of any path, session and tenant header and
// body, answered with any status, body and load report, reaches the
// server as the caller made it (path, query, those headers and the body,
// byte for byte, in every attempt), the caller reads the server's answer
// byte for byte, and no call stays in flight.
func FuzzRequestForwarded(f *testing.F) {
	for _, s := range []struct {
		path, session, body string
		status              uint8
		answer, load        string
	}{
		{"/v1/chat/completions", "s1", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, 0,
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", "TEXT named_metrics.kv_cache_usage_perc=0.4"},
		{"/v1/embeddings?x=1", "", `{"model":"e","input":["a","b"]}`, 0, `{"data":[]}`, `JSON {"cpu_utilization": NaN}`},
		{"/v1/completions", "\x00\xff", `{"model":"m","prompt":"p","max_tokens":5}`, 1,
			`{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).","code":400}`, ""},
		{"/v1/chat/completions", "s", `{"model":"gone","messages":[]}`, 2, `{"error":{"message":"The model ` + "`gone`" + ` does not exist.","code":404}}`, "BIN x"},
		{"/api/chat", "t", `{"model":"llama","messages":[{"role":"user","content":"x"}]}`, 5, "Too Many Requests", "TEXT ,=,"},
		{"/generate", "", `{"inputs":"x","parameters":{"max_new_tokens":9}}`, 7, `{"error":"Model is overloaded","error_type":"overloaded"}`, ""},
		{"//x/../v1/responses", "", "\x00\xff not json", 6, "", "JSON {"},
	} {
		f.Add(s.path, s.session, []byte(s.body), s.status, []byte(s.answer), s.load)
	}
	var got [][]byte // the bodies the server got, in order
	var gotReq []*http.Request
	var answer []byte
	var status int
	var load string
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		_ = r.Body.Close()
		got, gotReq = append(got, b), append(gotReq, r)
		h := http.Header{}
		if load != "" {
			h.Set("endpoint-load-metrics", load)
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(bytes.NewReader(answer)),
			ContentLength: int64(len(answer)), Request: r}, nil
	})
	f.Fuzz(func(t *testing.T, path, session string, body []byte, st uint8, ans []byte, loadHeader string) {
		// A Transport of its own: what one call leaves (a breaker, a
		// cooldown, a remembered window) does not steer the next input.
		tr := newTransport(t, httpbalancer.Options{
			Base:          base,
			Endpoints:     []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:8000"}, {ID: "b", Addr: "10.0.0.2:8000"}},
			MaxPeek:       64,
			SessionHeader: "X-Session-Id",
			TenantHeader:  "X-Tenant",
			LoadReports:   true,
		})
		u, err := url.Parse("http://llm.internal" + path)
		if err != nil {
			return
		}
		got, gotReq, answer, load = nil, nil, ans, loadHeader
		status = forwardStatuses[int(st)%len(forwardStatuses)]
		req, err := http.NewRequest(http.MethodPost, u.String(), bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header["X-Session-Id"] = []string{session}
		req.Header["X-Tenant"] = []string{session + "-t"}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			read, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(read, ans) {
				t.Fatalf("status %d: the caller read %q (%v), the server sent %q", status, read, err, ans)
			}
			_ = resp.Body.Close()
		}
		if len(got) == 0 {
			t.Fatalf("the server got no call (%v)", err)
		}
		for i, r := range gotReq {
			if !bytes.Equal(got[i], body) {
				t.Fatalf("attempt %d: the server got %q, the caller sent %q", i, got[i], body)
			}
			if r.URL.Path != req.URL.Path || r.URL.RawPath != req.URL.RawPath || r.URL.RawQuery != req.URL.RawQuery {
				t.Fatalf("attempt %d: the server got %q, the caller sent %q", i, r.URL, req.URL)
			}
			if s, tn := r.Header["X-Session-Id"], r.Header["X-Tenant"]; len(s) != 1 || s[0] != session || len(tn) != 1 || tn[0] != session+"-t" {
				t.Fatalf("attempt %d: headers %q %q, the caller sent %q", i, s, tn, session)
			}
		}
		if n := totalInFlight(tr.Balancer()); n != 0 {
			t.Fatalf("%d calls in flight", n)
		}
	})
}
