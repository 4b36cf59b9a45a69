package httpbalancer_test

import (
	"fmt"
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

// TEI's /predict names no model and is of no known service: its
// LongestInput is not known, so its first pick weighs no window, but the
// refusal gives the one input's count ("Given: 600"), which its retry
// must weigh as a pooling call's, as every window check does. The count
// went into the call's PromptTokens instead, which no check of such a
// call reads: the retry passed over no replica remembered too small, and
// in a fleet of several small replicas a long text went from one to
// another, each refusing it, before it met the large one (or the caller
// got the refusal when the hops ran out).
func TestTEIPredictRetryWeighsTheRefusedInput(t *testing.T) {
	smalls := make([]*windowBackend, 3)
	bs := make([]*windowBackend, 0, 4)
	for i := range smalls {
		smalls[i] = newTEIBackend(t, fmt.Sprintf("small%d", i), 512, 1<<20, http.StatusUnprocessableEntity)
		bs = append(bs, smalls[i])
	}
	large := newTEIBackend(t, "large", 8192, 1<<20, http.StatusUnprocessableEntity)
	tr := newWindowTransport(t, append(bs, large)...)
	const url = "http://tei.internal/predict"
	refused := func() (n int64) {
		for _, s := range smalls {
			n += s.refused.Load()
		}
		return n
	}
	for i := 0; ; i++ { // every small replica's limit remembered
		require.Less(t, i, 200, "a small replica never met a long text")
		known := 0
		for _, s := range smalls {
			if s.refused.Load() > 0 {
				known++
			}
		}
		if known == len(smalls) {
			break
		}
		resp, err := postTo(tr, url, teiBatch(i, 0, 600))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: a text of 600 tokens, which the large replica takes", i)
	}
	for i := range 40 {
		before := refused()
		resp, err := postTo(tr, url, teiBatch(1000+i, 0, 600))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d", i)
		assert.LessOrEqual(t, refused()-before, int64(1), "call %d: refused once at most (its first pick weighs nothing), its retry goes to the replica that takes it", i)
	}
}
