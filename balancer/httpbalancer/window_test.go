package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// windowBackend answers like vLLM started with a max-model-len of window
// tokens: a chat whose prompt (its characters over 4) and max_tokens do
// not fit is refused with vLLM's 400, others answered as fakeChat does.
type windowBackend struct {
	*backend
	refused atomic.Int64
}

func newWindowBackend(t *testing.T, name string, window int) *windowBackend {
	t.Helper()
	return newRefusingBackend(t, name, window, func(w http.ResponseWriter, prompt, out int) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"object":"error","message":"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`,
			window, prompt+out, prompt, out)
	})
}

// newRefusingBackend answers a chat whose prompt (its characters over 4)
// and max_tokens do not fit window with refuse, others as fakeChat does.
func newRefusingBackend(t *testing.T, name string, window int, refuse func(w http.ResponseWriter, prompt, out int)) *windowBackend {
	t.Helper()
	return newRefusingBackendIf(t, name, func(prompt, out int) bool { return prompt+out > window }, refuse)
}

// newRefusingBackendIf answers a chat for which tooLong holds (its prompt
// its characters over 4) with refuse, others as fakeChat does.
func newRefusingBackendIf(t *testing.T, name string, tooLong func(prompt, out int) bool, refuse func(w http.ResponseWriter, prompt, out int)) *windowBackend {
	t.Helper()
	b := &windowBackend{backend: &backend{name: name}}
	b.srv = serveOn(t, testutil.HoldPort(t), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.Unmarshal(body, &req)
		prompt := 0
		for _, m := range req.Messages {
			prompt += len(m.Content) / 4
		}
		if tooLong(prompt, req.MaxTokens) {
			b.refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			refuse(w, prompt, req.MaxTokens)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		b.fakeChat(w, r)
	}))
	return b
}

// chatOf is a chat of about tokens prompt tokens (characters over 4),
// distinct for each i so that no two share an affinity key.
func chatOf(i, tokens, maxTokens int) string {
	text := fmt.Sprintf("%06d ", i) + strings.Repeat("word ", tokens*4/5-2)
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, text, maxTokens)
}

// Two replicas started with a 1,000-token window and one with 8,000: long
// calls are answered by the large one, each small one refusing at most
// once, and short calls still spread over all three.
func TestLongCallsFindTheLargerWindow(t *testing.T) {
	small1, small2, large := newWindowBackend(t, "small1", 1000), newWindowBackend(t, "small2", 1000), newWindowBackend(t, "large", 8000)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(small1.backend, small2.backend, large.backend),
		// A fixed Rand and AffinitySeed: the default ones, random per
		// process, placed the 90 short chats' keys, and the count of
		// them the small replicas took (47 to 74 over 100 seeds, against
		// a bound of 30), differently in every run.
		BalancerOptions: balancer.Options{Rand: testutil.NewRand(1), AffinitySeed: 1},
	})
	c := &http.Client{Transport: tr}
	for i := range 40 {
		resp, _ := post(t, c, chatOf(i, 3000, 200))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "large", resp.Header.Get("X-Backend"))
	}
	t.Logf("refused: %d + %d", small1.refused.Load(), small2.refused.Load())
	assert.LessOrEqual(t, small1.refused.Load(), int64(1), "remembered after one refusal")
	assert.LessOrEqual(t, small2.refused.Load(), int64(1))

	before := small1.hits.Load() + small2.hits.Load()
	for i := range 90 {
		resp, _ := post(t, c, chatOf(100+i, 200, 100))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Greater(t, small1.hits.Load()+small2.hits.Load()-before, int64(30), "short calls fit the small windows")

	st := statsByID(tr.Balancer())
	for _, id := range []string{"small1", "small2", "large"} {
		assert.Zero(t, st[id].Failures, "%s: a refusal is not a failure", id)
	}
	assert.Equal(t, uint64(small1.refused.Load()), st["small1"].TooLong)
}

// When every replica's window is too small, the caller gets the refusal
// as the server sent it; once the windows are remembered, each call costs
// one refusal, not one per replica.
func TestLongCallsNoWindowTakes(t *testing.T) {
	bs := []*windowBackend{newWindowBackend(t, "a", 1000), newWindowBackend(t, "b", 1000), newWindowBackend(t, "c", 1000)}
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(bs[0].backend, bs[1].backend, bs[2].backend)})
	c := &http.Client{Transport: tr}
	refused := func() int64 { return bs[0].refused.Load() + bs[1].refused.Load() + bs[2].refused.Load() }
	for i := range 10 {
		resp, body := post(t, c, chatOf(i, 3000, 200))
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(body), "This model's maximum context length is 1000 tokens. However, you requested 3199 tokens (2999 in the messages, 200 in the completion).", "call %d", i)
		assert.True(t, strings.HasSuffix(string(body), `"code":400}`), "the refusal as it came")
	}
	t.Logf("refusals for 10 calls: %d", refused())
	assert.LessOrEqual(t, refused(), int64(3+9), "after the first call, one refusal a call")
}

