package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// failingBody returns its data, then fail.
type failingBody struct {
	data *strings.Reader
	fail error
}

func (b *failingBody) Read(p []byte) (int, error) {
	n, err := b.data.Read(p)
	if err == io.EOF {
		return n, b.fail
	}
	return n, err
}
func (b *failingBody) Close() error { return nil }

// TestBodyReadErrorNamesTheEndpoint: a response body that breaks mid-way
// fails with an error that names the endpoint that sent it (an
// io.ErrUnexpectedEOF alone does not say which of the backends broke),
// while errors.Is and errors.As still find the error underneath. io.EOF,
// context.Canceled and context.DeadlineExceeded are returned as they are:
// callers compare them with == (err == io.EOF; httputil.ReverseProxy's
// rerr != context.Canceled), and the context's end is not an endpoint's.
func TestBodyReadErrorNamesTheEndpoint(t *testing.T) {
	t.Run("loopback", func(t *testing.T) {
		cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, "partial")
			w.(http.Flusher).Flush()
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
		}))
		defer cut.Close()
		tr := newTransport(t, httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "gpu-7", Addr: strings.TrimPrefix(cut.URL, "http://")}},
		})
		resp, err := (&http.Client{Transport: tr}).Do(chatRequest(t, 1))
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		assert.Equal(t, "partial", string(got))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.ErrorContains(t, err, `"gpu-7"`)
		var ee *httpbalancer.EndpointError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, "gpu-7", ee.Endpoint)
	})

	opErr := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, fail := range []error{opErr, context.Canceled, context.DeadlineExceeded, io.EOF} {
		t.Run(fail.Error(), func(t *testing.T) {
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				_ = r.Body.Close()
				return &http.Response{StatusCode: 200, Body: &failingBody{strings.NewReader("{}"), fail}, Request: r}, nil
			})
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "gpu-7", Addr: "10.0.0.1:80"}},
				Base:      base,
			})
			resp, err := tr.RoundTrip(chatRequest(t, 1))
			require.NoError(t, err)
			p := make([]byte, 64)
			n, err := resp.Body.Read(p)
			require.NoError(t, err)
			assert.Equal(t, 2, n)
			_, err = resp.Body.Read(p)
			if fail == io.EOF || fail == context.Canceled || fail == context.DeadlineExceeded {
				assert.True(t, err == fail, "%v itself: %v", fail, err)
			} else {
				require.ErrorIs(t, err, fail)
				assert.ErrorContains(t, err, `"gpu-7"`)
				assert.ErrorContains(t, err, fail.Error())
				if fail == opErr {
					var ne net.Error
					require.ErrorAs(t, err, &ne)
					assert.ErrorIs(t, err, syscall.ECONNRESET)
				}
			}
			require.NoError(t, resp.Body.Close())
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}

// TestReverseProxyClientGoneIsQuiet: a gateway built on
// httputil.ReverseProxy over the Transport logs nothing when its client
// goes away mid-stream, as it logs nothing over net/http's own Transport:
// it tells a client's cancellation by err == context.Canceled.
func TestReverseProxyClientGoneIsQuiet(t *testing.T) {
	started := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"x\":1}\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer backend.Close()
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "gpu-7", Addr: strings.TrimPrefix(backend.URL, "http://")}},
	})
	var logged strings.Builder
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.Out.URL.Host = "llm.internal" },
		Transport: tr,
		ErrorLog:  log.New(&logged, "", 0),
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, proxy.URL+"/v1/chat/completions", strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	<-started
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	proxy.Close() // waits for the proxy's handler, which wrote any log
	assert.Empty(t, logged.String())
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestFailedCallNamesTheEndpoint: a call that fails before any response
// (here a server that closes the connection on every request, which
// net/http reports as a bare EOF) fails with an error that names the
// endpoint it failed on, the last one tried, while errors.Is finds the
// error underneath. A request that no endpoint is to blame for, such as
// one net/http refuses to send, fails with net/http's error as it is.
func TestFailedCallNamesTheEndpoint(t *testing.T) {
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	defer hangUp.Close()
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "gpu-7", Addr: strings.TrimPrefix(hangUp.URL, "http://")}},
		OnResult:  res.on,
	})
	_, err := (&http.Client{Transport: tr}).Do(chatRequest(t, 1))
	require.ErrorIs(t, err, io.EOF)
	assert.ErrorContains(t, err, `"gpu-7"`)
	var ee *httpbalancer.EndpointError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, "gpu-7", ee.Endpoint)
	r := <-res.c
	assert.ErrorIs(t, r.Outcome.Err, io.EOF)

	req := chatRequest(t, 2)
	req.Header.Set("X-Bad", "a\nb")
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.False(t, errors.As(err, &ee), "not the endpoint's: %v", err)
}

// timeoutErr is a timeout as net/http reports one (its "timeout awaiting
// response headers", a dial or read deadline): an error with Timeout.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "timeout awaiting response headers" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestEndpointErrorKeepsTimeouts: naming the endpoint hides no timeout.
// http.Client's *url.Error and os.IsTimeout ask the error they hold for
// Timeout by type assertion, not errors.As, so an EndpointError around a
// timeout must answer it, or the common err.(net.Error).Timeout() check
// on a client's error stops seeing timeouts.
func TestEndpointErrorKeepsTimeouts(t *testing.T) {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		_ = r.Body.Close()
		if r.URL.Query().Get("body") == "" {
			return nil, timeoutErr{}
		}
		return &http.Response{StatusCode: 200, Body: &failingBody{strings.NewReader("{}"), os.ErrDeadlineExceeded}, Request: r}, nil
	})
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "gpu-7", Addr: "10.0.0.1:80"}},
		Base:            base,
		DisableFailover: true,
	})
	client := &http.Client{Transport: tr}
	_, err := client.Do(chatRequest(t, 1))
	require.ErrorContains(t, err, `"gpu-7"`)
	ne, ok := err.(net.Error)
	require.True(t, ok)
	assert.True(t, ne.Timeout(), "url.Error.Timeout of %v", err)
	assert.True(t, os.IsTimeout(err))

	req := chatRequest(t, 2)
	req.URL.RawQuery = "body=1"
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	require.ErrorContains(t, err, `"gpu-7"`)
	assert.True(t, os.IsTimeout(err), "%v", err)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// TestBodyCanceledWithACauseNamesNoEndpoint: a caller that ends a stream
// with context.WithCancelCause (or a deadline with a cause) gets from
// net/http's body the cause, not context.Canceled; that is still the
// caller's doing, and comes back as it is, as RoundTrip returns an error
// when the context ended, not as an *EndpointError blaming the endpoint.
func TestBodyCanceledWithACauseNamesNoEndpoint(t *testing.T) {
	srv := heldStream(t, "data: {\"x\":1}\n\n")
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "gpu-7", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		OnResult:  res.on,
	})
	cause := errors.New("the user pressed stop")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, err = resp.Body.Read(make([]byte, 64))
	require.NoError(t, err)
	cancel(cause)
	_, err = io.Copy(io.Discard, resp.Body)
	require.ErrorIs(t, err, cause)
	var ee *httpbalancer.EndpointError
	assert.False(t, errors.As(err, &ee), "the caller's cancellation is not the endpoint's: %v", err)
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.True(t, r.Outcome.Canceled(), "%v", r.Outcome.Err)
}
