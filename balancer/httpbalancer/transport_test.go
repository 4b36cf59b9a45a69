package httpbalancer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

func TestOptionsValidation(t *testing.T) {
	shared := balancer.New(balancer.Options{})
	for _, tc := range []struct {
		name string
		o    httpbalancer.Options
		want string // substring of the error; "" means valid
	}{
		{"zero", httpbalancer.Options{}, ""},
		{"endpoints", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "https://h:8443/"}}}, ""},
		{"bad addr", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "ftp://h:1"}}}, `Addr "ftp://h:1"`},
		{"addr with path", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://h:1/v1"}}}, "not host:port"},
		{"empty addr", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{ID: "a"}}}, `Options.Endpoints[0] ("a")`},
		// A forgotten port dialed port 80; a typo in one failed only at dial time.
		{"no port", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "127.0.0.1"}}}, `Addr "127.0.0.1" is not host:port`},
		{"port not a number", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.5:800O"}}}, `Addr "10.0.0.5:800O"`},
		// A forgotten host (an unset variable in HOST+":8000") dialed this
		// machine.
		{"no host", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: ":8000"}}}, `Addr ":8000" is not host:port`},
		{"no host with a scheme", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://:8000"}}}, `Addr "http://:8000"`},
		{"empty brackets", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "[]:8000"}}}, `Addr "[]:8000"`},
		{"empty brackets without port", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "https://[]"}}}, `Addr "https://[]"`},
		{"port out of range", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://h:70000"}}}, `Addr "http://h:70000"`},
		{"bare IPv6 without port", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://fd00::1"}}}, `Addr "http://fd00::1"`},
		{"bracketed IPv6 with a scheme", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://[fd00::1]"}, {Addr: "[fd00::2]:8000"}}}, ""},
		// Options.Endpoints lists the forms: a scheme in either case, no
		// query, no user information.
		{"scheme in upper case", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "HTTPS://h"}}}, ""},
		// An OpenAI client's base URL, path and all, is the usual mistake:
		// the error says where the path goes.
		{"addr with a path", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://10.0.0.5:8000/v1"}}}, `Addr "http://10.0.0.5:8000/v1" is not host:port or http(s)://host[:port] ("/v1": an endpoint names a server only; each call keeps its request URL's path, so a base path such as /v1 goes in the client's base URL)`},
		// A scheme missing its colon read as a host "http" and a path, and
		// the error spoke of base paths; a port past 65535 got no reason.
		{"scheme without its colon", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http//10.0.0.5:8000"}}}, `Addr "http//10.0.0.5:8000" is not host:port or http(s)://host[:port] (a scheme ends in "://": "http://10.0.0.5:8000")`},
		{"port out of range, with its reason", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.5:99999"}}}, `Addr "10.0.0.5:99999" is not host:port or http(s)://host[:port] (port 99999 is not in 1-65535)`},
		{"addr with a query", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://h:1?x=1"}}}, `Addr "http://h:1?x=1"`},
		{"addr with user information", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "http://u:p@h:1"}}}, `Addr "http://u:p@h:1"`},
		// Refused as a whole, whatever the part says.
		{"duplicate ID", httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "h:1"}, {Addr: "h:1"}}}, `Options.Endpoints[1]: duplicate ID "h:1" (Options.Endpoints[0]'s`},
		{"both balancers", httpbalancer.Options{Balancer: shared, BalancerOptions: balancer.Options{ErrorAlpha: 0.5}}, "Options.BalancerOptions: must be zero"},
		{"bad balancer options", httpbalancer.Options{BalancerOptions: balancer.Options{ErrorAlpha: 2}}, "inferlb: httpbalancer.Options.BalancerOptions.ErrorAlpha = 2: must be in [0, 1]"},
		{"discovery target", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc"}}, "Options.Discovery.Target"},
		{"discovery scheme", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:80", Scheme: "grpc"}}, "Options.Discovery.Scheme"},
		{"discovery interval", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:80", Interval: -time.Second}}, "Options.Discovery.Interval"},
		{"session header", httpbalancer.Options{SessionHeader: "X Session"}, "Options.SessionHeader"},
		{"session header with NUL", httpbalancer.Options{SessionHeader: "X-Session\x00"}, "Options.SessionHeader"},
		{"session header with a slash", httpbalancer.Options{SessionHeader: "X/Session"}, "Options.SessionHeader"},
		{"tenant header not ASCII", httpbalancer.Options{TenantHeader: "X-Organización"}, "Options.TenantHeader"},
		{"discovery port 0", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:0"}}, "Options.Discovery.Target"},
		{"discovery port not a port", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:notaport"}}, "Options.Discovery.Target"},
		{"discovery interval of 1ns", httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:80", Interval: 1}}, "Options.Discovery.Interval"},
		{"max peek", httpbalancer.Options{MaxPeek: httpbalancer.MaxMaxPeek + 1}, "Options.MaxPeek"},
		// A typed nil in the interface (var b *http.Transport; if ... { b = ... })
		// was taken, and every call panicked.
		{"nil *http.Transport Base", httpbalancer.Options{Base: (*http.Transport)(nil)}, "Options.Base = (*http.Transport)(nil)"},
		{"nil *OpenAI Inspector", httpbalancer.Options{Inspector: (*httpbalancer.OpenAI)(nil)}, "Options.Inspector = (*httpbalancer.OpenAI)(nil)"},
		{"nil InspectorFunc", httpbalancer.Options{Inspector: httpbalancer.InspectorFunc(nil)}, "Options.Inspector"},
		// The zero Keyer (new(cache.Keyer)) keys on 0 characters of the
		// prompt with seed 0: every call of a model got one key, so a
		// fleet's traffic piled onto one endpoint per model.
		{"zero Keyer", httpbalancer.Options{Keyer: new(cache.Keyer)}, "Options.Keyer"},
		{"Keyer from NewKeyer", httpbalancer.Options{Keyer: cache.NewKeyer(7).WithDepth(256)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := httpbalancer.NewTransport(tc.o)
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, tr.Close())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "inferlb: "), err.Error())
			for line := range strings.SplitSeq(err.Error(), "\n") {
				assert.Equal(t, 1, strings.Count(line, "inferlb: "), "one prefix a line: %s", line)
			}
		})
	}
}

// TestNewTransportNamesAnOutOfRangeWeight: an out-of-range Weight fails
// NewTransport as a whole, as any bad entry does. The error once said
// Update "would apply the valid endpoints and skip these", though such an
// endpoint is applied with the Weight corrected (1 for a negative one,
// MaxWeight above it); now it names the entry and its Weight, and says
// nothing of what Update would do, since nothing was made.
func TestNewTransportNamesAnOutOfRangeWeight(t *testing.T) {
	for _, tc := range []struct {
		w    float64
		want string
	}{
		{-1, `inferlb: NewTransport: Options.Endpoints[0] ("10.0.0.1:8000"): Weight -1 is not a finite non-negative number`},
		{math.NaN(), `inferlb: NewTransport: Options.Endpoints[0] ("10.0.0.1:8000"): Weight NaN is not a finite non-negative number`},
		{balancer.MaxWeight * 2, `inferlb: NewTransport: Options.Endpoints[0] ("10.0.0.1:8000"): Weight 2e+06 is above MaxWeight (1e+06)`},
	} {
		_, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000", Weight: tc.w}}})
		require.EqualError(t, err, tc.want)
	}
}

// TestNewTransportErrorNamesEachEntry: NewTransport's error for bad
// Endpoints read "inferlb: NewTransport: Options.Endpoints: no Transport
// was made (Update would skip the entries reported skipped, ...):
// inferlb: endpoint 1 ("ftp://x"): Addr ...; skipped", a doubled prefix,
// and "skipped" though nothing was made. Each problem is now one line
// naming the entry by its field, Options.Endpoints[i]; Update's error for
// the same list still says what it skipped and corrected, and applies the
// rest.
func TestNewTransportErrorNamesEachEntry(t *testing.T) {
	_, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:80"}, {Addr: "ftp://x"}}})
	require.EqualError(t, err, `inferlb: NewTransport: Options.Endpoints[1] ("ftp://x"): Addr "ftp://x" is not host:port or http(s)://host[:port] (scheme "ftp" is neither http nor https)`)

	eps := []inferlb.Endpoint{
		{ID: "a", Addr: "10.0.0.5:8000"},
		{ID: "b", Addr: "http://10.0.0.5:8000/"},
		{Addr: "10.0.0.1"},
		{ID: "w", Addr: "10.0.0.2:8000", Weight: -1},
		{ID: "a", Addr: "10.0.0.3:8000"},
	}
	_, err = httpbalancer.NewTransport(httpbalancer.Options{Endpoints: eps})
	require.EqualError(t, err, strings.Join([]string{
		`inferlb: NewTransport: Options.Endpoints[1] ("b"): Addr "http://10.0.0.5:8000/" names the server of Options.Endpoints[0] ("a", Addr "10.0.0.5:8000"), as both are 10.0.0.5:8000: list each server once`,
		`inferlb: NewTransport: Options.Endpoints[2] ("10.0.0.1"): Addr "10.0.0.1" is not host:port or http(s)://host[:port] (no port: give one, "10.0.0.1:<port>", or a scheme for its default, "http://10.0.0.1")`,
		`inferlb: NewTransport: Options.Endpoints[3] ("w"): Weight -1 is not a finite non-negative number`,
		`inferlb: NewTransport: Options.Endpoints[4]: duplicate ID "a" (Options.Endpoints[0]'s)`,
	}, "\n"))

	tr := newTransport(t, httpbalancer.Options{})
	err = tr.Update(eps)
	require.EqualError(t, err, strings.Join([]string{
		`inferlb: endpoint 1 ("b"): Addr "http://10.0.0.5:8000/" names the server of endpoint 0 ("a", Addr "10.0.0.5:8000"), as both are 10.0.0.5:8000: list each server once; skipped`,
		`inferlb: endpoint 2 ("10.0.0.1"): Addr "10.0.0.1" is not host:port or http(s)://host[:port] (no port: give one, "10.0.0.1:<port>", or a scheme for its default, "http://10.0.0.1"); skipped`,
		`inferlb: endpoint 3 ("w"): Weight -1 is not a finite non-negative number; using 1`,
		`inferlb: endpoint 4: duplicate ID "a" (endpoint 0's); skipped`,
	}, "\n"))
	var got []string
	for _, e := range tr.Endpoints() {
		got = append(got, fmt.Sprintf("%s %s %v", e.Key(), e.Addr, e.Weight))
	}
	assert.Equal(t, []string{"a 10.0.0.5:8000 0", "w 10.0.0.2:8000 1"}, got, "the rest applied, the Weight corrected")
}

// TestUpdateWeightErrorGivesTheCallersIndex: the Balancer named an
// entry with an out-of-range Weight by its ID alone ("endpoint \"w\""),
// with no index in the list the caller gave Update; the Transport names
// it by that index, as it does every other problem.
func TestUpdateWeightErrorGivesTheCallersIndex(t *testing.T) {
	for _, shared := range []bool{false, true} {
		o := httpbalancer.Options{}
		if shared {
			o.Balancer = balancer.New(balancer.Options{})
			defer o.Balancer.Close()
			o.Endpoints = []inferlb.Endpoint{}
		}
		tr := newTransport(t, o)
		err := tr.Update([]inferlb.Endpoint{
			{ID: "bad", Addr: "10.0.0.2"}, // no port: skipped
			{ID: "w", Addr: "10.0.0.3:8000", Weight: balancer.MaxWeight + 1},
		})
		require.EqualError(t, err, strings.Join([]string{
			`inferlb: endpoint 0 ("bad"): Addr "10.0.0.2" is not host:port or http(s)://host[:port] (no port: give one, "10.0.0.2:<port>", or a scheme for its default, "http://10.0.0.2"); skipped`,
			`inferlb: endpoint 1 ("w"): Weight 1.000001e+06 is above MaxWeight (1e+06); using 1e+06`,
		}, "\n"), "shared %v", shared)
		var w float64
		for _, s := range tr.Balancer().Stats() {
			if s.ID == "w" {
				w = s.Weight
			}
		}
		assert.Equal(t, float64(balancer.MaxWeight), w, "shared %v: applied with the Weight corrected", shared)
	}
}

// TestDistribution: sequential calls over one keep-alive client spread over
// all backends, because the pick is per request, not per connection.
func TestDistribution(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	// Each call has its own affinity key: a fixed AffinitySeed (the default
	// is random per process) and a fake clock make the spread the same in
	// every run, as the scripted Rand alone did not (a backend got as few
	// as 67 of the 300 calls, against a bound of 60).
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(a, b, c),
		BalancerOptions: balancer.Options{
			Clock:        testutil.NewClock(),
			Rand:         testutil.NewRand(1),
			AffinitySeed: 1,
		},
	})
	client := &http.Client{Transport: tr}
	const n = 300
	for i := range n {
		resp, _ := post(t, client, chatBody(i, false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	for _, be := range []*backend{a, b, c} {
		t.Logf("%s: %d", be.name, be.hits.Load())
		assert.Greater(t, be.hits.Load(), int64(n/5), "backend %s", be.name)
	}
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestRequestNotMutated: the caller's request, URL and headers are the same
// after RoundTrip, also with a header added for load reports.
func TestRequestNotMutated(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a), LoadReports: true})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	before := *req
	beforeURL := *req.URL
	beforeHeader := req.Header.Clone()
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, beforeURL, *req.URL)
	assert.Equal(t, beforeHeader, req.Header)
	assert.Equal(t, before.Host, req.Host)
	assert.Equal(t, before.ContentLength, req.ContentLength)
	assert.Equal(t, "llm.internal", req.URL.Host)
}

