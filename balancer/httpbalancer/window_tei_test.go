package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// newTEIBackend answers like Hugging Face TEI started with
// --max-input-length maxInput and auto-truncate off, on its native /embed
// (a body that names no model, "inputs" a string or a list) and its
// OpenAI-compatible /v1/embeddings ("input" a list): each input (its
// characters over 4) must fit maxInput on its own (core/src/tokenization.rs,
// encode_input), and one that does not fails the call with TEI's
// validation error, "Input validation error: `inputs` must have less than
// N tokens. Given: M", in the route's error body (native ErrorResponse:
// error and error_type; OpenAICompatErrorResponse: message, code, type),
// with status: 413 up to v1.8 (ErrorType::Validation was
// PAYLOAD_TOO_LARGE), 422 from v1.9. A batch larger than maxBatch is
// refused with TEI's other 413, no refusal as too long. Any other route
// is a 404 that says "not found" and quotes an empty name, as a call
// without a model has.
func newTEIBackend(t *testing.T, name string, maxInput, maxBatch, status int) *windowBackend {
	t.Helper()
	b := &windowBackend{backend: &backend{name: name}}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		native := r.URL.Path == "/embed" || r.URL.Path == "/embed_all" || r.URL.Path == "/embed_sparse" || r.URL.Path == "/predict"
		if !native && r.URL.Path != "/v1/embeddings" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":"route not found","error_type":""}`)
			return
		}
		var req struct {
			Input  []string        `json:"input"`
			Inputs json.RawMessage `json:"inputs"`
		}
		_ = json.Unmarshal(body, &req)
		inputs := req.Input
		if native && json.Unmarshal(req.Inputs, &inputs) != nil {
			var one string
			_ = json.Unmarshal(req.Inputs, &one)
			inputs = []string{one}
		}
		refuse := func(msg string) {
			w.WriteHeader(status)
			if native {
				fmt.Fprintf(w, `{"error":%q,"error_type":"Validation"}`, msg)
				return
			}
			fmt.Fprintf(w, `{"message":%q,"code":%d,"type":"Validation"}`, msg, status)
		}
		if len(inputs) > maxBatch {
			refuse(fmt.Sprintf("batch size %d > maximum allowed batch size %d", len(inputs), maxBatch))
			return
		}
		for _, in := range inputs {
			if n := len(in) / 4; n > maxInput {
				b.refused.Add(1)
				refuse(fmt.Sprintf("Input validation error: `inputs` must have less than %d tokens. Given: %d", maxInput, n))
				return
			}
		}
		b.hits.Add(1)
		w.Header().Set("X-Backend", name)
		if native {
			fmt.Fprint(w, "[[0.1,0.2]]")
			return
		}
		fmt.Fprintf(w, `{"object":"list","data":[],"model":"e5","usage":{"prompt_tokens":%d,"total_tokens":%d}}`, len(body)/4, len(body)/4)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// teiInputs is n texts of about 100 tokens and, when longest > 0, one of
// about longest, distinct for each i.
func teiInputs(i, n, longest int) []string {
	inputs := make([]string, 0, n+1)
	for j := range n {
		inputs = append(inputs, fmt.Sprintf("%06d %04d ", i, j)+strings.Repeat("word ", 100*4/5-3))
	}
	if longest > 0 {
		inputs = append(inputs, fmt.Sprintf("%06d long ", i)+strings.Repeat("word ", max(longest*4/5-3, 0)))
	}
	return inputs
}

// batchWithLongest is an embeddings call (/v1/embeddings) of teiInputs.
func batchWithLongest(i, n, longest int) string {
	b, _ := json.Marshal(map[string]any{"model": "e5", "input": teiInputs(i, n, longest)})
	return string(b)
}

// teiBatch is a native /embed body of teiInputs; with n 0 and longest >
// 0, inputs is that one string.
func teiBatch(i, n, longest int) string {
	var inputs any = teiInputs(i, n, longest)
	if n == 0 && longest > 0 {
		inputs = inputs.([]string)[0]
	}
	b, _ := json.Marshal(map[string]any{"inputs": inputs})
	return string(b)
}

// newWindowTransport is a Transport over bs, with a seeded Balancer on a
// fake clock.
func newWindowTransport(t *testing.T, bs ...*windowBackend) *httpbalancer.Transport {
	t.Helper()
	eps := make([]*backend, len(bs))
	for i, b := range bs {
		eps[i] = b.backend
	}
	return newTransport(t, httpbalancer.Options{
		// A fixed AffinitySeed: the process's random one placed the
		// prompts' keys differently in every run, and the share a test
		// counts with it (TestSeveralSequencesFitTheWindow: 12 to 29 of
		// 40 calls over 60 seeds, 10 once under -race) with them.
		Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1), Clock: testutil.NewClock(), AffinitySeed: 1}),
		Endpoints: endpointsOf(eps...),
	})
}

// TEI up to v1.8 refuses an input longer than its max-input-length with
// 413, which the transport read as the request's: in a fleet of TEI
// replicas with different max-input-lengths, a batch with one text over
// the small one's came back to the caller as a 413 whenever it met the
// small replica, and nothing was remembered. Such a 413 (and TEI's 422
// from v1.9) is a refusal as too long: the batch goes on to the large
// replica, the small one is remembered too small for such texts, and
// batches of short texts still go to both.
//
// TEI's native /embed names no model, and the transport read refusals
// as too long only for calls with one: there the text over the small
// replica's limit came back to the caller whatever the status. Its
// window is now remembered under the key of calls without a model.
func TestTEIInputLimitFailsOver(t *testing.T) {
	for _, route := range []struct {
		name, url   string
		long, short func(i int) string
	}{
		{"/v1/embeddings", embeddingsURL,
			func(i int) string { return batchWithLongest(i, 4, 600) },
			func(i int) string { return batchWithLongest(100+i, 40, 100) }},
		{"native /embed", teiEmbedURL,
			func(i int) string { return teiBatch(i, 4*(1-i%2), 600) }, // every other call one string
			func(i int) string { return teiBatch(100+i, 40, 0) }},
	} {
		for _, status := range []int{http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity} {
			t.Run(route.name+" "+http.StatusText(status), func(t *testing.T) {
				small, large := newTEIBackend(t, "small", 512, 64, status), newTEIBackend(t, "large", 8192, 64, status)
				tr := newWindowTransport(t, small, large)
				for i := range 20 {
					resp, err := postTo(tr, route.url, route.long(i))
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
					resp, err := postTo(tr, route.url, route.short(i))
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, resp.StatusCode)
				}
				assert.Greater(t, small.hits.Load()-before, int64(10), "batches of short texts, about 4,000 tokens in all, fit the small replica's 512 per text")
			})
		}
	}
}

// Any other 413 (TEI's batch size refusal) is the request's, as before:
// the caller gets it byte for byte and it is not sent on.
func TestTEIOther413IsTheRequests(t *testing.T) {
	a, b := newTEIBackend(t, "a", 512, 8, http.StatusRequestEntityTooLarge), newTEIBackend(t, "b", 512, 8, http.StatusRequestEntityTooLarge)
	tr := newWindowTransport(t, a, b)
	req, err := http.NewRequest(http.MethodPost, embeddingsURL, strings.NewReader(batchWithLongest(0, 20, 100)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Equal(t, `{"message":"batch size 21 > maximum allowed batch size 8","code":413,"type":"Validation"}`, string(body))
	assert.Zero(t, tr.Stats().Failovers, "not sent on")
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.TooLong, id)
	}
}
