package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// teiEmbedURL is Hugging Face TEI's native embedding route, whose body
// names no model: {"inputs": "text"} or {"inputs": ["t1", "t2"]}.
const teiEmbedURL = "http://tei.internal/embed"

// teiBatch is a native /embed body of n inputs of about 100 tokens and,
// when longest > 0, one of about longest, distinct for each i; with n 0
// and longest > 0, inputs is that one string.
func teiBatch(i, n, longest int) string {
	long := fmt.Sprintf("%06d long ", i) + strings.Repeat("word ", max(longest*4/5-3, 0))
	if n == 0 {
		b, _ := json.Marshal(map[string]any{"inputs": long})
		return string(b)
	}
	inputs := make([]string, 0, n+1)
	for j := range n {
		inputs = append(inputs, fmt.Sprintf("%06d %04d ", i, j)+strings.Repeat("word ", 100*4/5-3))
	}
	if longest > 0 {
		inputs = append(inputs, long)
	}
	b, _ := json.Marshal(map[string]any{"inputs": inputs})
	return string(b)
}

// TEI's native /embed names no model, and the transport read refusals
// as too long only for calls with one: in a fleet of TEI replicas with
// different max-input-lengths, a text over the small one's came back to
// the caller (413, or 422 from v1.9) whenever it met the small replica,
// and nothing was remembered. Now the call goes on to the large replica,
// the small one is remembered too small for such texts (under the key of
// calls without a model), and batches of short texts still go to both.
func TestTEINativeInputLimitFailsOver(t *testing.T) {
	for _, status := range []int{http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			small, large := newTEIBackend(t, "small", 512, 1<<20, status), newTEIBackend(t, "large", 8192, 1<<20, status)
			tr := newTransport(t, httpbalancer.Options{
				Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1), Clock: testutil.NewClock()}),
				Endpoints: endpointsOf(small.backend, large.backend),
			})
			for i := range 20 {
				n := 4
				if i%2 == 1 {
					n = 0 // one string
				}
				resp, err := postTo(tr, teiEmbedURL, teiBatch(i, n, 600))
				require.NoError(t, err, "call %d", i)
				require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: a text of 600 tokens, which the large replica takes", i)
				assert.Equal(t, "large", resp.Header.Get("X-Backend"), "call %d", i)
			}
			require.Positive(t, small.refused.Load(), "the small replica was never tried")
			assert.Equal(t, int64(1), small.refused.Load(), "its limit remembered after one refusal")
			st := statsByID(tr.Balancer())["small"]
			assert.Equal(t, uint64(1), st.TooLong)
			assert.Zero(t, st.Failures, "a refusal as too long is no failure")

			before := small.hits.Load()
			for i := range 40 {
				resp, err := postTo(tr, teiEmbedURL, teiBatch(100+i, 40, 0))
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			assert.Greater(t, small.hits.Load()-before, int64(10), "batches of short texts, 4,000 tokens in all, fit the small replica's 512 per text")
		})
	}
}

// TEI's other native routes: /embed_all and /embed_sparse are
// embeddings, /predict (classification) a call of no known service; all
// limit each input, not the batch. Weighed by the batch's tokens, after
// one long text was refused the small replica took none of 40 batches of
// short texts (4,000 tokens in all, 100 each).
func TestTEINativeRoutesAreLimitedPerInput(t *testing.T) {
	for _, route := range []string{"/embed_all", "/embed_sparse", "/predict"} {
		t.Run(route, func(t *testing.T) {
			small, large := newTEIBackend(t, "small", 512, 1<<20, http.StatusUnprocessableEntity), newTEIBackend(t, "large", 8192, 1<<20, http.StatusUnprocessableEntity)
			tr := newTransport(t, httpbalancer.Options{
				Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1), Clock: testutil.NewClock()}),
				Endpoints: endpointsOf(small.backend, large.backend),
			})
			url := "http://tei.internal" + route
			for i := 0; small.refused.Load() == 0; i++ {
				require.Less(t, i, 50, "the small replica never met a long text")
				resp, err := postTo(tr, url, teiBatch(i, 0, 600))
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode, "a text of 600 tokens, which the large replica takes")
			}
			before := small.hits.Load()
			for i := range 40 {
				resp, err := postTo(tr, url, teiBatch(100+i, 40, 0))
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			assert.Greater(t, small.hits.Load()-before, int64(10), "batches of short texts fit the small replica's 512 per text")
		})
	}
}

// A 404 to a call without a model is still not read as the endpoint
// lacking a model, even one whose body says "not found" and quotes an
// empty name: it is a route the server lacks, and the caller gets it, not
// sent on.
func TestNoModel404IsTheRequests(t *testing.T) {
	a, b := newTEIBackend(t, "a", 512, 1<<20, http.StatusUnprocessableEntity), newTEIBackend(t, "b", 512, 1<<20, http.StatusUnprocessableEntity)
	tr := newTransport(t, httpbalancer.Options{
		Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1), Clock: testutil.NewClock()}),
		Endpoints: endpointsOf(a.backend, b.backend),
	})
	for range 4 {
		resp, err := postTo(tr, "http://tei.internal/no_such_route", teiBatch(0, 2, 0))
		require.NoError(t, err)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	}
	assert.Zero(t, tr.Stats().Failovers, "not sent on")
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.NotServed, id)
	}
}