// TestHostAndScheme: the endpoint's address (and scheme, when it has one)
// replaces the logical host; the backend sees its own address as Host
// unless the caller set a different Host explicitly.
func TestHostAndScheme(t *testing.T) {
	hosts := make(chan string, 2)
	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
	}))
	defer tls.Close()
	base := tls.Client().Transport.(*http.Transport)
	defer base.CloseIdleConnections()
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{Addr: tls.URL}}, // "https://127.0.0.1:port"
		Base:      base,
	})
	client := &http.Client{Transport: tr}
	resp, err := client.Get("http://llm.internal/v1/models")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, strings.TrimPrefix(tls.URL, "https://"), <-hosts)

	req, _ := http.NewRequest(http.MethodGet, "http://llm.internal/v1/models", nil)
	req.Host = "vhost.example"
	resp, err = client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "vhost.example", <-hosts)
}

// TestOpaqueURLNamesTheEndpoint: a URL whose Opaque is "//host/path" (how
// net/http sends a path as escaped, "/a%2Fb") is sent in absolute form, its
// authority in the request line, which a server takes over the Host
// header. The logical host stayed there: the endpoint was asked for
// "http://llm.internal/...", and a Go server (or an ingress routing by
// host) saw Host llm.internal. The authority names the endpoint, and the
// escaped path arrives as written.
func TestOpaqueURLNamesTheEndpoint(t *testing.T) {
	type seen struct{ uri, host string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.RequestURI, r.Host}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: addr}}})
	for _, opaque := range []string{"//llm.internal/v1/models/a%2Fb", "//llm.internal:8080/v1/models/a%2Fb?x=1"} {
		req, err := http.NewRequest(http.MethodGet, "http://llm.internal/v1/models", nil)
		require.NoError(t, err)
		req.URL.Opaque = opaque
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		s := <-got
		assert.Equal(t, addr, s.host, opaque)
		assert.True(t, strings.HasPrefix(s.uri, "http://"+addr+"/v1/models/a%2Fb"), "%s: %s", opaque, s.uri)
		assert.True(t, strings.HasPrefix(req.URL.Opaque, "//llm.internal"), "the caller's URL is not modified")
	}
}