// An OnResult that panics when told of a refusal panics through
// RoundTrip; nothing is left in flight, whether the call was to go on
// (the retry's pick is finished) or to end (the refusal's body closed).
func TestOnResultPanicAtRefusal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		larger bool // another endpoint could take the call
	}{{"retry", true}, {"no retry", false}} {
		t.Run(tc.name, func(t *testing.T) {
			window := map[string]int{"a": 1000, "b": 1000}
			if tc.larger {
				window["b"] = 8000
			}
			closed := 0
			tr := newTransport(t, httpbalancer.Options{
				Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1)}),
				Endpoints: []inferlb.Endpoint{{ID: "a", Addr: "10.0.0.1:80"}, {ID: "b", Addr: "10.0.0.2:80"}},
				Base: baseFunc(func(r *http.Request) (*http.Response, error) {
					_ = r.Body.Close()
					id := map[string]string{"10.0.0.1:80": "a", "10.0.0.2:80": "b"}[r.URL.Host]
					if window[id] >= 4000 {
						return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), ContentLength: 2, Request: r}, nil
					}
					body := fmt.Sprintf(`{"message":"This model's maximum context length is %d tokens. However, you requested 3199 tokens (2999 in the messages, 200 in the completion)."}`, window[id])
					return &http.Response{StatusCode: 400, Header: http.Header{}, ContentLength: int64(len(body)), Request: r,
						Body: &countClose{Reader: strings.NewReader(body), n: &closed}}, nil
				}),
				OnResult: func(r httpbalancer.Result) {
					if r.Outcome.ContextWindow > 0 {
						panic("metrics")
					}
				},
			})
			for i := range 16 { // once both small ones are known, each call ends at its first refusal
				func() {
					defer func() { _ = recover() }()
					req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatOf(i, 3000, 200)))
					require.NoError(t, err)
					req.Header.Set("Content-Type", "application/json")
					if resp, err := tr.RoundTrip(req); err == nil {
						_ = resp.Body.Close()
					}
				}()
			}
			assert.Zero(t, totalInFlight(tr.Balancer()))
			st := statsByID(tr.Balancer())
			assert.Positive(t, st["a"].TooLong+st["b"].TooLong, "a refusal was met")
			assert.Equal(t, int(st["a"].TooLong+st["b"].TooLong), closed, "every refusal's body closed")
		})
	}
}

// countClose counts the Closes of a body in n.
type countClose struct {
	io.Reader
	n *int
}

func (c *countClose) Close() error { *c.n++; return nil }

// newTGIWindowBackend answers like TGI started with a max-total-tokens of
// window: a chat whose prompt and max_tokens do not fit is refused with
// TGI's validation error, whose status is 422 (TGI answers every
// validation error so, InferError::ValidationError), before any work.
func newTGIWindowBackend(t *testing.T, name string, window int) *windowBackend {
	t.Helper()
	return newRefusingBackend(t, name, window, func(w http.ResponseWriter, prompt, out int) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"error":"Input validation error: `+"`inputs` tokens + `max_new_tokens` must be <= %d. Given: %d `inputs` tokens and %d `max_new_tokens`"+`","error_type":"validation"}`,
			window, prompt, out)
	})
}

// TGI refuses a call longer than its window with 422, not 400: the call
// goes on to the replica whose window takes it, as it does from vLLM's
// 400, the attempt reported with the window and the status it got. A call
// no replica takes gets TGI's 422 as it came.
func TestLongCallsFindTheLargerWindowOnTGI(t *testing.T) {
	small, large := newTGIWindowBackend(t, "small", 1000), newTGIWindowBackend(t, "large", 8000)
	res := newResults(64)
	tr := newTransport(t, httpbalancer.Options{
		Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1)}),
		Endpoints: endpointsOf(small.backend, large.backend),
		OnResult:  res.on,
	})
	c := &http.Client{Transport: tr}
	for i := range 8 {
		resp, _ := post(t, c, chatOf(i, 3000, 200))
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d", i)
		assert.Equal(t, "large", resp.Header.Get("X-Backend"))
	}
	require.Positive(t, small.refused.Load(), "the small replica was tried")
	st := statsByID(tr.Balancer())
	assert.Equal(t, uint64(small.refused.Load()), st["small"].TooLong)
	assert.Zero(t, st["small"].Failures)
	for range res.n.Load() {
		if r := <-res.c; r.Endpoint == "small" {
			assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
			assert.Equal(t, 1000, r.Outcome.ContextWindow)
			assert.True(t, r.FailedOver)
		}
	}

	resp, body := post(t, c, chatOf(100, 9000, 200))
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.True(t, strings.HasPrefix(string(body), `{"error":"Input validation error: `+"`inputs` tokens + `max_new_tokens` must be <= "), "the refusal as it came: %s", body)
	for id, s := range statsByID(tr.Balancer()) {
		assert.Zero(t, s.ClientErrors, "%s: a refusal as too long is no client error", id)
	}
}

// TGI checks the prompt and max_new_tokens against max-total-tokens, then
// the prompt alone against max-input-tokens, and refuses a prompt longer
// than that with 422 "`inputs` must have less than W tokens. Given: P"
// (router/src/validation.rs, InputLength): the call goes on to the replica
// whose inputs take it, the refused attempt reported with W.
// tgiBackend is a TGI replica started with --max-input-tokens maxInput
// and --max-total-tokens maxTotal, which checks a call as TGI's router
// does: the prompt and max_new_tokens against the total first, then the
// prompt alone against the input limit.
func tgiBackend(t *testing.T, name string, maxInput, maxTotal int) *windowBackend {
	return newRefusingBackendIf(t, name, func(prompt, out int) bool { return prompt+out > maxTotal || prompt > maxInput },
		func(w http.ResponseWriter, prompt, out int) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			if prompt+out > maxTotal {
				fmt.Fprintf(w, `{"error":"Input validation error: `+"`inputs` tokens + `max_new_tokens` must be <= %d. Given: %d `inputs` tokens and %d `max_new_tokens`"+`","error_type":"validation"}`, maxTotal, prompt, out)
				return
			}
			fmt.Fprintf(w, `{"error":"Input validation error: `+"`inputs` must have less than %d tokens. Given: %d"+`","error_type":"validation"}`, maxInput, prompt)
		})
}

