package httpbalancer_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// hangUp serves on loopback a server that reads each request whole and
// then closes its connection without an answer: with a reset (RST, as a
// killed process's kernel sends), or with a plain close (EOF). It stops
// when the test ends.
func hangUp(t *testing.T, reset bool) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = io.Copy(io.Discard, r.Body)
				}
				if tc, ok := c.(*net.TCPConn); ok && reset {
					_ = tc.SetLinger(0)
				}
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		wg.Wait()
	})
	return lis.Addr().String()
}

// answering serves status on loopback, with no Retry-After.
func answering(t *testing.T, status int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// The overload probation (balancer.Options.DefaultCooldown) is for a
// replica that keeps saying it is too busy; a replica that restarts is
// the breaker's, ejection's and slow start's. Over HTTP no connection
// failure is an overload answer: a connection refused (nothing listening,
// as while a replica restarts), reset or closed after the request (a
// replica killed with the call on it), and a 503 without Retry-After (a
// server starting, or a proxy with no upstream) are the endpoint's
// failures, three in a row of which start no row of overload answers and
// no probation; net/http resends by itself a request an HTTP/2 GOAWAY or
// REFUSED_STREAM left unprocessed, and what fails after that is an error
// as these are. An overload answer without a hint, a 429 as TGI's, is a
// refusal: three in a row, each sent after the last one's cooldown, put
// the replica on probation.
func TestConnectionFailuresAreNoOverloads(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addr     func(t *testing.T) string
		overload bool
	}{
		{"connection refused", func(t *testing.T) string { return testutil.RefusedAddr(t) }, false},
		{"connection reset", func(t *testing.T) string { return hangUp(t, true) }, false},
		{"closed after the request", func(t *testing.T) string { return hangUp(t, false) }, false},
		{"503 without Retry-After", func(t *testing.T) string { return answering(t, http.StatusServiceUnavailable) }, false},
		{"429 without Retry-After", func(t *testing.T) string { return answering(t, http.StatusTooManyRequests) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{ID: "r", Addr: tc.addr(t)}},
				BalancerOptions: balancer.Options{Clock: clock, OutlierInterval: -1},
			})
			client := &http.Client{Transport: tr}
			const calls = 3 // under the breaker's DefaultBreakerFailures
			for i := range calls {
				clock.Advance(2 * balancer.DefaultCooldown) // past any cooldown
				resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(i, false)))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
			var s balancer.EndpointStats
			for _, st := range tr.Balancer().Stats() {
				if st.ID == "r" {
					s = st
				}
			}
			require.Equal(t, "r", s.ID)
			if tc.overload {
				assert.EqualValues(t, calls, s.Overloads)
				assert.Equal(t, calls, s.OverloadStreak)
				assert.False(t, s.ProbationUntil.IsZero(), "refusals in a row: on probation")
				return
			}
			assert.Zero(t, s.Overloads, "counted as overload answers")
			assert.EqualValues(t, calls, s.Failures, "the endpoint's failures")
			assert.Zero(t, s.OverloadStreak)
			assert.True(t, s.ProbationUntil.IsZero(), "on probation until %v", s.ProbationUntil)
		})
	}
}