// TestDoneEndings: the outcome is reported exactly once, when the body ends
// and not when headers arrive, for every way a body can end.
func TestDoneEndings(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Query().Get("end") {
		case "eof", "close":
			w.Header().Set("Content-Type", "text/event-stream")
			for range 3 {
				fmt.Fprint(w, "data: {}\n\n")
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
		case "cancel":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "readerr":
			// Promise 100 bytes, send 10, then drop the connection.
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, "0123456789")
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		case "500":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "429":
			w.Header().Set("Retry-After", "7")
			http.Error(w, "busy", http.StatusTooManyRequests)
		case "204":
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	defer close(release)

	type want struct {
		successes, failures, overloads uint64
		events                         int
		canceled                       bool
	}
	for _, tc := range []struct {
		end  string
		read func(t *testing.T, resp *http.Response, cancel context.CancelFunc)
		want want
	}{
		{"eof", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			_, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
		}, want{successes: 1, events: 3}},
		{"close", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			_, err := resp.Body.Read(make([]byte, 1))
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
		}, want{successes: 1}},
		{"cancel", func(t *testing.T, resp *http.Response, cancel context.CancelFunc) {
			buf := make([]byte, 64)
			_, err := resp.Body.Read(buf) // the first event
			require.NoError(t, err)
			cancel()
			_, err = io.ReadAll(resp.Body)
			require.ErrorIs(t, err, context.Canceled)
			require.NoError(t, resp.Body.Close())
		}, want{events: 1, canceled: true}},
		{"readerr", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			_, err := io.ReadAll(resp.Body)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			_ = resp.Body.Close()
		}, want{failures: 1}},
		{"500", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			_, _ = io.ReadAll(resp.Body)
			require.NoError(t, resp.Body.Close())
		}, want{failures: 1}},
		{"429", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			require.NoError(t, resp.Body.Close())
		}, want{overloads: 1}},
		{"204", func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
			require.NoError(t, resp.Body.Close())
		}, want{successes: 1}},
	} {
		t.Run(tc.end, func(t *testing.T) {
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
				OnResult:  res.on,
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL+"?end="+tc.end, strings.NewReader(chatBody(1, false)))
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			if tc.end != "204" {
				assert.EqualValues(t, 1, totalInFlight(tr.Balancer()), "Done must wait for the body, not the headers")
			}
			tc.read(t, resp, cancel)
			_ = resp.Body.Close() // a second Close must not report again
			_, _ = resp.Body.Read(make([]byte, 1))

			st := statsByID(tr.Balancer())["e"]
			assert.Zero(t, st.InFlight)
			assert.Equal(t, tc.want.successes, st.Successes, "successes")
			assert.Equal(t, tc.want.failures, st.Failures, "failures")
			assert.Equal(t, tc.want.overloads, st.Overloads, "overloads")
			require.EqualValues(t, 1, res.n.Load(), "OnResult calls")
			r := <-res.c
			assert.Equal(t, tc.want.events, r.Events)
			assert.Equal(t, tc.want.canceled, r.Outcome.Canceled(), "canceled: %v", r.Outcome.Err)
			if tc.end == "429" {
				assert.Equal(t, 7*time.Second, r.Outcome.RetryAfter)
				assert.False(t, st.ExcludedUntil.IsZero(), "cooled down")
			}
			if tc.end == "500" {
				var se *httpbalancer.StatusError
				require.ErrorAs(t, r.Outcome.Err, &se)
				assert.Equal(t, 500, se.StatusCode)
			}
		})
	}
}

