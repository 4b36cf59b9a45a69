package httpbalancer_test

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// TestBasePanicFinishesThePick: a Base that panics (a middleware's bug, a
// mock's failed assertion) panics out of RoundTrip with its own value, and
// the pick is finished on the way out, so the endpoint is not one call
// busier for good. The panic is the caller's code, not the endpoint's:
// the endpoint is not failed, and the call is not retried elsewhere.
func TestBasePanicFinishesThePick(t *testing.T) {
	type boom struct{}
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base:      baseFunc(func(*http.Request) (*http.Response, error) { panic(boom{}) }),
		OnResult:  res.on,
	})
	for i := range 3 {
		func() {
			defer func() {
				assert.Equal(t, boom{}, recover(), "the Base's own panic value")
			}()
			_, _ = tr.RoundTrip(chatRequest(t, i))
			t.Error("RoundTrip returned")
		}()
	}
	assert.Zero(t, totalInFlight(tr.Balancer()))
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
	}
	assert.Zero(t, tr.Balancer().RetryStats().Allowed, "failed over")
	require.EqualValues(t, 3, res.n.Load(), "one result per call")
	r := <-res.c
	assert.ErrorContains(t, r.Outcome.Err, "Base panicked")
	assert.True(t, r.Outcome.Canceled(), "blames no endpoint")
	assert.False(t, r.FailedOver)
}

// TestGetBodyPanicFinishesThePick: a GetBody that panics when the
// transport replays the body for a failover panics through RoundTrip, and
// the failed attempt's pick is finished on the way out, with the
// attempt's own error.
func TestGetBodyPanicFinishesThePick(t *testing.T) {
	type boom struct{}
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			_ = r.Body.Close()
			return nil, errors.New("connection refused")
		}),
		OnResult: res.on,
	})
	req := chatRequest(t, 1)
	req.GetBody = func() (io.ReadCloser, error) { panic(boom{}) }
	func() {
		defer func() { assert.Equal(t, boom{}, recover()) }()
		_, _ = tr.RoundTrip(req)
		t.Error("RoundTrip returned")
	}()
	assert.Zero(t, totalInFlight(tr.Balancer()))
	require.EqualValues(t, 1, res.n.Load())
	r := <-res.c
	assert.False(t, r.FailedOver)
	assert.ErrorContains(t, r.Outcome.Err, "connection refused")
}

// TestBaseGoexitFinishesThePick: a Base that calls runtime.Goexit (a
// mock's t.FailNow on the RoundTrip goroutine) ends that goroutine with
// the pick finished, as a panic does.
func TestBaseGoexitFinishesThePick(t *testing.T) {
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}},
		Base:      baseFunc(func(*http.Request) (*http.Response, error) { runtime.Goexit(); return nil, nil }),
	})
	req := chatRequest(t, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = tr.RoundTrip(req)
		t.Error("RoundTrip returned")
	}()
	<-done
	assert.Zero(t, totalInFlight(tr.Balancer()))
	assert.Zero(t, statsByID(tr.Balancer())["a"].Failures)
}

// panicBody panics in Read or Close, as a mock body may.
type panicBody struct{ inRead bool }

func (b panicBody) Read([]byte) (int, error) {
	if b.inRead {
		panic("read")
	}
	return 0, io.ErrUnexpectedEOF
}

func (b panicBody) Close() error {
	if !b.inRead {
		panic("close")
	}
	return nil
}

// TestBodyPanicFinishesThePick: a response body from Base that panics in
// Read or Close panics through as it came, and the call is finished on
// the way out, blaming no endpoint, as a panicking Base is.
func TestBodyPanicFinishesThePick(t *testing.T) {
	for _, inRead := range []bool{true, false} {
		res := newResults(4)
		tr := newTransport(t, httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}},
			Base: baseFunc(func(r *http.Request) (*http.Response, error) {
				_ = r.Body.Close()
				return &http.Response{StatusCode: 200, Body: panicBody{inRead}, Request: r}, nil
			}),
			OnResult: res.on,
		})
		resp, err := tr.RoundTrip(chatRequest(t, 1))
		require.NoError(t, err)
		func() {
			defer func() { assert.NotNil(t, recover(), "the body's panic") }()
			if inRead {
				_, _ = resp.Body.Read(make([]byte, 8))
			} else {
				_ = resp.Body.Close()
			}
		}()
		assert.Zero(t, totalInFlight(tr.Balancer()), "panic in Read: %v", inRead)
		assert.Zero(t, statsByID(tr.Balancer())["a"].Failures)
		require.EqualValues(t, 1, res.n.Load())
		assert.True(t, (<-res.c).Outcome.Canceled())
	}
}

// TestOnResultPanicAtFailoverFinishesTheRetry: an OnResult that panics
// when told of the failed attempt of a failover panics through
// RoundTrip; the retry's pick, already made, is finished on the way out
// (no endpoint is left one call busier), and the retry is not sent.
func TestOnResultPanicAtFailoverFinishesTheRetry(t *testing.T) {
	sent := 0
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			sent++
			_ = r.Body.Close()
			return nil, errors.New("connection refused")
		}),
		OnResult: func(r httpbalancer.Result) {
			if r.FailedOver {
				panic("metrics")
			}
		},
	})
	func() {
		defer func() { assert.Equal(t, "metrics", recover()) }()
		_, _ = tr.RoundTrip(chatRequest(t, 1))
		t.Error("RoundTrip returned")
	}()
	assert.Equal(t, 1, sent)
	assert.Zero(t, totalInFlight(tr.Balancer()))
}

