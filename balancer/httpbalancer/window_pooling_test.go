package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

const embeddingsURL = "http://llm.internal/v1/embeddings"

// newEmbeddingBackend answers /v1/embeddings like vLLM serving a pooling
// model with a max-model-len of window tokens: each input (its characters
// over 4) must fit the window on its own, however many a batch holds
// (vLLM validates each prompt of the batch, _validate_input); one that
// does not is refused with vLLM's 400, before any work.
func newEmbeddingBackend(t *testing.T, name string, window int) *windowBackend {
	t.Helper()
	b := &windowBackend{backend: &backend{name: name}}
	b.srv = serveOn(t, testutil.HoldPort(t), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Input json.RawMessage `json:"input"`
		}
		_ = json.Unmarshal(body, &req)
		var inputs []string
		if json.Unmarshal(req.Input, &inputs) != nil {
			var one string
			_ = json.Unmarshal(req.Input, &one)
			inputs = []string{one}
		}
		w.Header().Set("Content-Type", "application/json")
		for _, in := range inputs {
			if n := len(in) / 4; n > window {
				b.refused.Add(1)
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"object":"error","message":"This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.","type":"BadRequestError","param":null,"code":400}`, window, n)
				return
			}
		}
		b.hits.Add(1)
		w.Header().Set("X-Backend", name)
		fmt.Fprintf(w, `{"object":"list","data":[],"model":"e5","usage":{"prompt_tokens":%d,"total_tokens":%d}}`, len(body)/4, len(body)/4)
	}))
	return b
}

// embeddingOf is an embeddings call of n inputs of about tokens tokens
// each (characters over 4), distinct for each i.
func embeddingOf(i, n, tokens int) string {
	inputs := make([]string, n)
	for j := range inputs {
		inputs[j] = fmt.Sprintf("%06d %04d ", i, j) + strings.Repeat("word ", tokens*4/5-3)
	}
	b, _ := json.Marshal(map[string]any{"model": "e5", "input": inputs})
	return string(b)
}

func postTo(tr http.RoundTripper, url, body string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}

// newPoolingTransport is a Transport over a small (512-token) and a large
// (8,192) replica of a pooling model, on a clock that does not move (so
// that the replicas' latencies tie and the seeded draw spreads calls), after
// one input of 600 tokens met the small one: it refused it (its window
// remembered), and the large one took it.
func newPoolingTransport(t *testing.T) (tr *httpbalancer.Transport, small, large *windowBackend) {
	t.Helper()
	small, large = newEmbeddingBackend(t, "small", 512), newEmbeddingBackend(t, "large", 8192)
	tr = newWindowTransport(t, small, large)
	for i := 0; small.refused.Load() == 0; i++ {
		require.Less(t, i, 32, "the small replica was never tried")
		resp, err := postTo(tr, embeddingsURL, embeddingOf(i, 1, 600))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "large", resp.Header.Get("X-Backend"))
	}
	return tr, small, large
}

// A pooling server bounds each input of a batch (each query and document
// pair of a rerank) by its window, not the batch: after the small replica
// refused one over-long input, batches of short inputs, 5,000 tokens in
// all and 100 each, still go to it as to the large one.
func TestPoolingBatchesFitPerInput(t *testing.T) {
	tr, small, _ := newPoolingTransport(t)
	before := small.hits.Load()
	for i := range 40 {
		resp, err := postTo(tr, embeddingsURL, embeddingOf(100+i, 50, 100))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Greater(t, small.hits.Load()-before, int64(10), "batches of short inputs fit the small window: not passed over")
}

// A batch whose endpoint cannot be reached fails over to a replica whose
// window takes each of its inputs, however many tokens they sum to.
func TestPoolingBatchFailsOverPerInput(t *testing.T) {
	t.Run("the small one takes it", func(t *testing.T) {
		tr, small, large := newPoolingTransport(t)
		large.srv.Close()
		for i := range 8 {
			resp, err := postTo(tr, embeddingsURL, embeddingOf(100+i, 50, 100))
			require.NoError(t, err, "batch %d", i)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "small", resp.Header.Get("X-Backend"))
		}
		assert.Positive(t, small.hits.Load())
	})
	t.Run("both windows remembered", func(t *testing.T) {
		tr, small, large := newPoolingTransport(t)
		// The large replica refuses an input of 9,000 tokens, which no
		// replica takes: the caller gets the refusal, one per replica.
		resp, err := postTo(tr, embeddingsURL, embeddingOf(200, 1, 9000))
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, int64(1), large.refused.Load())
		assert.LessOrEqual(t, small.refused.Load(), int64(2), "not sent on to the small one again and again")
		small.srv.Close()
		// 100 inputs of 100 tokens: 10,000 in all, above both windows.
		for i := range 8 {
			resp, err := postTo(tr, embeddingsURL, embeddingOf(300+i, 100, 100))
			require.NoError(t, err, "batch %d", i)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "large", resp.Header.Get("X-Backend"))
		}
		assert.Positive(t, statsByID(tr.Balancer())["small"].Failures, "a batch was sent to the small replica while it was down")
	})
}
