package httpbalancer_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// teiEmbedURL is Hugging Face TEI's native embedding route, whose body
// names no model: {"inputs": "text"} or {"inputs": ["t1", "t2"]}.
const teiEmbedURL = "http://tei.internal/embed"

// TEI's other native routes: /embed_all and /embed_sparse are
// embeddings, /predict (classification) a call of no known service; all
// limit each input, not the batch. Weighed by the batch's tokens, after
// one long text was refused the small replica took none of 40 batches of
// short texts (4,000 tokens in all, 100 each).
func TestTEINativeRoutesAreLimitedPerInput(t *testing.T) {
	for _, route := range []string{"/embed_all", "/embed_sparse", "/predict"} {
		t.Run(route, func(t *testing.T) {
			small, large := newTEIBackend(t, "small", 512, 1<<20, http.StatusUnprocessableEntity), newTEIBackend(t, "large", 8192, 1<<20, http.StatusUnprocessableEntity)
			tr := newWindowTransport(t, small, large)
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
	tr := newWindowTransport(t, a, b)
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
