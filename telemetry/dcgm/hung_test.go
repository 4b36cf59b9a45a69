package dcgm_test

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
	"github.com/inferlb/inferlb/telemetry/dcgm"
)

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A node that goes down takes its exporter's scrape with it: it hangs until
// the round's deadline. While Parallelism of them held every slot (a rack or
// a zone of nodes lost together), the exporters queued behind them started
// only once the round's context had ended and failed at once: no GPU
// telemetry for any node, round after round. A hung scrape must not take
// the round of the exporters queued behind it.
func TestSourceHungExportersDoNotStarveTheRest(t *testing.T) {
	for _, hung := range []int{1, 8, 16} {
		t.Run(fmt.Sprint(hung, " hung"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					host := r.URL.Hostname()
					if strings.HasPrefix(host, "hung-") {
						<-r.Context().Done()
						return nil, r.Context().Err()
					}
					if err := r.Context().Err(); err != nil {
						return nil, err // as http.Transport does
					}
					return &http.Response{
						StatusCode: http.StatusOK, Status: "200 OK", Request: r, Header: http.Header{},
						Body: io.NopCloser(strings.NewReader(page(host, 500))),
					}, nil
				})}
				hostOf := map[string]string{}
				var urls []string
				for i := range hung {
					urls = append(urls, fmt.Sprintf("http://hung-%d:9400/metrics", i))
				}
				for i := range 4 {
					host := fmt.Sprint("ok-", i)
					urls = append(urls, "http://"+host+":9400/metrics")
					hostOf["ep-"+host] = host
				}
				src := &dcgm.Source{Client: client, Parallelism: 8, URLs: urls, Map: dcgm.ByHost(hostOf)}
				ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
				defer cancel()
				obs, err := src.Collect(ctx)
				require.ErrorIs(t, err, telemetry.ErrPartial)
				assert.Contains(t, err.Error(), fmt.Sprintf("%d of %d exporters failed", hung, hung+4))
				var got []string
				for _, o := range obs {
					got = append(got, o.EndpointID)
				}
				assert.Equal(t, []string{"ep-ok-0", "ep-ok-1", "ep-ok-2", "ep-ok-3"}, got)
			})
		})
	}
}
