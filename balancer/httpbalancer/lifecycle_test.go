package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/telemetry"
)

// cannedResponse is a Base that closes the request body and answers 200
// with body and the given header.
func cannedResponse(h http.Header, body string) baseFunc {
	return func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusOK, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
}

func chatRequest(t *testing.T, i int) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(i, false)))
	require.NoError(t, err)
	return req
}

// TestBaseWithNeitherResponseNorError: a Base that breaks the RoundTripper
// contract with (nil, nil) fails the call, as http.Client does, instead of
// panicking with the pick never reported (the endpoint one call busier for
// good).
func TestBaseWithNeitherResponseNorError(t *testing.T) {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, nil
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base:      base,
	})
	var err error
	require.NotPanics(t, func() { _, err = tr.RoundTrip(chatRequest(t, 1)) })
	require.ErrorContains(t, err, "nil response")
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestBaseWithResponseAndError: a Base that breaks the contract the other
// way, with a response and an error, has its error count (as http.Client
// has it) and the response's body closed: nobody else sees it, and left
// open it would hold its connection for good.
func TestBaseWithResponseAndError(t *testing.T) {
	var bodies []*closeCounter
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		b := &closeCounter{Reader: strings.NewReader("{}")}
		bodies = append(bodies, b)
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: b}, errors.New("broken base")
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base:      base,
	})
	resp, err := tr.RoundTrip(chatRequest(t, 1))
	require.ErrorContains(t, err, "broken base")
	assert.Nil(t, resp)
	require.NotEmpty(t, bodies)
	for i, b := range bodies {
		assert.Equal(t, 1, b.closed, "attempt %d's body", i)
	}
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

// callWithLoadReport makes one call through a Transport over endpoint "a"
// whose answer carries report as its endpoint-load-metrics header, reads
// the answer to its end and returns the Transport.
func callWithLoadReport(t *testing.T, report string) *httpbalancer.Transport {
	t.Helper()
	h := http.Header{}
	h.Set("Endpoint-Load-Metrics", report)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}},
		Base:      cannedResponse(h, "{}"),
	})
	resp, err := tr.RoundTrip(chatRequest(t, 1))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return tr
}

// TestMalformedLoadReportIsCounted: an endpoint-load-metrics header with
// nothing readable in it (here, a huge one) changes no telemetry and is
// counted as a dropped sample, as malformed telemetry is elsewhere.
func TestMalformedLoadReportIsCounted(t *testing.T) {
	tr := callWithLoadReport(t, "TEXT "+strings.Repeat("named_metrics.kv_cache_usage_perc=garbage,", 10000))
	st := tr.Balancer().Telemetry().Stats()
	assert.EqualValues(t, 1, st.DroppedEmpty, "%+v", st)
	assert.Zero(t, st.Accepted)
	assert.Equal(t, 1, int(statsByID(tr.Balancer())["a"].Successes), "a bad report is not the call's failure")
}

// TestPartlyMalformedLoadReportIsCounted: a header with one good field and
// one that does not parse publishes the good one and counts the sample in
// StoreStats.Partial; the bad field was dropped with nothing counted.
func TestPartlyMalformedLoadReportIsCounted(t *testing.T) {
	tr := callWithLoadReport(t, "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=lots")
	st := tr.Balancer().Telemetry().Stats()
	assert.EqualValues(t, 1, st.Partial, "%+v", st)
	assert.EqualValues(t, 1, st.Accepted, "%+v", st)
	assert.Zero(t, st.DroppedEmpty)
	s := statsByID(tr.Balancer())["a"].Telemetry
	kv, ok := s.Get(telemetry.KVCacheUsage)
	assert.True(t, ok)
	assert.Equal(t, 0.5, kv)
	assert.False(t, s.Has.Has(telemetry.Waiting))
}

// TestMalformedRequestBlamesNoEndpoint: a request net/http refuses to send
// (a header value with a line break, as a gateway copying a client's input
// into a header makes, or a header name that is not a token) fails the
// call without counting against any endpoint and without a failover: it
// used to fail twice per call, once per endpoint tried, so a client
// sending a few dozen of them opened healthy endpoints' breakers.
func TestMalformedRequestBlamesNoEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a, b)})
	client := &http.Client{Transport: tr}
	for i := range 40 {
		req := chatRequest(t, i)
		if i%2 == 0 {
			req.Header.Set("X-User", "evil\r\nInjected: 1")
		} else {
			req.Header["X User"] = []string{"x"}
		}
		_, err := client.Do(req)
		require.Error(t, err)
	}
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
		assert.False(t, s.BreakerOpen, id)
		assert.Zero(t, s.InFlight, id)
	}
	assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
	assert.Zero(t, a.hits.Load()+b.hits.Load())
}

