package modelserver_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/modelserver"
)

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// hangingFleet answers for hosts named ok-N at once and never for hosts
// named hung-N (a node that went down: its pods' addresses blackhole the
// connection) until the request's context ends.
func hangingFleet() *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasPrefix(r.URL.Hostname(), "hung-") {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		if err := r.Context().Err(); err != nil {
			return nil, err // as http.Transport does
		}
		return &http.Response{
			StatusCode: http.StatusOK, Status: "200 OK", Request: r, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader("vllm:num_requests_running 3\n")),
		}, nil
	})}
}

// A node that goes down takes its model servers' scrapes with it: they hang
// until the round's deadline. While Parallelism of them held every slot, the
// healthy targets queued behind them started only once the round's context
// had ended, and failed at once: 8 hung targets (one 8-GPU node) blacked
// out the telemetry of the whole fleet, round after round, until the node's
// pods left the target list. A hung scrape must not take the round of the
// targets queued behind it.
func TestSourceHungTargetsDoNotStarveTheRest(t *testing.T) {
	for _, hung := range []int{1, 8, 16} {
		t.Run(fmt.Sprint(hung, " hung"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var targets []modelserver.Target
				for i := range hung {
					targets = append(targets, modelserver.Target{EndpointID: fmt.Sprint("hung-", i), URL: fmt.Sprintf("http://hung-%d:8000/metrics", i)})
				}
				for i := range 4 {
					targets = append(targets, modelserver.Target{EndpointID: fmt.Sprint("ok-", i), URL: fmt.Sprintf("http://ok-%d:8000/metrics", i)})
				}
				src := &modelserver.Source{Client: hangingFleet(), Parallelism: 8, Targets: modelserver.Static(targets...)}
				ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
				defer cancel()
				start := time.Now()
				obs, err := src.Collect(ctx)
				require.ErrorIs(t, err, telemetry.ErrPartial)
				want := fmt.Sprintf("%d of %d targets failed (\"hung-0\"), 0 partial;", hung, hung+4)
				if hung > 3 { // three named, the rest counted
					want = fmt.Sprintf("%d of %d targets failed (\"hung-0\", \"hung-1\", \"hung-2\" and %d more), 0 partial;", hung, hung+4, hung-3)
				}
				assert.Contains(t, err.Error(), want)
				var got []string
				for _, o := range obs {
					got = append(got, o.EndpointID)
				}
				assert.Equal(t, []string{"ok-0", "ok-1", "ok-2", "ok-3"}, got)
				assert.LessOrEqual(t, time.Since(start), 15*time.Second, "within the round")
			})
		})
	}
}