// TestStreamTiming: TTFT, event count and the gap between tokens come from
// the SSE data events as they arrive, on the transport's clock.
func TestStreamTiming(t *testing.T) {
	clock := testutil.NewClock()
	step := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		clock.Advance(90 * time.Millisecond) // to the headers
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i := range 4 {
			<-step
			// Split an event across writes to test the line scanner.
			fmt.Fprintf(w, ": keep-alive\n\nevent: x\nda")
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, "ta: {\"i\":%d}\r\n\r\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		BalancerOptions: balancer.Options{Clock: clock},
		OnResult:        res.on,
	})
	req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	// Each event is read before the clock moves: 100ms to the first (10ms
	// after the headers: a reader that late still times it, see
	// TestLateReaderFirstToken), then 10ms apart.
	buf := make([]byte, 1)
	var got bytes.Buffer
	for i := range 4 {
		clock.Advance(10 * time.Millisecond)
		step <- struct{}{}
		want := fmt.Sprintf("{\"i\":%d}\r\n\r\n", i)
		for !strings.HasSuffix(got.String(), want) {
			n, err := resp.Body.Read(buf)
			require.NoError(t, err)
			got.Write(buf[:n])
		}
	}
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.Equal(t, 4, r.Events)
	assert.Equal(t, 4, r.Outcome.OutputTokens)
	assert.Equal(t, 100*time.Millisecond, r.Outcome.TTFT)
	assert.Equal(t, 10*time.Millisecond, r.TimeBetweenTokens)
	assert.Equal(t, 100*time.Millisecond, statsByID(tr.Balancer())["e"].TTFT)
	// The clock moved while the reader was out of Read, as it does for a
	// reader slower than the endpoint: its pace, not the endpoint's decode
	// speed (TestSlowReaderDecodeSpeed measures that).
	assert.Zero(t, statsByID(tr.Balancer())["e"].TimePerOutputToken)
}