// ctxBody is a response body that fails once its request's context ends,
// and with fail (when set) instead of EOF.
type ctxBody struct {
	ctx  context.Context
	data *strings.Reader
	fail error
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := b.data.Read(p)
	if err == io.EOF && b.fail != nil {
		return n, b.fail
	}
	return n, err
}
func (b *ctxBody) Close() error { return nil }

var errReset = errors.New("connection reset")

// mixBase answers each call as its "m" query parameter says.
func mixBase() baseFunc {
	return func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			_ = r.Body.Close()
		}
		mode := r.URL.Query().Get("m")
		h := http.Header{}
		body := &ctxBody{ctx: r.Context(), data: strings.NewReader("data: {\"x\":1}\n\ndata: {\"x\":2}\n\ndata: [DONE]\n\n")}
		h.Set("Content-Type", "text/event-stream")
		status := 200
		switch mode {
		case "err":
			return nil, errReset
		case "errresp":
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("x"))}, errReset
		case "500":
			status = 500
		case "429":
			status = 429
			h.Set("Retry-After", "1")
		case "readerr":
			body.fail = io.ErrUnexpectedEOF
		case "hdr":
			h.Set("Endpoint-Load-Metrics", "TEXT named_metrics.num_requests_waiting=1e308,named_metrics.num_requests_waiting=1e308, x")
		}
		return &http.Response{StatusCode: status, Header: h, Body: body, Request: r}, nil
	}
}

