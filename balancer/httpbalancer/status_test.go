package httpbalancer_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestStatusClassification: what each answer tells the balancer. 429, 529
// (Anthropic's "overloaded", which gateways in front of model servers
// answer), and 503 with a Retry-After in any form, are overloads with the hint read
// from it (seconds, a fraction too, or an HTTP date; 0, for the balancer's default, when it
// is unreadable, negative or past; a day at most); other 5xx are failures,
// and so is 424, TGI's and TEI's answer when inference fails (a shard's
// CUDA error, TEI's backend error);
// other 4xx but 408 say the call was bad or not allowed: client errors,
// neither success nor failure (inferlb.Outcome.ClientError).
func TestStatusClassification(t *testing.T) {
	clock := testutil.NewClock()
	date := func(d time.Duration, layout string) string { return clock.Now().Add(d).Format(layout) }
	for _, tc := range []struct {
		code       int
		retryAfter string // "" for none
		overloaded bool
		hint       time.Duration
		failed     bool
		clientErr  bool
	}{
		{429, "", true, 0, false, false},
		{429, "7", true, 7 * time.Second, false, false},
		{429, " 7 ", true, 7 * time.Second, false, false},
		{429, "0", true, 0, false, false},
		{429, "-5", true, 0, false, false},
		{429, "1.5", true, 1500 * time.Millisecond, false, false}, // a fraction, as the OpenAI SDKs read it
		{429, "1e3", true, 0, false, false},                       // an exponent: unreadable
		{429, "soon", true, 0, false, false},
		{429, "86400", true, 24 * time.Hour, false, false},
		{429, "9999999999", true, 24 * time.Hour, false, false},
		{429, "99999999999999999999", true, 24 * time.Hour, false, false}, // past int64: still "very long"
		{429, "99999999999999999999s", true, 0, false, false},             // garbage after a number past int64: unreadable
		{429, date(5*time.Second, http.TimeFormat), true, 5 * time.Second, false, false},
		{429, date(5*time.Second, time.RFC850), true, 5 * time.Second, false, false},
		{429, date(5*time.Second, time.ANSIC), true, 5 * time.Second, false, false},
		{429, date(-time.Hour, http.TimeFormat), true, 0, false, false},
		{429, date(48*time.Hour, http.TimeFormat), true, 24 * time.Hour, false, false},
		{429, "Fri, 31 Dec 9999 23:59:59 GMT", true, 24 * time.Hour, false, false}, // past time.Duration's range
		{503, "Fri, 31 Dec 9999 23:59:59 GMT", true, 24 * time.Hour, false, false},
		{503, "", false, 0, true, false},
		{503, "3", true, 3 * time.Second, false, false},
		{503, "garbage", true, 0, false, false},
		{500, "3", false, 0, true, false},
		{502, "", false, 0, true, false},
		{504, "", false, 0, true, false},
		{424, "", false, 0, true, false},
		{529, "", true, 0, false, false},
		{529, "4", true, 4 * time.Second, false, false},
		{400, "", false, 0, false, true},
		{401, "", false, 0, false, true},
		{403, "", false, 0, false, true},
		{404, "", false, 0, false, true},
		{405, "", false, 0, false, true},
		{413, "", false, 0, false, true},
		{422, "", false, 0, false, true},
		{408, "", false, 0, false, false},
		{200, "", false, 0, false, false},
		{204, "", false, 0, false, false},
	} {
		base := baseFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{}
			if tc.retryAfter != "" {
				h.Set("Retry-After", tc.retryAfter)
			}
			return &http.Response{StatusCode: tc.code, Header: h, Body: http.NoBody, Request: r}, nil
		})
		res := newResults(1)
		tr := newTransport(t, httpbalancer.Options{
			Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}},
			Base:            base,
			BalancerOptions: balancer.Options{Clock: clock},
			OnResult:        res.on,
		})
		req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		r := <-res.c
		name := tc.retryAfter
		assert.Equal(t, tc.code, r.Status, "%d %q", tc.code, name)
		assert.Equal(t, tc.overloaded, r.Outcome.Overloaded, "%d %q: overloaded", tc.code, name)
		assert.Equal(t, tc.hint, r.Outcome.RetryAfter, "%d %q: hint", tc.code, name)
		assert.Equal(t, tc.failed, r.Outcome.Err != nil, "%d %q: failed: %v", tc.code, name, r.Outcome.Err)
		assert.Equal(t, tc.clientErr, r.Outcome.ClientError, "%d %q: client error", tc.code, name)
	}
}