// TestLoadReports: with LoadReports the transport asks for vLLM's
// endpoint-load-metrics and publishes what comes back, stamped with the
// balancer clock.
func TestLoadReports(t *testing.T) {
	clock := testutil.NewClock()
	asked := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- r.Header.Get("Endpoint-Load-Metrics-Format")
		w.Header().Set("Endpoint-Load-Metrics", "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=3")
		fmt.Fprint(w, "{}")
	}))
	defer srv.Close()
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		BalancerOptions: balancer.Options{Clock: clock},
		LoadReports:     true,
	})
	post(t, &http.Client{Transport: tr}, chatBody(1, false))
	assert.Equal(t, "text", <-asked)
	s, ok := tr.Balancer().Telemetry().Latest("e", clock.Now(), time.Minute)
	require.True(t, ok)
	kv, _ := s.Get(telemetry.KVCacheUsage)
	waiting, _ := s.Get(telemetry.Waiting)
	assert.Equal(t, 0.5, kv)
	assert.Equal(t, 3.0, waiting)
	assert.True(t, clock.Now().Equal(s.Time), "stamped with the balancer clock: %v", s.Time)
}

// TestRetryAfterDate: an HTTP-date Retry-After on a 503 is an overload for
// the time until that date.
func TestRetryAfterDate(t *testing.T) {
	clock := testutil.NewClock()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", clock.Now().Add(5*time.Second).Format(http.TimeFormat))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		BalancerOptions: balancer.Options{Clock: clock},
		OnResult:        res.on,
	})
	resp, _ := post(t, &http.Client{Transport: tr}, "{}")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	r := <-res.c
	assert.True(t, r.Outcome.Overloaded)
	assert.Equal(t, 5*time.Second, r.Outcome.RetryAfter)
}

// TestRetryAfterMs: the millisecond hint of Azure OpenAI and other
// OpenAI-compatible gateways, retry-after-ms, is the cooldown, before
// Retry-After, as the OpenAI SDKs read it: they retry after 250 ms, and
// the endpoint is back by then. Read as it was before, a 429 with it alone
// cooled the endpoint down for DefaultCooldown (1 s), with Retry-After: 7
// too for 7 s; a 503 with it alone was a failure. One that is no valid
// number leaves Retry-After the hint. A Retry-After of seconds with a
// fraction, which some gateways send and the SDKs wait for as such, is
// the hint and the cooldown too: 1.5 s, not the default second, as it was
// when only whole seconds were read.
func TestRetryAfterMs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		code       int
		ms, secs   string // "" for none
		hint, cool time.Duration
	}{
		{"alone", 429, "250", "", 250 * time.Millisecond, 250 * time.Millisecond},
		{"before Retry-After", 429, "250", "7", 250 * time.Millisecond, 250 * time.Millisecond},
		{"fractional", 429, "250.5", "7", 250*time.Millisecond + 500*time.Microsecond, 250*time.Millisecond + 500*time.Microsecond},
		{"503", 503, "250", "", 250 * time.Millisecond, 250 * time.Millisecond},
		{"529", 529, "250", "", 250 * time.Millisecond, 250 * time.Millisecond},
		{"malformed", 429, "soon", "7", 7 * time.Second, 7 * time.Second},
		{"negative", 429, "-250", "7", 7 * time.Second, 7 * time.Second},
		{"malformed alone", 429, "soon", "", 0, time.Second},
		{"malformed alone 503", 503, "soon", "", 0, time.Second},
		{"Retry-After fractional, no retry-after-ms", 429, "", "1.5", 1500 * time.Millisecond, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.ms != "" {
					w.Header().Set("retry-after-ms", tc.ms)
				}
				if tc.secs != "" {
					w.Header().Set("Retry-After", tc.secs)
				}
				http.Error(w, `{"error":{"message":"busy"}}`, tc.code)
			}))
			defer srv.Close()
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
				BalancerOptions: balancer.Options{Clock: clock},
				OnResult:        res.on,
			})
			resp, _ := post(t, &http.Client{Transport: tr}, chatBody(1, false))
			assert.Equal(t, tc.code, resp.StatusCode)
			r := <-res.c
			assert.True(t, r.Outcome.Overloaded, "overloaded: %v", r.Outcome.Err)
			assert.Equal(t, tc.hint, r.Outcome.RetryAfter)
			assert.WithinDuration(t, clock.Now().Add(tc.cool), statsByID(tr.Balancer())["e"].ExcludedUntil, 0, "cooled down until")
		})
	}
}

// TestNoEndpoints: an empty fleet fails fast with the core's sentinel and
// closes the body.
func TestNoEndpoints(t *testing.T) {
	tr := newTransport(t, httpbalancer.Options{})
	body := &closeTracker{Reader: strings.NewReader("{}")}
	req, _ := http.NewRequest(http.MethodPost, chatURL, body)
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.True(t, body.closed)
}

// TestNilURL: a malformed request is an error, not a panic, and its body
// is closed.
func TestNilURL(t *testing.T) {
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:80"}}})
	body := &closeTracker{Reader: strings.NewReader("{}")}
	_, err := tr.RoundTrip(&http.Request{Method: http.MethodPost, Body: body})
	require.ErrorContains(t, err, "nil URL")
	assert.True(t, body.closed)
}

// TestCanceledBeforeSend: a dead context fails the call without sending it,
// closes the body, and reports nothing against any endpoint.
func TestCanceledBeforeSend(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	body := &closeTracker{Reader: strings.NewReader(chatBody(1, false))}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, body)
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, context.Canceled)
	assert.True(t, body.closed)
	assert.Zero(t, a.hits.Load())
	assert.Zero(t, statsByID(tr.Balancer())["a"].Picks)
}