// TestInFlightReturnsToZero: whatever mix of endings calls have (EOF, an
// early Close, a cancel mid-stream, a read error, a Base error with and
// without a response, 5xx, 429, a failover, a hostile load report) while
// Updates change the endpoint set under them, on a Transport with its own
// Balancer and on one sharing a Balancer, every endpoint's in-flight calls
// and tokens come back to 0.
func TestInFlightReturnsToZero(t *testing.T) {
	shared := balancer.New(balancer.Options{})
	eps := []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}, {ID: "c", Addr: "10.0.0.3:80"}}
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps, Base: mixBase(), Balancer: shared})
	own := newTransport(t, httpbalancer.Options{Endpoints: eps, Base: mixBase()})
	modes := []string{"ok", "err", "errresp", "500", "429", "readerr", "hdr", "close", "cancel"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, x := range []*httpbalancer.Transport{tr, own} {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					_ = x.Update(eps)
					return
				default:
				}
				// {a, b} and {b, c} in turn: b stays, so its state (and
				// any count lost on it) lives through the whole run.
				_ = x.Update(eps[i%2 : i%2+2])
			}
		})
	}
	var calls sync.WaitGroup
	for w := range 8 {
		calls.Go(func() {
			for i := range 150 {
				x := tr
				if i%2 == 0 {
					x = own
				}
				mode := modes[(i+w)%len(modes)]
				ctx, cancel := context.WithCancel(context.Background())
				body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"q %d"}]}`, 10+i, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL+"?m="+mode, strings.NewReader(body))
				resp, err := x.RoundTrip(req)
				if err == nil {
					switch mode {
					case "close":
						_, _ = resp.Body.Read(make([]byte, 3))
						resp.Body.Close()
					case "cancel":
						_, _ = resp.Body.Read(make([]byte, 3))
						cancel()
						_, _ = io.ReadAll(resp.Body)
						resp.Body.Close()
					default:
						_, _ = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
				}
				cancel()
			}
		})
	}
	calls.Wait()
	close(stop)
	wg.Wait()
	for _, b := range []*balancer.Balancer{shared, own.Balancer()} {
		for _, s := range b.Stats() {
			assert.Zero(t, s.InFlight, "%s", s.ID)
			assert.Zero(t, s.InFlightTokens, "%s", s.ID)
		}
	}
}

type snapReq struct {
	Method           string
	URL              url.URL
	Header           http.Header
	Host             string
	ContentLength    int64
	TransferEncoding []string
	Trailer          http.Header
	Body             io.ReadCloser
	GetBody          uintptr
	Close            bool
	Ctx              context.Context
}

func snapshotReq(r *http.Request) snapReq {
	s := snapReq{Method: r.Method, URL: *r.URL, Header: r.Header.Clone(), Host: r.Host, ContentLength: r.ContentLength,
		TransferEncoding: append([]string(nil), r.TransferEncoding...), Trailer: r.Trailer.Clone(), Body: r.Body, Close: r.Close, Ctx: r.Context()}
	if r.URL.User != nil {
		u := *r.URL.User
		s.URL.User = &u
	}
	if r.GetBody != nil {
		s.GetBody = reflect.ValueOf(r.GetBody).Pointer()
	}
	return s
}

type opaque struct{ io.Reader }

func (opaque) Close() error { return nil }

// TestRequestNotMutatedByFailover: the caller's request keeps every field
// it had (URL, Header, Host, ContentLength, TransferEncoding, Trailer, Body,
// GetBody, context) through a failover, for each way its body is read or
// replayed, with and without the header load reports add.
func TestRequestNotMutatedByFailover(t *testing.T) {
	big := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}],"model":"m"}`
	small := chatBody(1, false)
	for _, tc := range []struct {
		name string
		mk   func() *http.Request
	}{
		{"inmem", func() *http.Request {
			r, _ := http.NewRequest("POST", chatURL, strings.NewReader(small))
			return r
		}},
		{"opaque-small-chunked", func() *http.Request {
			r, _ := http.NewRequest("POST", chatURL, opaque{strings.NewReader(small)})
			r.TransferEncoding = []string{"chunked"}
			r.Trailer = http.Header{"X-T": {"1"}}
			return r
		}},
		{"opaque-big-getbody", func() *http.Request {
			r, _ := http.NewRequest("POST", chatURL, opaque{strings.NewReader(big)})
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(big)), nil }
			r.ContentLength = -1
			return r
		}},
		{"opaque-nil-header", func() *http.Request {
			r, _ := http.NewRequest("POST", chatURL, opaque{strings.NewReader(small)})
			r.Header = nil
			return r
		}},
	} {
		for _, lr := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%v", tc.name, lr), func(t *testing.T) {
				var mu sync.Mutex
				n := 0
				base := baseFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					n++
					first := n == 1
					mu.Unlock()
					got, _ := io.ReadAll(r.Body)
					r.Body.Close()
					if first {
						return nil, errReset
					}
					if !strings.Contains(string(got), `"model":"m"`) {
						return nil, fmt.Errorf("bad body %q", got)
					}
					return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
				})
				tr := newTransport(t, httpbalancer.Options{
					Endpoints:   []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
					Base:        base,
					MaxPeek:     1024,
					LoadReports: lr,
				})
				req := tc.mk()
				before := snapshotReq(req)
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Equal(t, 2, n)
				after := snapshotReq(req)
				assert.Equal(t, before, after)
				assert.Zero(t, totalInFlight(tr.Balancer()))
			})
		}
	}
}

// TestUnsendableRequestBlamesNoEndpoint: the other requests net/http's
// Transport refuses to send (a trailer field that is not valid; a control
// character in the URL's query; a scheme other than http and https) fail
// without counting against any endpoint and without a failover, as a bad
// method or header field does: each used to fail on two endpoints per
// call.
func TestUnsendableRequestBlamesNoEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	for _, tc := range []struct {
		name string
		edit func(*http.Request)
	}{
		{"trailer name", func(r *http.Request) { r.Trailer = http.Header{"X Sum": {"1"}} }},
		{"trailer value", func(r *http.Request) { r.Trailer = http.Header{"X-Sum": {"1\r\nInjected: 1"}} }},
		{"control character in query", func(r *http.Request) {
			u := *r.URL
			u.RawQuery = "q=a\nb"
			r.URL = &u
		}},
		{"scheme", func(r *http.Request) {
			u := *r.URL
			u.Scheme = "ftp"
			r.URL = &u
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := newResults(8)
			tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a, b), OnResult: res.on})
			for i := range 4 {
				req := chatRequest(t, i)
				tc.edit(req)
				resp, err := tr.RoundTrip(req)
				if resp != nil {
					resp.Body.Close()
				}
				require.Error(t, err)
			}
			for id, s := range statsByID(tr.Balancer()) {
				assert.Zero(t, s.Failures, id)
				assert.Zero(t, s.InFlight, id)
			}
			assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
			assert.EqualValues(t, 4, res.n.Load(), "one attempt per call")
		})
	}
	assert.Zero(t, a.hits.Load()+b.hits.Load())
}