// TGI's limit on the prompt alone (max-input-tokens) was remembered as the
// replica's window for prompt and output: after one long prompt, a short
// prompt asking for a long answer, which the replica takes, passed it over
// for ten minutes (0 of 40 calls), and failed instead of failing over
// when the other replica was down. It is remembered as a limit on prompts.
func TestTGIInputLimitBoundsPromptsOnly(t *testing.T) {
	t.Run("short prompts, long answers still go to it", func(t *testing.T) {
		small, large := tgiBackend(t, "small", 1000, 4096), tgiBackend(t, "large", 8000, 8192)
		tr := newTransport(t, httpbalancer.Options{
			// A fixed AffinitySeed: the 40 chats' keys were placed with
			// the process's random one, and the small replica's count
			// with them: 10 to 29 over 400 seeds, against the bound of 10.
			Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1), AffinitySeed: 1}),
			Endpoints: endpointsOf(small.backend, large.backend),
		})
		c := &http.Client{Transport: tr}
		for i := range 8 {
			resp, body := post(t, c, chatOf(i, 3000, 200))
			require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: %s", i, body)
		}
		require.Positive(t, small.refused.Load(), "the small replica refused a long prompt")
		refused := small.refused.Load()
		toSmall := 0
		for i := range 40 {
			resp, body := post(t, c, chatOf(100+i, 200, 1000))
			require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: %s", i, body)
			if resp.Header.Get("X-Backend") == "small" {
				toSmall++
			}
		}
		assert.Equal(t, refused, small.refused.Load(), "no short prompt was refused")
		assert.GreaterOrEqual(t, toSmall, 10, "calls of 200 prompt and 1000 output tokens the small replica took of 40")
	})
	t.Run("a call fails over to a replica that refused a long prompt", func(t *testing.T) {
		a, b := tgiBackend(t, "a", 1000, 4096), tgiBackend(t, "b", 1000, 4096)
		tr := newTransport(t, httpbalancer.Options{
			Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1)}),
			Endpoints: endpointsOf(a.backend, b.backend),
		})
		c := &http.Client{Transport: tr}
		resp, _ := post(t, c, chatOf(0, 3000, 200))
		require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "a prompt over every replica's input limit")
		require.EqualValues(t, 2, a.refused.Load()+b.refused.Load(), "both refused it")
		a.srv.Close() // a goes down
		for i := range 20 {
			resp, body := post(t, c, chatOf(1+i, 200, 1500))
			require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: %s", i, body)
			assert.Equal(t, "b", resp.Header.Get("X-Backend"))
		}
	})
}

func TestLongPromptsFindTheLargerInputOnTGI(t *testing.T) {
	small, large := tgiBackend(t, "small", 1000, 4096), tgiBackend(t, "large", 8000, 8192)
	res := newResults(64)
	tr := newTransport(t, httpbalancer.Options{
		Balancer:  balancer.New(balancer.Options{Rand: testutil.NewRand(1)}),
		Endpoints: endpointsOf(small.backend, large.backend),
		OnResult:  res.on,
	})
	c := &http.Client{Transport: tr}
	for i := range 8 {
		resp, body := post(t, c, chatOf(i, 3000, 200))
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: %s", i, body)
		assert.Equal(t, "large", resp.Header.Get("X-Backend"))
	}
	require.Positive(t, small.refused.Load(), "the small replica was tried")
	st := statsByID(tr.Balancer())
	assert.Equal(t, uint64(small.refused.Load()), st["small"].TooLong)
	assert.Zero(t, st["small"].Failures)
	for range res.n.Load() {
		if r := <-res.c; r.Endpoint == "small" {
			assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
			assert.Equal(t, 1000, r.Outcome.ContextWindow)
			assert.True(t, r.FailedOver)
		}
	}
}