// TestCanceledDuringPeek: a body fed by a goroutine that never finishes is
// read under the context, so cancellation ends RoundTrip.
func TestCanceledDuringPeek(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a)})
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, pr)
	go func() {
		_, _ = pw.Write([]byte(`{"model":`)) // then stall
		cancel()
	}()
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, context.Canceled)
	_, err = pw.Write([]byte("x"))
	require.ErrorIs(t, err, io.ErrClosedPipe, "the caller's body was closed")
}

// TestCanceledWithACauseBeforeSend: a context ended with a cause
// (context.WithCancelCause) before the call was sent, or while its body
// was read ahead, fails the call with that cause, as net/http's Transport
// does and as the same call gets when the cancel comes during the send.
// Both used to return context.Canceled, losing the caller's reason.
func TestCanceledWithACauseBeforeSend(t *testing.T) {
	a := newBackend(t, "a")
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a)})
	cause := errors.New("the user pressed stop")

	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	for _, ct := range []string{"application/json", "application/octet-stream"} { // read ahead, or not
		body := &closeTracker{Reader: strings.NewReader(chatBody(1, false))}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, body)
		req.Header.Set("Content-Type", ct)
		_, err := tr.RoundTrip(req)
		require.ErrorIs(t, err, cause, "canceled before the send, %s", ct)
		assert.True(t, body.closed)
	}

	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel = context.WithCancelCause(context.Background())
	defer cancel(nil)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, pr)
	go func() {
		_, _ = pw.Write([]byte(`{"model":`)) // then stall
		cancel(cause)
	}()
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, cause, "canceled while the body was read ahead")

	assert.Zero(t, a.hits.Load())
	assert.Zero(t, statsByID(tr.Balancer())["a"].Picks)
}

// TestConcurrentCloseAndRead: Close racing a blocked Read reports once
// (run with -race).
func TestConcurrentCloseAndRead(t *testing.T) {
	srv := heldStream(t, "data: {}\n\n")
	res := newResults(2)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		OnResult:  res.on,
	})
	req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.ReadAll(resp.Body) })
	require.NoError(t, resp.Body.Close())
	wg.Wait()
	assert.EqualValues(t, 1, res.n.Load())
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

// TestSharedBalancerSendsToTheTransportsOwnAddresses: a gRPC channel and
// this Transport share a Balancer and name the same replica by ID, each with
// its own port. Whichever set the Balancer's endpoints last, HTTP requests
// go to the HTTP address this Transport was given.
func TestSharedBalancerSendsToTheTransportsOwnAddresses(t *testing.T) {
	srv, hits := countingServer(t)
	b := balancer.New(balancer.Options{})
	tr := newTransport(t, httpbalancer.Options{
		Balancer:  b,
		Endpoints: []inferlb.Endpoint{{ID: "replica-0", Addr: srv.URL}},
	})
	// The other adapter's update: the same replica at its gRPC port, which
	// refuses HTTP (nothing listens on port 1).
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: "127.0.0.1:1"}}))
	client := &http.Client{Transport: tr}
	for range 5 {
		resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	assert.EqualValues(t, 5, hits.Load())
	// The Balancer itself keeps the other adapter's address, for it.
	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:1", p.Endpoint().Addr)
	p.Done(inferlb.Outcome{})
}

// TestSharedBalancerKeepsEachAdaptersEndpoints: a Transport and another
// adapter (a gRPC channel's membership) on one Balancer each route over
// their own endpoints with their own readiness, and neither's update or
// Close removes what the other lists.
func TestSharedBalancerKeepsEachAdaptersEndpoints(t *testing.T) {
	var hitsA, hitsB atomic.Int64
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsA.Add(1)
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srvA.Close()
	srvB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsB.Add(1)
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srvB.Close()
	b := balancer.New(balancer.Options{SlowStartWindow: -1}) // replica-b takes its share at once
	tr, err := httpbalancer.NewTransport(httpbalancer.Options{
		Balancer:  b,
		Endpoints: []inferlb.Endpoint{{ID: "replica-a", Addr: srvA.URL}},
	})
	require.NoError(t, err)
	defer tr.Close()
	// The gRPC side knows replica-a (at its gRPC port) and a replica of its
	// own, and cannot reach replica-a.
	grpcSide, err := b.NewMembership()
	require.NoError(t, err)
	defer grpcSide.Close()
	require.NoError(t, grpcSide.Update([]inferlb.Endpoint{{ID: "replica-a", Addr: "127.0.0.1:1"}, {ID: "grpc-only", Addr: "127.0.0.1:2"}}))
	require.True(t, grpcSide.SetReady("replica-a", false))

	client := &http.Client{Transport: tr}
	n := 0
	post := func() { // a new question each time: no affinity key pins them
		t.Helper()
		n++
		resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(n, false)))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	for range 10 {
		post() // the gRPC side's readiness does not hide replica-a here
	}
	assert.EqualValues(t, 10, hitsA.Load())

	require.NoError(t, tr.Update([]inferlb.Endpoint{{ID: "replica-a", Addr: srvA.URL}, {ID: "replica-b", Addr: srvB.URL}}))
	for range 40 {
		post()
	}
	assert.Positive(t, hitsB.Load(), "the Transport's new endpoint took no calls")
	for range 20 {
		p, err := grpcSide.Pick(&inferlb.Request{})
		require.NoError(t, err, "the Transport's update removed the gRPC side's endpoints")
		assert.Equal(t, "grpc-only", p.ID(), "the gRPC side routed to an endpoint it cannot reach or does not list")
		p.Done(inferlb.Outcome{})
	}
	assert.Len(t, b.Stats(), 3)

	require.NoError(t, tr.Close())
	ids := []string{}
	for _, s := range b.Stats() {
		ids = append(ids, s.ID)
	}
	assert.Equal(t, []string{"grpc-only", "replica-a"}, ids, "after Close only the endpoints the gRPC side lists remain")
	_, err = client.Post(chatURL, "application/json", strings.NewReader(chatBody(1, false)))
	assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
}