// TestNilHeaderIsSent: a request with a nil Header, which http.Client
// fills in and a direct RoundTrip call may pass, is sent as net/http's
// Transport would send it through http.Client, not refused by it after
// the pick (which counted as a failure of each endpoint tried), and the
// caller's request keeps its nil Header.
func TestNilHeaderIsSent(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a)})
	req := chatRequest(t, 1)
	req.Header = nil
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Nil(t, req.Header)
	assert.EqualValues(t, 1, statsByID(tr.Balancer())["a"].Successes)
}

// TestWrongContentLengthBlamesNoEndpoint: a body that is shorter or
// longer than the request's ContentLength is one net/http refuses to send
// ("http: ContentLength=100 with Body length 50"), on every endpoint
// alike: the call fails, once, and no endpoint is blamed.
// It used to fail on two endpoints per call. (When the server answers
// before net/http notices, as it may with the bytes it was promised,
// net/http returns the answer instead: no failure either.)
func TestWrongContentLengthBlamesNoEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a, b)})
	body := chatBody(1, false)
	for _, cl := range []int64{int64(len(body)) + 10, int64(len(body)) - 10} {
		req, err := http.NewRequest(http.MethodPost, chatURL, opaque{strings.NewReader(body)})
		require.NoError(t, err)
		req.ContentLength = cl
		resp, err := tr.RoundTrip(req)
		if err != nil {
			// "http: ContentLength=...", or the read that the
			// connection net/http closed for it broke first.
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
		assert.Zero(t, s.InFlight, id)
	}
	assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
}

// TestHTTP2RefusedRequestBlamesNoEndpoint: over HTTP/2 (an https endpoint
// and a Base that negotiates it, as http.DefaultTransport does), net/http
// also refuses connection-specific header fields, which HTTP/2 forbids: an
// Upgrade (curl --http2 sends "Upgrade: h2c" on a cleartext URL, and a
// gateway copying a client's headers passes it on), a Connection other
// than close or keep-alive, a Transfer-Encoding other than chunked; and a
// Host header or trailer field its HTTP/2 client refuses. Such a call
// fails once and blames no endpoint; it used to fail on two.
func TestHTTP2RefusedRequestBlamesNoEndpoint(t *testing.T) {
	var eps []inferlb.Endpoint
	var base http.RoundTripper
	for _, name := range []string{"a", "b"} {
		b := &backend{name: name}
		b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.fakeChat))
		b.srv.EnableHTTP2 = true
		b.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut short at Close
		b.srv.StartTLS()
		t.Cleanup(b.srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: name, Addr: b.srv.URL})
		base = b.srv.Client().Transport // the test certificate is the same for both
	}
	t.Cleanup(base.(*http.Transport).CloseIdleConnections)
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps, Base: base})
	client := &http.Client{Transport: tr}
	resp, _ := post(t, client, chatBody(0, false))
	require.Equal(t, 2, resp.ProtoMajor, "the test needs HTTP/2")
	for i, edit := range []func(*http.Request){
		func(r *http.Request) {
			r.Header["Upgrade"], r.Header["Connection"] = []string{"h2c"}, []string{"Upgrade, HTTP2-Settings"}
		},
		func(r *http.Request) { r.Header["Connection"] = []string{"foo"} },
		func(r *http.Request) { r.Header["Transfer-Encoding"] = []string{"gzip"} },
		func(r *http.Request) { r.Host = "a host" }, // HTTP/1.1 would leave it out
		func(r *http.Request) { r.Trailer = http.Header{"Content-Length": {"1"}} },
	} {
		req := chatRequest(t, i)
		edit(req)
		_, err := client.Do(req)
		require.Error(t, err, "case %d", i)
	}
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
		assert.Zero(t, s.InFlight, id)
	}
	assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
}