// TestQueueRejectionIsAnOverload: Triton and SGLang shed load with 503 and
// no Retry-After: Triton's body {"error":"Exceeds maximum queue size"} when
// a model's queue is full, or "Request timeout expired" when a request
// waited in it past the queue policy's timeout; SGLang's "The request queue
// is full." at --max-queued-requests; Ollama's "server busy, please try
// again.  maximum pending requests exceeded" at OLLAMA_MAX_QUEUE. Read, such a body makes the 503 an
// overload answer (a cooldown at the default hint), not a failure: counted
// as failures, a busy server tripped its breaker after five. A 503 with
// another body, or whose body the caller closes unread, stays a failure;
// the caller gets every body byte for byte.
func TestQueueRejectionIsAnOverload(t *testing.T) {
	// A Triton ensemble's text behind a long ensemble name and request ID
	// (past the first 128 bytes), and one past the 512 kept.
	nested := `{"error":"in ensemble 'retrieval-augmented-generation-pipeline-llama-3-70b-instruct-fp8', [request id: 3f2b9c1e-8d4a-4f6b-9e2d-7a1c5b8e0f34] in ensemble 'llm-postprocessing', Exceeds maximum queue size"}`
	long := `{"error":"in ensemble 'ensemble', ` + strings.Repeat("x", 600) + ` Exceeds maximum queue size"}`
	for _, tc := range []struct {
		name       string
		body       string
		read       bool // the caller reads the body before closing it
		overloaded bool
	}{
		{"queue full", `{"error":"Exceeds maximum queue size"}`, true, true},
		{"queue timeout", `{"error":"Request timeout expired"}`, true, true},
		{"queue full in an ensemble", `{"error":"in ensemble 'ensemble', Exceeds maximum queue size"}`, true, true},
		{"SGLang queue full", `{"object":"error","message":"The request queue is full.","type":"Service Unavailable","param":null,"code":503}`, true, true},
		{"SGLang priority abort", `{"object":"error","message":"The request is aborted by a higher priority request.","type":"Service Unavailable","param":null,"code":503}`, true, true},
		{"Ollama queue full", `{"error":"server busy, please try again.  maximum pending requests exceeded"}`, true, true},
		{"Ollama queue full, OpenAI route", `{"error":{"message":"server busy, please try again.  maximum pending requests exceeded","type":"api_error","param":null,"code":null}}`, true, true},
		{"SGLang engine error", `{"object":"error","message":"Internal server error","type":"InternalServerError","param":null,"code":503}`, true, false},
		{"queue full in nested ensembles with a request ID", nested, true, true},
		{"queue full far into the body", long, true, false},
		{"model not ready", `{"error":"Request for unknown model: 'm' is not ready"}`, true, false},
		{"queue full, closed unread", `{"error":"Exceeds maximum queue size"}`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for n, reads := range []func(io.Reader) io.Reader{iotest.OneByteReader, iotest.HalfReader, func(r io.Reader) io.Reader { return r }} {
				base := baseFunc(func(r *http.Request) (*http.Response, error) {
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
						Body: io.NopCloser(reads(strings.NewReader(tc.body))), Request: r}, nil
				})
				res := newResults(1)
				tr := newTransport(t, httpbalancer.Options{
					Endpoints: []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}},
					Base:      base,
					OnResult:  res.on,
				})
				req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
				require.NoError(t, err)
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				if tc.read {
					got, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.Equal(t, tc.body, string(got))
				}
				require.NoError(t, resp.Body.Close())
				r := <-res.c
				assert.Equal(t, http.StatusServiceUnavailable, r.Status)
				assert.Equal(t, tc.overloaded, r.Outcome.Overloaded, "reader %d: overloaded", n)
				assert.Zero(t, r.Outcome.RetryAfter, "no hint")
				assert.Equal(t, !tc.overloaded, r.Outcome.Err != nil, "reader %d: failed: %v", n, r.Outcome.Err)
			}
		})
	}
}

// readingBody is a response body that says when its first Read has begun
// (reading) and then hands out its bytes.
type readingBody struct {
	data    string
	reading chan struct{}
	once    sync.Once
}

func (b *readingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	if b.data == "" {
		return 0, io.EOF
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

func (b *readingBody) Close() error { return nil }

// TestQueueRejectionClosedDuringRead: net/http lets a caller Close a body
// from another goroutine while a Read is under way, and the body wrapper
// promises that its Close may; a 503 whose body is being read for the
// shedding texts is no exception. The Close reports the call, reading what
// the Read kept of the body so far, and the race detector sees no race
// between the two. The outcome is reported once, whichever saw what.
func TestQueueRejectionClosedDuringRead(t *testing.T) {
	body := &readingBody{data: `{"error":"Exceeds maximum queue size"}`, reading: make(chan struct{})}
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
			Body: body, Request: r}, nil
	})
	res := newResults(2)
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}}, Base: base, OnResult: res.on})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = resp.Body.Read(make([]byte, 64)) // keeps the body's start as it returns
	}()
	<-body.reading // no ordering with what the Read does after it
	require.NoError(t, resp.Body.Close())
	<-read
	require.EqualValues(t, 1, res.n.Load())
	r := <-res.c
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.Zero(t, totalInFlight(tr.Balancer()))
}