// TestNoEndpointForModel: a request whose model no endpoint serves fails
// with the core's sentinel and an error that names the model, so a caller
// that sent an embedding through its LLM Transport (or mistyped a model)
// sees why, not just "no endpoint available".
func TestNoEndpointForModel(t *testing.T) {
	be := newBackend(t, "llm")
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{
		{Addr: be.addr(), Labels: map[string]string{"model": "llama"}}}})
	req, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/embeddings",
		strings.NewReader(`{"model":"bge-m3","input":"x"}`))
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.Contains(t, err.Error(), `"bge-m3"`)
}

// TestTritonPathRoutesByModel: a Triton (KServe v2) request names its
// model in the path, not the body; in a fleet where each server loads
// other models, every call must reach one that has the model, with and
// without a body the peek reads.
func TestTritonPathRoutesByModel(t *testing.T) {
	llm, emb := newBackend(t, "trtllm"), newBackend(t, "bert")
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{
		{Addr: llm.addr(), Labels: map[string]string{"model": "ensemble"}},
		{Addr: emb.addr(), Labels: map[string]string{"model": "bert"}}}})
	client := &http.Client{Transport: tr}
	for i := range 20 {
		path, body, want := "/v2/models/ensemble/generate", `{"text_input":"hello","max_tokens":4}`, "trtllm"
		if i%2 == 1 {
			path, body, want = "/v2/models/bert/versions/1/infer", `{"inputs":[{"name":"t","shape":[1],"datatype":"BYTES","data":["hi"]}]}`, "bert"
		}
		resp, err := client.Post("http://triton.internal"+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, want, resp.Header.Get("X-Backend"), path)
	}
	assert.EqualValues(t, 10, llm.hits.Load())
	assert.EqualValues(t, 10, emb.hits.Load())
}

// TestNoEndpointErrorBoundsTheModel: the model named in a refused pick's
// error is request data of any size (up to MaxPeek); the error quotes a
// bounded prefix, so a client cannot make every failed call write
// megabytes into the caller's logs and error responses.
func TestNoEndpointErrorBoundsTheModel(t *testing.T) {
	be := newBackend(t, "llm")
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{
		{Addr: be.addr(), Labels: map[string]string{"model": "llama"}}}})
	model := strings.Repeat("\x80", 512<<10) // each byte quotes as \x80
	req, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/embeddings",
		strings.NewReader(`{"model":"`+model+`","input":"x"}`))
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.Less(t, len(err.Error()), 2048)
	assert.Contains(t, err.Error(), `"\x80\x80`)
}

// TestUnusableAddrBlamesNoEndpoint: a Transport routing over a shared
// Balancer's own endpoints (Options.Balancer without Endpoints) may pick an
// endpoint whose Addr another adapter set and HTTP cannot use (a gRPC
// channel's unix socket). That is a configuration error, not the
// endpoint's: the call fails naming the Addr, and the endpoint, which the
// other adapter reaches fine, keeps a clean record and a closed breaker.
func TestUnusableAddrBlamesNoEndpoint(t *testing.T) {
	b := balancer.New(balancer.Options{})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: "unix:///run/llm.sock"}}))
	tr := newTransport(t, httpbalancer.Options{Balancer: b})
	client := &http.Client{Transport: tr}
	for i := range 3 * balancer.DefaultBreakerFailures {
		_, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(i, false)))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `"unix:///run/llm.sock"`)
	}
	st := b.Stats()
	require.Len(t, st, 1)
	assert.Zero(t, st[0].Failures, "no failure counted against the endpoint")
	assert.False(t, st[0].BreakerOpen, "the other adapter still reaches it")
	assert.Zero(t, st[0].InFlight)
}

// TestNoEndpointsSaysSo: a Transport with no endpoints at all (none given
// yet, or Update emptied it) says that, and which fields or call give it
// some, not that no endpoint serves the model or each is out of rotation.
// NewTransport takes empty Options, as documented: Update fills it later,
// and the calls after that are sent.
func TestNoEndpointsSaysSo(t *testing.T) {
	tr := newTransport(t, httpbalancer.Options{})
	_, err := tr.RoundTrip(chatRequest(t, 1))
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.ErrorContains(t, err, "this Transport has none")
	assert.ErrorContains(t, err, "give it some with Options.Endpoints, Options.Discovery or Update")
	assert.NotContains(t, err.Error(), "out of rotation")

	be := newBackend(t, "llm")
	require.NoError(t, tr.Update([]inferlb.Endpoint{{Addr: be.addr()}}))
	resp, err := tr.RoundTrip(chatRequest(t, 2))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestNoEndpointForModelOnASharedBalancersSet: a Transport routing over a
// shared Balancer's own endpoints (Options.Balancer without Endpoints or
// Discovery, as documented) lists none of its own. A call for a model that
// no endpoint of that set serves was told "this Transport has none
// (Options.Endpoints empty, emptied by Update, or none found by Discovery
// yet)", sending the caller to add Endpoints that this mode must not have;
// it names the model, as for any other Transport.
func TestNoEndpointForModelOnASharedBalancersSet(t *testing.T) {
	be := newBackend(t, "llm")
	b := balancer.New(balancer.Options{})
	defer b.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "llm", Addr: be.addr(), Labels: map[string]string{"model": "llama"}}}))
	tr := newTransport(t, httpbalancer.Options{Balancer: b})
	req, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/embeddings",
		strings.NewReader(`{"model":"bge-m3","input":"x"}`))
	_, err := tr.RoundTrip(req)
	require.ErrorIs(t, err, balancer.ErrNoEndpoints)
	assert.Contains(t, err.Error(), `"bge-m3"`)
	assert.NotContains(t, err.Error(), "this Transport has none")
}

