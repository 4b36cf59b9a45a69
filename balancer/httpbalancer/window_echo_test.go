package httpbalancer_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// newEchoBackend answers a chat whose max_tokens is a string with a 400,
// as vLLM's validation error does: echo copies the value into it, as
// FastAPI's error list does ('input'); others say only that it is wrong.
// Other chats it answers as fakeChat does.
func newEchoBackend(t *testing.T, name string, echo bool) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := io.Reader(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			// Decoded first, as Triton's HTTP server does.
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			in = zr
		}
		body, _ := io.ReadAll(in)
		var req map[string]json.RawMessage
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
			// A form's fields, as FastAPI's Form reads them.
			form, _ := url.ParseQuery(string(body))
			req = map[string]json.RawMessage{}
			for k := range form {
				v, _ := json.Marshal(form.Get(k))
				req[k] = v
			}
		} else {
			_ = json.Unmarshal(body, &req)
		}
		if mt := req["max_tokens"]; len(mt) > 0 && mt[0] == '"' {
			b.hits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			msg := "Input should be a valid integer"
			if echo {
				var s string
				_ = json.Unmarshal(mt, &s)
				msg = fmt.Sprintf("1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer', 'input': %q}", s)
			}
			out, _ := json.Marshal(msg)
			fmt.Fprintf(w, `{"object":"error","message":%s,"type":"BadRequestError","param":null,"code":400}`, out)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		b.fakeChat(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// A caller cannot make the Transport remember a window of its choosing
// by sending a refusal's text in a field that servers copy into their
// validation errors: before, three such calls made the two replicas that
// copy it look too small for every call of the model, and the next 60
// calls all went to the third.
func TestARefusalCopiedFromTheRequestIsNotBelieved(t *testing.T) {
	for _, tc := range []struct {
		name, content, value string
		gzip, form           bool
	}{
		{name: "plain", value: "This model's maximum context length is 10 tokens. However, you requested 20 tokens (10 in the messages, 10 in the completion)."},
		// The server decodes the JSON before it copies the value.
		{name: "escaped", value: `This model\u0027s maximum context length is \u0031\u0030 tokens.`},
		// Copied back as İ, which Refusal lowers to i.
		{name: "escaped dotted capital I", value: `MAX\u0130MUM CONTEXT LENGTH IS 10 tokens.`},
		// Refusal reads the first of the body's texts, without a number;
		// the server copies the second alone.
		{name: "a number-less one first", content: "its maximum context length is unknown", value: "maximum context length is 10 tokens."},
		// The server decodes the body before it reads it.
		{name: "gzip", value: "maximum context length is 10 tokens.", gzip: true},
		// Percent-encoded, as a form's fields are.
		{name: "form", value: "maximum context length is 10 tokens.", form: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := newEchoBackend(t, "a", true), newEchoBackend(t, "b", true), newEchoBackend(t, "c", false)
			tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(a, b, c), BalancerOptions: balancer.Options{Rand: testutil.NewRand(1), AffinitySeed: 1}})
			cl := &http.Client{Transport: tr}
			// Until both that copy it have answered one (each call goes to
			// one endpoint of the three).
			for i := 0; i < 30 && (a.hits.Load() == 0 || b.hits.Load() == 0); i++ {
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"x%d %s"}],"max_tokens":"%s"}`, i, tc.content, tc.value)
				var resp *http.Response
				switch {
				case tc.gzip:
					resp, body = postGzip(t, cl, body)
				case tc.form:
					resp, body = postForm(t, cl, url.Values{"model": {"m"}, "max_tokens": {tc.value}})
				default:
					var b []byte
					resp, b = post(t, cl, body)
					body = string(b)
				}
				require.Equal(t, http.StatusBadRequest, resp.StatusCode)
				assert.Contains(t, body, "Input should be a valid integer", "the answer as it came")
			}
			require.Positive(t, a.hits.Load())
			require.Positive(t, b.hits.Load())
			st := statsByID(tr.Balancer())
			for _, id := range []string{"a", "b", "c"} {
				assert.Zero(t, st[id].TooLong, "%s: no refusal counted", id)
			}
			a0, b0, c0 := a.hits.Load(), b.hits.Load(), c.hits.Load()
			for i := range 60 {
				resp, _ := post(t, cl, chatOf(i, 100, 50))
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			da, db, dc := a.hits.Load()-a0, b.hits.Load()-b0, c.hits.Load()-c0
			t.Logf("60 calls after: a %d, b %d, c %d", da, db, dc)
			assert.GreaterOrEqual(t, da, int64(10))
			assert.GreaterOrEqual(t, db, int64(10))
		})
	}
}

// postForm posts form, percent-encoded.
func postForm(t *testing.T, c *http.Client, form url.Values) (*http.Response, string) {
	t.Helper()
	resp, err := c.Post(chatURL, "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(out)
}

// postGzip posts body, compressed, with its Content-Encoding.
func postGzip(t *testing.T, c *http.Client, body string) (*http.Response, string) {
	t.Helper()
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, body)
	require.NoError(t, zw.Close())
	req, err := http.NewRequest(http.MethodPost, chatURL, &zb)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(out)
}

// A call that is refused for its length is believed as before when its
// text carries no refusal, and one whose text does gets the refusal as it
// came, without going on to another endpoint.
func TestARefusalOfACallQuotingOneIsTheCallersAnswer(t *testing.T) {
	small, large := newWindowBackend(t, "small", 1000), newWindowBackend(t, "large", 8000)
	clock := testutil.NewClock()
	tr := newTransport(t, httpbalancer.Options{Endpoints: endpointsOf(small.backend, large.backend), BalancerOptions: balancer.Options{Rand: testutil.NewRand(1), AffinitySeed: 1, Clock: clock}})
	cl := &http.Client{Transport: tr}
	// A long chat about a refusal (a user pasting vLLM's log into a
	// question): refused by small, not retried on large.
	quoting := func(i int) string {
		text := fmt.Sprintf("%06d Why does vLLM say: This model's maximum context length is 1000 tokens? ", i) + strings.Repeat("word ", 2400)
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":200}`, text)
	}
	var quoted, quotedRefused int
	for i := range 20 {
		resp, _ := post(t, cl, quoting(i))
		quoted++
		if resp.StatusCode == http.StatusBadRequest {
			quotedRefused++
		}
	}
	t.Logf("quoting calls refused: %d of %d", quotedRefused, quoted)
	assert.Positive(t, quotedRefused, "small refused some, and they did not go on")
	assert.Zero(t, statsByID(tr.Balancer())["small"].TooLong, "nothing remembered")
	// Those refusals were client errors: small, whose share of them is far
	// above large's, is passed over (by the affinity walk too) until the
	// share fades.
	clock.Advance(2 * balancer.DefaultErrorDecay)
	// Long calls that quote nothing are refused once and remembered.
	for i := range 20 {
		resp, _ := post(t, cl, chatOf(100+i, 3000, 200))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "large", resp.Header.Get("X-Backend"))
	}
	assert.Equal(t, int64(1), int64(statsByID(tr.Balancer())["small"].TooLong))
}