// TestBrokenBaseLeavesNoRequestBodyOpen: RoundTrip closes the caller's
// request body on every path, also when Base breaks its own contract by
// panicking or by returning neither a response nor an error without
// closing the body it was given (here the caller's own, forwarded
// unread: not JSON, so not peeked).
func TestBrokenBaseLeavesNoRequestBodyOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		base baseFunc
	}{
		{"panic", func(*http.Request) (*http.Response, error) { panic("base") }},
		{"nil response and nil error", func(*http.Request) (*http.Response, error) { return nil, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}},
				Base:      tc.base,
			})
			body := &closeTracker{Reader: strings.NewReader("\x00\x01 not json")}
			req, err := http.NewRequest(http.MethodPost, chatURL, body)
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/octet-stream")
			func() {
				defer func() { _ = recover() }()
				_, _ = tr.RoundTrip(req)
			}()
			assert.True(t, body.closed, "the caller's body is closed")
			assert.Zero(t, totalInFlight(tr.Balancer()))
		})
	}
}

// notServedPanicBody is a 404 (or 400) body that says the model is not
// served (or the call too long) and panics in Read or in Close.
type notServedPanicBody struct {
	r      io.Reader
	inRead bool
}

func (b *notServedPanicBody) Read(p []byte) (int, error) {
	if b.inRead {
		panic("read")
	}
	return b.r.Read(p)
}

func (b *notServedPanicBody) Close() error {
	if !b.inRead {
		panic("close")
	}
	return nil
}

// TestRefusalBodyPanicFinishesThePick: the transport reads a 404's body
// (and a 400's) itself to see whether the endpoint does not serve the model
// (or refuses the call as too long); a body from Base that panics in that
// Read, or in the Close before the call goes on to another endpoint,
// panics through RoundTrip with every pick finished, blaming no endpoint,
// as a body that panics in the caller's Read or Close does.
func TestRefusalBodyPanicFinishesThePick(t *testing.T) {
	refusals := map[int]string{
		http.StatusNotFound:   `{"error":{"message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`,
		http.StatusBadRequest: `{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).","code":400}}`,
	}
	for status, text := range refusals {
		for _, inRead := range []bool{true, false} {
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
				Base: baseFunc(func(r *http.Request) (*http.Response, error) {
					_ = r.Body.Close()
					return &http.Response{
						StatusCode: status, ContentLength: int64(len(text)),
						Body:    &notServedPanicBody{r: strings.NewReader(text), inRead: inRead},
						Request: r,
					}, nil
				}),
			})
			func() {
				defer func() { assert.NotNil(t, recover(), "the body's panic") }()
				_, _ = tr.RoundTrip(chatRequest(t, 1))
				t.Error("RoundTrip returned")
			}()
			assert.Zero(t, totalInFlight(tr.Balancer()), "status %d, panic in Read: %v", status, inRead)
			for id, s := range statsByID(tr.Balancer()) {
				assert.Zero(t, s.Failures, id)
			}
		}
	}
}

// TestWindowRefusalGetBodyPanicFinishesThePick: before it believes a
// refusal as too long, the transport reads the call's own body again
// (GetBody) to see that it carries no refusal's text; a GetBody that panics
// there panics through RoundTrip with the refused attempt's pick finished,
// as one that panics when the retry is set up does. It was left in flight:
// the endpoint stayed one call busier for good, and no result came.
func TestWindowRefusalGetBodyPanicFinishesThePick(t *testing.T) {
	type boom struct{}
	text := `{"object":"error","message":"This model's maximum context length is 1000 tokens. However, you requested 3199 tokens (2999 in the messages, 200 in the completion).","type":"BadRequestError","param":null,"code":400}`
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
		Base: baseFunc(func(r *http.Request) (*http.Response, error) {
			_ = r.Body.Close()
			h := http.Header{"Content-Type": {"application/json"}}
			return &http.Response{StatusCode: http.StatusBadRequest, Header: h, Body: io.NopCloser(strings.NewReader(text)), ContentLength: int64(len(text)), Request: r}, nil
		}),
		OnResult: res.on,
	})
	req := chatRequest(t, 1)
	req.GetBody = func() (io.ReadCloser, error) { panic(boom{}) }
	func() {
		defer func() { assert.Equal(t, boom{}, recover()) }()
		_, _ = tr.RoundTrip(req)
		t.Error("RoundTrip returned")
	}()
	assert.Zero(t, totalInFlight(tr.Balancer()))
	require.EqualValues(t, 1, res.n.Load(), "one result per call")
	r := <-res.c
	assert.True(t, r.Outcome.Canceled(), "blames no endpoint: %v", r.Outcome.Err)
	assert.False(t, r.Outcome.Unanswered, "the endpoint answered")
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, id)
	}
}