// TestDuplicateIDsGoToTheFirst: an Update listing one ID twice, with two
// addresses, is reported and the first entry applied, as the Balancer
// applies it (Pick.Endpoint reports it). A Transport with its own
// Balancer sent the ID's calls to the first address; one on a shared
// Balancer sent them to the last (its own address map kept the later
// entry), where the Balancer said the first; and Endpoints listed both,
// two telemetry targets for one ID.
func TestDuplicateIDsGoToTheFirst(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	for _, shared := range []bool{false, true} {
		o := httpbalancer.Options{Endpoints: endpointsOf(a)}
		if shared {
			o.Balancer = balancer.New(balancer.Options{})
		}
		tr := newTransport(t, o)
		err := tr.Update([]inferlb.Endpoint{{ID: "x", Addr: a.addr()}, {ID: "x", Addr: b.addr()}})
		require.ErrorContains(t, err, "duplicate ID", "shared %v", shared)
		client := &http.Client{Transport: tr}
		for i := range 4 {
			resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(i, false)))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, "a", resp.Header.Get("X-Backend"), "shared %v: the entry the Balancer kept", shared)
		}
		assert.Zero(t, b.hits.Load(), "shared %v", shared)
		eps := tr.Endpoints()
		require.Len(t, eps, 1, "shared %v: one endpoint per ID (a telemetry target each)", shared)
		assert.Equal(t, a.addr(), eps[0].Addr, "shared %v", shared)
	}
}

// TestDuplicateIDErrorGivesTheCallersIndex: Update skips an entry whose
// Addr is unusable before the Balancer sees the set, and the Balancer
// counted its duplicate-ID complaint in what it was given: with an entry
// skipped before them, the error named the entry kept ("endpoint 1") as
// the one skipped, and the caller went to fix the wrong line.
func TestDuplicateIDErrorGivesTheCallersIndex(t *testing.T) {
	for _, shared := range []bool{false, true} {
		o := httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}}
		if shared {
			o.Balancer = balancer.New(balancer.Options{})
			defer o.Balancer.Close()
		}
		tr := newTransport(t, o)
		err := tr.Update([]inferlb.Endpoint{
			{ID: "bad", Addr: "10.0.0.2"}, // no port
			{ID: "x", Addr: "10.0.0.3:8000"},
			{ID: "x", Addr: "10.0.0.4:8000"},
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `endpoint 0 ("bad")`, "shared %v", shared)
		assert.Contains(t, err.Error(), `endpoint 2: duplicate ID "x" (endpoint 1's); skipped`, "shared %v", shared)
		assert.NotContains(t, err.Error(), "endpoint 1:", "shared %v: endpoint 1 was applied", shared)
		assert.NotContains(t, err.Error(), "endpoint 1 (", "shared %v: endpoint 1 was applied", shared)
		eps := tr.Endpoints()
		require.Len(t, eps, 1, "shared %v", shared)
		assert.Equal(t, "10.0.0.3:8000", eps[0].Addr, "shared %v", shared)
	}
}

// TestSharedSetSendsToTheBalancersOwnAddresses: a Transport with no
// endpoints of its own routes over the shared Balancer's own set
// (Balancer.Update), so it sends to the addresses that set gives, even
// when another adapter's membership (a gRPC channel) describes the same
// replica, by ID, at its gRPC port after it. Before, the Transport sent to
// whichever description the Balancer had last been given: every call went
// to the gRPC port, and did so even after that membership was closed.
func TestSharedSetSendsToTheBalancersOwnAddresses(t *testing.T) {
	srv, hits := countingServer(t)
	b := balancer.New(balancer.Options{})
	defer b.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: srv.URL}}))
	tr := newTransport(t, httpbalancer.Options{Balancer: b}) // shared-set mode
	client := &http.Client{Transport: tr}
	post := func() {
		t.Helper()
		resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(1, false)))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}

	// The gRPC side names the same replica at its gRPC port (nothing
	// listens on port 1), after the Balancer's own set did.
	grpcSide, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, grpcSide.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: "127.0.0.1:1"}}))
	for range 3 {
		post()
	}
	assert.EqualValues(t, 3, hits.Load(), "calls went to another membership's address for the ID")

	// Closed, it leaves the Balancer's own description in force.
	grpcSide.Close()
	post()
	assert.EqualValues(t, 4, hits.Load())

	// The Balancer's own set moves the replica: calls follow it, and the
	// other membership's later description still does not take over.
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(100)
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv2.Close()
	require.NoError(t, tr.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: srv2.URL}}))
	other, err := b.NewMembership()
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Update([]inferlb.Endpoint{{ID: "replica-0", Addr: srv.URL}}))
	post()
	assert.EqualValues(t, 104, hits.Load(), "the call did not go to the Balancer's own set's address")
}

// countingServer is a server answering every call with {} and the count
// of calls it got; it closes at the test's end.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	hits := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}
