package httpbalancer_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// A call the caller cancels through Request.Cancel (deprecated, but set
// by http.Client for a RoundTripper it does not know whenever
// Client.Timeout is, and still honoured by net/http) is the caller's
// doing, as a cancelled context is: net/http fails it with "net/http:
// request canceled", which counted as the endpoint's failure, and the
// call failed over to another endpoint that the caller had given up on
// too.
func TestRequestCancelIsTheCallersDoing(t *testing.T) {
	var hits atomic.Int64
	started := make(chan struct{}, 2)
	block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // then net/http watches the connection
		started <- struct{}{}
		<-r.Context().Done() // the client hung up
	})
	var eps []inferlb.Endpoint
	for _, id := range []string{"a", "b"} {
		srv := httptest.NewServer(block)
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: id, Addr: strings.TrimPrefix(srv.URL, "http://")})
	}
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps})
	cancel := make(chan struct{})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	require.NoError(t, err)
	//lint:ignore SA1019 the deprecated field is the point
	req.Cancel = cancel
	go func() {
		<-started
		close(cancel)
	}()
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	var ee *httpbalancer.EndpointError
	assert.NotErrorAs(t, err, &ee, "no endpoint is to blame")
	assert.EqualValues(t, 1, hits.Load(), "no failover")
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.Failures, "endpoint %s", id)
		assert.Zero(t, s.InFlight, "endpoint %s", id)
	}
}

// The same while the caller reads the answer: the body's read error after
// Request.Cancel is the caller's doing too.
func TestRequestCancelWhileReadingIsTheCallersDoing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x",`))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes
	}))
	t.Cleanup(srv.Close)
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{ID: "a", Addr: strings.TrimPrefix(srv.URL, "http://")}}})
	cancel := make(chan struct{})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	require.NoError(t, err)
	//lint:ignore SA1019 the deprecated field is the point
	req.Cancel = cancel
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	buf := make([]byte, 10)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	close(cancel)
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err)
	var ee *httpbalancer.EndpointError
	assert.NotErrorAs(t, err, &ee, "no endpoint is to blame")
	_ = resp.Body.Close()
	s := statsByID(tr.Balancer())["a"]
	assert.Zero(t, s.Failures)
	assert.Zero(t, s.InFlight)
}

// pastDeadline is a context whose deadline has passed and whose timer has
// not yet ended it: the moment http.Client.Timeout's two timers leave
// between them when Request.Cancel's fires first.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Unix(1, 0), true }

// http.Client.Timeout, for a RoundTripper it does not know, closes
// Request.Cancel and ends the context's deadline at one moment, by two
// timers. When the Cancel channel's won, an endpoint that hung until the
// client's timeout read as the caller's cancel and was never blamed; it
// is the deadline's failure, as it is when the context's timer wins. A
// Cancel closed before any deadline stays the caller's doing.
func TestClientTimeoutThroughCancelBlamesTheEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		failures uint64
	}{
		{"deadline passed", pastDeadline{context.Background()}, 1},
		{"no deadline", context.Background(), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := baseFunc(func(r *http.Request) (*http.Response, error) {
				//lint:ignore SA1019 the deprecated field is the point
				<-r.Cancel
				return nil, errors.New("net/http: request canceled")
			})
			res := newResults(1)
			tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}}, Base: base, OnResult: res.on})
			cancel := make(chan struct{})
			close(cancel)
			req, err := http.NewRequestWithContext(tc.ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
			require.NoError(t, err)
			//lint:ignore SA1019 the deprecated field is the point
			req.Cancel = cancel
			_, err = tr.RoundTrip(req)
			require.Error(t, err)
			r := <-res.c
			assert.Equal(t, tc.failures == 1, errors.Is(r.Outcome.Err, context.DeadlineExceeded), "outcome %v", r.Outcome.Err)
			assert.Equal(t, tc.failures, statsByID(tr.Balancer())["a"].Failures)
		})
	}
}
