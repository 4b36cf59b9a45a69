package httpbalancer_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

var errUploadDropped = errors.New("client dropped its upload")

// brokenBody yields its bytes, then fails instead of reaching EOF, as a
// gateway's request body does when its own client goes away.
type brokenBody struct {
	r      io.Reader
	mu     sync.Mutex
	closed bool
}

func (b *brokenBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, errUploadDropped
	}
	return n, err
}

func (b *brokenBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

func (b *brokenBody) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// A request whose own body fails is the caller's failure, not the
// endpoint's: it must not count against the endpoint (five in a row would
// trip a healthy backend's breaker) and is not retried elsewhere. Failing
// during the peek, nothing is sent at all.
func TestCallerBodyFailureIsNotBlamedOnTheEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxPeek int
		sent    int // Base calls expected
	}{
		{"during the peek", 0, 0}, // the whole body fits the default peek
		{"after the peek", 16, 1}, // Base meets the failure while sending
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sends int
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				sends++
				_, err := io.Copy(io.Discard, r.Body) // as a transport writing it
				_ = r.Body.Close()
				if err == nil {
					return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
				}
				return nil, err
			})
			res := newResults(4)
			tr := newTransport(t, httpbalancer.Options{
				Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "10.0.0.2:8000"}},
				Base:      base, MaxPeek: tc.maxPeek, OnResult: res.on,
			})
			body := &brokenBody{r: strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello there, a long question"}`)}
			req, err := http.NewRequest(http.MethodPost, chatURL, body)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.Nil(t, resp)
			require.ErrorIs(t, err, errUploadDropped)
			assert.True(t, body.isClosed(), "the caller's body is closed")
			assert.Equal(t, tc.sent, sends, "no retry on another endpoint")
			for id, s := range statsByID(tr.Balancer()) {
				assert.Zero(t, s.Failures, "%s blamed for the caller's body", id)
				assert.Zero(t, s.InFlight, id)
			}
			if tc.sent > 0 {
				r := <-res.c
				assert.True(t, r.Outcome.Canceled(), "reported as saying nothing about health: %v", r.Outcome.Err)
				assert.False(t, r.FailedOver)
			}
		})
	}
}

// countingBody counts the bytes read from it.
type countingBody struct {
	r io.Reader
	n int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func (c *countingBody) Close() error { return nil }

// The peek reads at most MaxPeek+1 bytes (one more tells "larger" from
// "exactly the limit") before anything is sent, whatever the allocator
// rounds buffers to; the rest streams through.
func TestPeekReadsNoMoreThanMaxPeek(t *testing.T) {
	for _, maxPeek := range []int{1000, 100_000, 1 << 20} {
		want := bytes.Repeat([]byte("x"), 3*maxPeek)
		body := &countingBody{r: bytes.NewReader(want)}
		var before int
		var got []byte
		base := baseFunc(func(r *http.Request) (*http.Response, error) {
			before = body.n
			got, _ = io.ReadAll(r.Body)
			_ = r.Body.Close()
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
		})
		tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}, Base: base, MaxPeek: maxPeek})
		req, err := http.NewRequest(http.MethodPost, chatURL, body)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.LessOrEqual(t, before, maxPeek+1, "read ahead with MaxPeek %d", maxPeek)
		assert.Equal(t, want, got, "forwarded intact")
	}
}

// blockingBody blocks in Read until it is closed, and says when a Read
// has started.
type blockingBody struct {
	reading chan struct{}
	once    sync.Once
	closed  chan struct{}
	close   sync.Once
}

func (b *blockingBody) Read([]byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	<-b.closed
	return 0, errors.New("read on closed body")
}

func (b *blockingBody) Close() error {
	b.close.Do(func() { close(b.closed) })
	return nil
}

// Canceling the context ends a RoundTrip blocked reading the caller's body
// for the peek, also when the caller gave GetBody.
func TestCancelEndsABlockedPeek(t *testing.T) {
	for _, withGetBody := range []bool{false, true} {
		base := baseFunc(func(*http.Request) (*http.Response, error) {
			t.Error("nothing may be sent")
			return nil, errors.New("unexpected send")
		})
		tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}, Base: base})
		body := &blockingBody{reading: make(chan struct{}), closed: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, body)
		require.NoError(t, err)
		if withGetBody {
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("{}")), nil }
		}
		done := make(chan error, 1)
		go func() {
			_, err := tr.RoundTrip(req)
			done <- err
		}()
		<-body.reading
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled, "GetBody %v", withGetBody)
		case <-time.After(10 * time.Second): // a failure, not a wait: the read is blocked for good
			_ = body.Close()
			<-done
			t.Fatalf("GetBody %v: RoundTrip still blocked in the peek 10s after cancel", withGetBody)
		}
	}
}

// TestBOMBodyPastThePeekKeepsItsModel: a body that opens with a UTF-8 byte
// order mark (Python servers read it as JSON) and names its model after a
// message longer than the peek, as the OpenAI SDKs write it, goes only to
// an endpoint serving that model, in memory or replayed from GetBody, and
// arrives with its mark, byte for byte.
func TestBOMBodyPastThePeekKeepsItsModel(t *testing.T) {
	body := "\xef\xbb\xbf" + `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}],"model":"b"}`
	var sent []byte
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		var err error
		sent, err = io.ReadAll(r.Body)
		require.NoError(t, err)
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{Base: base, MaxPeek: 64, OnResult: res.on, Endpoints: []inferlb.Endpoint{
		{ID: "a", Addr: "10.0.0.1:80", Labels: map[string]string{"model": "a"}},
		{ID: "b", Addr: "10.0.0.2:80", Labels: map[string]string{"model": "b"}},
	}})
	for _, mode := range []string{"in memory", "GetBody"} {
		req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(body))
		require.NoError(t, err)
		if mode == "GetBody" {
			req.Body = io.NopCloser(onlyReader{strings.NewReader(body)}) // not in memory: read ahead
		}
		sent = nil
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err, mode)
		require.NoError(t, resp.Body.Close())
		got := <-res.c
		assert.Equal(t, "b", got.Endpoint, mode)
		assert.Equal(t, "b", got.Request.Model, mode)
		assert.Equal(t, body, string(sent), mode)
	}
}

// A body of unknown length without GetBody that the peek read whole is
// sent with a GetBody of the transport's own, so that Base can send it
// again (an HTTP/2 transport retrying on a new connection, a redirect
// follower): each call gives a fresh copy of the bytes, and an empty body
// is http.NoBody, as net/http's own requests have it.
func TestPeekedBodyGetsAGetBody(t *testing.T) {
	for _, body := range []string{chatBody(1, false), ""} {
		var got []string
		var replays []io.ReadCloser
		base := baseFunc(func(r *http.Request) (*http.Response, error) {
			require.NotNil(t, r.GetBody, "body %q", body)
			for range 2 {
				rc, err := r.GetBody()
				require.NoError(t, err)
				b, err := io.ReadAll(rc)
				require.NoError(t, err)
				require.NoError(t, rc.Close())
				got = append(got, string(b))
				replays = append(replays, rc)
			}
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
		})
		tr := newTransport(t, httpbalancer.Options{Base: base, Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:80"}}})
		req, err := http.NewRequest(http.MethodPost, chatURL, struct{ io.Reader }{strings.NewReader(body)})
		require.NoError(t, err)
		require.Nil(t, req.GetBody, "the caller gave none")
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, []string{body, body}, got)
		if body == "" {
			assert.Equal(t, []io.ReadCloser{http.NoBody, http.NoBody}, replays)
		}
	}
}
