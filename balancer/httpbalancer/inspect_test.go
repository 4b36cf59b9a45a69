package httpbalancer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/cache"
)

func inspect(path, body string, complete bool) httpbalancer.Info {
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
	var info httpbalancer.Info
	(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body), complete, &info)
	return info
}

func TestServiceForPath(t *testing.T) {
	for path, want := range map[string]inferlb.Service{
		"/v1/chat/completions":          inferlb.ServiceLLM,
		"/v1/completions":               inferlb.ServiceLLM,
		"/v1/responses":                 inferlb.ServiceLLM,
		"/v1/messages":                  inferlb.ServiceLLM,
		"/v1/messages/count_tokens":     inferlb.ServiceUnknown,
		"/openai/v1/chat/completions/":  inferlb.ServiceLLM,
		"/generate_stream":              inferlb.ServiceLLM,
		"/v1/embeddings":                inferlb.ServiceEmbedding,
		"/embed":                        inferlb.ServiceEmbedding,
		"/classify":                     inferlb.ServiceEmbedding,
		"/pooling":                      inferlb.ServiceEmbedding,
		"/api/chat":                     inferlb.ServiceLLM,
		"/api/embed":                    inferlb.ServiceEmbedding,
		"/completion":                   inferlb.ServiceLLM,
		"/infill":                       inferlb.ServiceLLM,
		"/embedding":                    inferlb.ServiceEmbedding,
		"/reranking":                    inferlb.ServiceRerank,
		"/v1/audio/transcriptions":      inferlb.ServiceUnknown,
		"/rerank":                       inferlb.ServiceRerank,
		"/v1/rerank":                    inferlb.ServiceRerank,
		"/v2/rerank":                    inferlb.ServiceRerank,
		"/v1/score":                     inferlb.ServiceRerank,
		"/score":                        inferlb.ServiceRerank,
		"/v1/models":                    inferlb.ServiceUnknown,
		"/v1/responses/resp_123/cancel": inferlb.ServiceUnknown,
		"":                              inferlb.ServiceUnknown,
		"completions":                   inferlb.ServiceLLM,
	} {
		assert.Equal(t, want, httpbalancer.ServiceForPath(path), path)
	}
}

func TestInspectFields(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		complete         bool
		model            string
		stream           bool
		maxOut, prompt   int
		keyed            bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there, how are you?"}],"stream":true,"max_tokens":64}`, true, "llama", true, 64, 8, true},
		{"chat parts", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"},{"type":"image_url","image_url":{"url":"x"}}]}],"model":"vl","max_completion_tokens":9}`, true, "vl", false, 9, 2, true},
		{"completions", "/v1/completions", `{"model":"m","prompt":"0123456789abcdef","max_tokens":5,"stream":false}`, true, "m", false, 5, 4, true},
		{"completions token ids", "/v1/completions", `{"model":"m","prompt":[1,2,3,4]}`, true, "m", false, 0, 4, true},
		{"responses string", "/v1/responses", `{"model":"m","input":"0123456789abcdef","instructions":"abcd","max_output_tokens":77}`, true, "m", false, 77, 5, true},
		{"responses items", "/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"abcdefgh"}]}]}`, true, "m", false, 0, 2, true},
		{"embeddings", "/v1/embeddings", `{"model":"e5","input":["abcd","efgh"]}`, true, "e5", false, 0, 2, false},
		{"rerank", "/v1/rerank", `{"model":"bge","query":"abcd","documents":["abcdefgh",{"text":"abcd"}]}`, true, "bge", false, 0, 4, false},
		// vLLM's score API: two sides, each a string or a list, read as a
		// rerank's query and documents (text_1 and text_2; queries and
		// documents; data_1 and data_2).
		{"score", "/score", `{"model":"bge","text_1":"abcd","text_2":["abcdefgh","abcd"]}`, true, "bge", false, 0, 4, false},
		{"score lists", "/v1/score", `{"model":"bge","text_1":["abcd","abcd"],"text_2":["abcdefgh","abcd"]}`, true, "bge", false, 0, 5, false},
		{"score queries", "/v1/score", `{"model":"bge","queries":"abcd","documents":["abcdefgh","abcd"]}`, true, "bge", false, 0, 4, false},
		{"score data", "/v1/score", `{"model":"bge","data_1":"abcdefgh","data_2":"abcdefgh"}`, true, "bge", false, 0, 4, false},
		{"tgi", "/generate", `{"inputs":"abcdefgh","parameters":{"max_new_tokens":12}}`, true, "", false, 12, 2, true},
		// SGLang's native generate; its Responses-API namesake "text" is an object.
		{"sglang", "/generate", `{"text":"abcdefgh","sampling_params":{"temperature":0,"max_new_tokens":12},"stream":true}`, true, "", true, 12, 2, true},
		{"sglang token ids", "/generate", `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":7}}`, true, "", false, 7, 3, true},
		{"sglang n", "/generate", `{"text":"hi","sampling_params":{"max_new_tokens":7,"n":3}}`, true, "", false, 21, 0, true},
		{"responses text format", "/v1/responses", `{"model":"m","input":"abcdefgh","text":{"format":{"type":"json_schema","schema":{"x":"abcdefghijklmnop"}}}}`, true, "m", false, 0, 2, true},
		{"triton generate", "/v2/models/ensemble/generate", `{"text_input":"abcdefgh","max_tokens":20,"stream":false}`, true, "ensemble", false, 20, 2, true},
		{"triton versioned stream behind a gateway", "/gw/v2/models/llama/versions/3/generate_stream", `{"text_input":"abcd","max_tokens":8,"stream":true}`, true, "llama", true, 8, 1, true},
		{"triton path names the model", "/v2/models/a/generate", `{"model":"b","text_input":"abcd"}`, true, "a", false, 0, 1, true},
		{"triton infer", "/v2/models/bert/infer", `{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":["hi"]}]}`, true, "bert", false, 0, 0, false},
		{"triton no body", "/v2/models/bert/ready", ``, true, "bert", false, 0, 0, false},
		{"escapes", "/v1/chat/completions", `{"model":"a\"b","messages":[{"role":"user","content":"\u00e9t\u00e9"}]}`, true, `a"b`, false, 0, 1, true}, // "été": 5 bytes
		{"truncated", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"abcd"},{"role":"user","content":"ab`, false, "m", true, 0, 1000, true},
		{"not json", "/v1/chat/completions", `hello`, true, "", false, 0, 0, false},
		{"model not a string", "/v1/chat/completions", `{"model":5,"stream":"maybe","max_tokens":-3}`, true, "", false, 0, 0, false},
		{"huge max_tokens", "/v1/chat/completions", `{"max_tokens":99999999999999999999}`, true, "", false, 0, 0, false},
		// n choices are generated up to the bound each.
		{"n choices", "/v1/chat/completions", `{"messages":[{"role":"user","content":"abcd"}],"max_completion_tokens":100,"n":4}`, true, "", false, 400, 1, true},
		{"n choices, completions", "/v1/completions", `{"model":"m","n":3,"prompt":"abcd","max_tokens":10}`, true, "m", false, 30, 1, true},
		{"n of 1, 0 or not a count", "/v1/chat/completions", `{"max_tokens":10,"n":0,"n":1.5}`, true, "", false, 10, 0, false},
		{"n beyond the APIs' 128", "/v1/chat/completions", `{"max_tokens":10,"n":1000000}`, true, "", false, 1280, 0, false},
		// vLLM and SGLang (pydantic) take a whole number written as a
		// float or with an exponent for an integer: as Python's
		// json.dumps writes a bound computed as a float (1024.0).
		{"whole float bound", "/v1/chat/completions", `{"max_tokens":32.0}`, true, "", false, 32, 0, false},
		{"exponent bound and n", "/v1/chat/completions", `{"max_completion_tokens":1e3,"n":2.0}`, true, "", false, 2000, 0, false},
		{"float sampling_params", "/generate", `{"text":"abcd","sampling_params":{"max_new_tokens":1.5E2,"n":2e0}}`, true, "", false, 300, 1, true},
		{"fractional or negative bound", "/v1/chat/completions", `{"max_tokens":32.5,"max_output_tokens":-1e2,"max_new_tokens":1e10}`, true, "", false, 0, 0, false},
		// And a count written as a string of its digits (a bound read
		// from an environment variable, sent unconverted).
		{"bound and n as strings", "/v1/chat/completions", `{"max_tokens":"512","n":" 2 "}`, true, "", false, 1024, 0, false},
		{"string sampling_params", "/generate", `{"text":"abcd","sampling_params":{"max_new_tokens":"64.0","n":"3"}}`, true, "", false, 192, 1, true},
		// As pydantic reads such a string: a '+', white space, underscores
		// between digits, escapes decoded (see intString).
		{"bound and n as pydantic reads them", "/v1/chat/completions", `{"max_tokens":" +1_024.0 ","n":"\t2"}`, true, "", false, 2048, 0, false},
		{"strings that are no count", "/v1/chat/completions", `{"max_tokens":"5x","max_completion_tokens":"-7","max_output_tokens":"1.5","max_new_tokens":"99999999999","n":"2"}`, true, "", false, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, strings.NewReader(tc.body))
			if !tc.complete {
				r.ContentLength = 4000 // the whole body, of which the peek saw a part
			}
			var info httpbalancer.Info
			(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(tc.body), tc.complete, &info)
			assert.Equal(t, httpbalancer.ServiceForPath(tc.path), info.Service)
			assert.Equal(t, tc.model, info.Model)
			assert.Equal(t, tc.stream, info.Stream)
			assert.Equal(t, tc.maxOut, info.MaxOutputTokens)
			assert.Equal(t, tc.prompt, info.PromptTokens)
			assert.Equal(t, tc.keyed, info.AffinityKey != 0, "affinity key %x", info.AffinityKey)
		})
	}
}

func TestInspectAffinity(t *testing.T) {
	const path = "/v1/chat/completions"
	conv := `{"model":"m","messages":[{"role":"user","content":"tell me a story"}]}`
	k1 := inspect(path, conv, true).AffinityKey
	// Same conversation, fields in another order and spacing: same key.
	k2 := inspect(path, `{ "messages" : [ {"content":"tell me a story", "role":"user"} ], "model":"m", "stream": true }`, true).AffinityKey
	assert.Equal(t, k1, k2)
	assert.NotEqual(t, k1, inspect(path, strings.Replace(conv, `"m"`, `"other"`, 1), true).AffinityKey, "model is part of the key")
	assert.NotEqual(t, k1, inspect(path, strings.Replace(conv, "story", "joke", 1), true).AffinityKey)
	// prompt_cache_key is an explicit session and wins over the prompt.
	withKeyInfo := inspect(path, `{"model":"m","prompt_cache_key":"s1","messages":[{"role":"user","content":"x"}]}`, true)
	withKey := withKeyInfo.AffinityKey
	assert.Equal(t, cache.NewKeyer(42).Session("s1"), withKey)
	assert.True(t, withKeyInfo.Session, "prompt_cache_key is an explicit session")
	assert.False(t, inspect(path, conv, true).Session, "a prompt hash is not")
	// A Responses API conversation names its session, in either form;
	// prompt_cache_key still wins.
	const rpath = "/v1/responses"
	inConvInfo := inspect(rpath, `{"model":"m","conversation":"conv_7","input":"first"}`, true)
	inConv := inConvInfo.AffinityKey
	assert.Equal(t, cache.NewKeyer(42).Session("conv_7"), inConv)
	assert.True(t, inConvInfo.Session)
	assert.Equal(t, inConv, inspect(rpath, `{"model":"m","conversation":{"id":"conv_7"},"input":"second"}`, true).AffinityKey)
	assert.Equal(t, withKey, inspect(rpath, `{"model":"m","conversation":"conv_7","prompt_cache_key":"s1","input":"x"}`, true).AffinityKey)
	// A Responses conversation that starts with a string input and goes
	// on with input items (the history resent) keeps its key, with or
	// without instructions; and it is keyed as the same chat would be.
	first := inspect(rpath, `{"model":"m","input":"tell me a story"}`, true).AffinityKey
	next := inspect(rpath, `{"model":"m","input":[{"role":"user","content":"tell me a story"},{"role":"assistant","content":"once"},{"role":"user","content":"more"}]}`, true).AffinityKey
	assert.NotZero(t, first)
	assert.Equal(t, first, next)
	assert.Equal(t, first, inspect(path, `{"model":"m","messages":[{"role":"user","content":"tell me a story"}]}`, true).AffinityKey)
	// Tool results (function_call_output items) are keyed on what they
	// carry: unrelated ones must not share one key and pile on its owner.
	outA := inspect(rpath, `{"model":"m","previous_response_id":"resp_a","input":[{"type":"function_call_output","call_id":"c1","output":"{\"temp\":21}"}]}`, true).AffinityKey
	outB := inspect(rpath, `{"model":"m","previous_response_id":"resp_b","input":[{"type":"function_call_output","call_id":"c9","output":"totally different"}]}`, true).AffinityKey
	assert.NotEqual(t, outA, outB)
	// Images are part of the prompt: the same question about two images
	// is two prompts (the server's prefix cache keeps them apart too).
	img := func(url string) uint64 {
		return inspect(path, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+url+`"}},{"type":"text","text":"Describe this image."}]}]}`, true).AffinityKey
	}
	assert.NotEqual(t, img("https://x/cat.png"), img("https://x/dog.png"))
	assert.Equal(t, img("https://x/cat.png"), img("https://x/cat.png"))
	rimg := func(url string) uint64 {
		return inspect(rpath, `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"`+url+`"},{"type":"input_text","text":"Describe this image."}]}]}`, true).AffinityKey
	}
	assert.NotEqual(t, rimg("data:image/png;base64,AAAA"), rimg("data:image/png;base64,BBBB"))
	// Text parts are joined with "\n" as servers render them, also after an
	// empty part: ["", "x"] is the prompt "\nx", not "x".
	parts := inspect(path, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"x"}]}]}`, true).AffinityKey
	assert.NotEqual(t, inspect(path, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, true).AffinityKey, parts)
	assert.Equal(t, inspect(path, `{"model":"m","messages":[{"role":"user","content":"\nx"}]}`, true).AffinityKey, parts)
	// A repeated "messages" replaces the first, as encoding/json reads it.
	assert.Equal(t, inspect(path, `{"model":"m","messages":[{"role":"user","content":"y"}]}`, true).AffinityKey,
		inspect(path, `{"model":"m","messages":[{"role":"user","content":"x"}],"messages":[{"role":"user","content":"y"}]}`, true).AffinityKey)
	// On a Triton path the key is scoped to the path's model, as the
	// server's cache is.
	const tgen = `{"text_input":"tell me a story","max_tokens":9}`
	assert.NotEqual(t, inspect("/v2/models/a/generate", tgen, true).AffinityKey, inspect("/v2/models/b/generate", tgen, true).AffinityKey)
	assert.Equal(t, inspect("/v2/models/a/generate", tgen, true).AffinityKey, inspect("/v2/models/a/versions/2/generate_stream", tgen, true).AffinityKey)
	// No Keyer: no prompt affinity.
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, nil)
	var info httpbalancer.Info
	(&httpbalancer.OpenAI{}).Inspect(r, []byte(conv), true, &info)
	assert.Zero(t, info.AffinityKey)
	assert.Equal(t, "m", info.Model)
}

// TestInspectMessagesAPI: the Anthropic Messages API (/v1/messages, which
// vLLM, SGLang and llama.cpp serve, and Claude Code and the Anthropic SDKs
// call) is an LLM call, keyed as the same chat would be: its top-level
// system, a string or text blocks, is the system message. Unclassified, it
// was scored on latency and routed without prefix affinity.
func TestInspectMessagesAPI(t *testing.T) {
	const path = "/v1/messages"
	info := inspect(path, `{"model":"m","max_tokens":1024,"system":"You are terse.","messages":[{"role":"user","content":"tell me a story"}],"stream":true}`, true)
	assert.Equal(t, inferlb.ServiceLLM, info.Service)
	assert.Equal(t, "m", info.Model)
	assert.True(t, info.Stream)
	assert.Equal(t, 1024, info.MaxOutputTokens)
	assert.Equal(t, (len("You are terse.")+len("tell me a story"))/4, info.PromptTokens)
	chat := inspect("/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"tell me a story"}]}`, true).AffinityKey
	assert.Equal(t, chat, info.AffinityKey)
	// System as text blocks, later turns, content blocks: the same key.
	assert.Equal(t, chat, inspect(path, `{"model":"m","max_tokens":9,"system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],`+
		`"messages":[{"role":"user","content":[{"type":"text","text":"tell me a story"}]},{"role":"assistant","content":"Once"},{"role":"user","content":"more"}]}`, true).AffinityKey)
	// Another system prompt is another prefix.
	assert.NotEqual(t, chat, inspect(path, `{"model":"m","system":"You are verbose.","messages":[{"role":"user","content":"tell me a story"}]}`, true).AffinityKey)
	// The same question about two images is two prompts.
	img := func(data string) uint64 {
		return inspect(path, `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+data+`"}},{"type":"text","text":"Describe this image."}]}]}`, true).AffinityKey
	}
	assert.NotEqual(t, img("AAAA"), img("BBBB"))
	assert.Equal(t, img("AAAA"), img("AAAA"))
}

// TestSessionHeaderWins: a session header replaces the prompt key, and the
// tenant header fills Tenant (seen through a custom Inspector wrapper).
func TestSessionHeaderWins(t *testing.T) {
	a := newBackend(t, "a")
	keyer := cache.NewKeyer(7)
	seen := make(chan inferlb.Request, 2)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:    endpointsOf(a),
		Keyer:        keyer,
		TenantHeader: "x-org",
		OnResult:     func(r httpbalancer.Result) { seen <- r.Request },
	})
	req, _ := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, false)))
	req.Header.Set("X-Session-Id", "conv-9")
	req.Header.Set("X-Org", "acme")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	got := <-seen
	assert.Equal(t, keyer.Session("conv-9"), got.AffinityKey)
	assert.True(t, got.Session, "an explicit session: followed whatever prompt keys do")
	assert.Equal(t, "acme", got.Tenant)
	assert.Equal(t, "m", got.Model)
	assert.Equal(t, 16, got.MaxOutputTokens)
}

// TestCustomInspector: a non-OpenAI API plugs in its own classification.
func TestCustomInspector(t *testing.T) {
	a := newBackend(t, "a")
	seen := make(chan inferlb.Request, 1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(a),
		Inspector: httpbalancer.InspectorFunc(func(r *http.Request, body []byte, complete bool, info *httpbalancer.Info) {
			info.Service = inferlb.ServiceEmbedding
			info.Model = r.Header.Get("X-Model")
		}),
		OnResult: func(r httpbalancer.Result) { seen <- r.Request },
	})
	req, _ := http.NewRequest(http.MethodPost, "http://llm.internal/custom", strings.NewReader("binary"))
	req.Header.Set("X-Model", "clip")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	got := <-seen
	assert.Equal(t, inferlb.ServiceEmbedding, got.Service)
	assert.Equal(t, "clip", got.Model)
}

// TestCustomInspectorSeesTheCallersRequest: only the default inspector
// reads past the peek, so with another one a large replayable body is not
// copied through GetBody: the inspector gets the caller's own request, and
// the caller's body is what is sent.
func TestCustomInspectorSeesTheCallersRequest(t *testing.T) {
	a := newBackend(t, "a")
	var inspected *http.Request
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: endpointsOf(a),
		MaxPeek:   16,
		Inspector: httpbalancer.InspectorFunc(func(r *http.Request, body []byte, complete bool, info *httpbalancer.Info) {
			inspected = r
		}),
	})
	body := chatBody(1, false)
	req, _ := http.NewRequest(http.MethodPost, chatURL, wrapper{io.NopCloser(strings.NewReader(body))})
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) {
		t.Error("GetBody called on the first attempt")
		return io.NopCloser(strings.NewReader(body)), nil
	}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Same(t, req, inspected)
	assert.Equal(t, fmt.Sprint(len(body)), resp.Header.Get("X-Body-Len"))
}

// FuzzInspect: no body makes inspection panic or produce negative work,
// whole or cut anywhere; on valid JSON the fields agree with encoding/json
// (stream as pydantic's lax mode reads encoding/json's value: laxBool).
func FuzzInspect(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}],"instructions":"y"}`,
		`{"prompt":[[1,2],[3]],"model":"m"}`,
		`{"model":"a","model":"b","stream":true,"stream":false}`,
		`[[[[[[[[[[[[[[[[[[[[`,
		`{"messages":[{"content":[{"text":"\ud83d\ude00"}]}]}`,
		`{"model":"\x`,
		"",
		`{"model":"m","max_tokens":9,"n":2,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"QUJD"}},{"type":"input_audio","input_audio":{"data":"QUJD","format":"wav"}},{"type":"text","text":"q\u00e9"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":{"url":{"url":"x"}}}}]}]}`,
		`{"stream":"YES","model":"m","stream":1.0}`, `{"stream":"yeſ"}`, `{"stream":0,"stream":"on"}`, `{"stream":10e-1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings"} {
			for cut := range []int{0, 1} {
				b, complete := body, true
				if cut == 1 {
					b, complete = body[:len(body)/2], false
				}
				r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, nil)
				var info httpbalancer.Info
				(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(1)}).Inspect(r, b, complete, &info)
				if info.PromptTokens < 0 || info.MaxOutputTokens < 0 || info.Tokens() < 0 {
					t.Fatalf("negative work: %+v", info.Request)
				}
			}
		}
		var m map[string]any
		if !utf8.Valid(body) || strings.Contains(string(body), `\`) || json.Unmarshal(body, &m) != nil {
			return
		}
		info := inspect("/v1/chat/completions", string(body), true)
		model, _ := m["model"].(string)
		stream := laxBool(m["stream"])
		if info.Model != model || info.Stream != stream {
			t.Fatalf("inspector read model %q stream %v; encoding/json %q %v", info.Model, info.Stream, model, stream)
		}
	})
}

// laxBool is what pydantic's lax mode, with which vLLM and SGLang validate
// a request, makes of v (as encoding/json decodes it) for a bool field:
// true for true, the number 1 and the strings "1", "t", "y", "on", "yes"
// and "true" in any ASCII case; anything else is false or refused.
func laxBool(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case float64:
		return v == 1
	case string:
		lower := strings.Map(func(r rune) rune {
			if 'A' <= r && r <= 'Z' {
				return r + 'a' - 'A'
			}
			return r
		}, v)
		return slices.Contains([]string{"1", "t", "y", "on", "yes", "true"}, lower)
	}
	return false
}

// TestInspectKeysAFirstTurnCutByThePeek: a first user message longer than
// the peek (a photo as a data URL, a pasted document) is keyed on the part
// the peek holds, as it is when the body is whole. Left out, every such
// conversation of an application got the key of its system prompt alone
// (or none), and all of them piled onto that key's owner.
func TestInspectKeysAFirstTurnCutByThePeek(t *testing.T) {
	const path, peek = "/v1/chat/completions", 1 << 20
	keyOf := func(body string) uint64 {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:min(peek, len(body))]), len(body) <= peek, &info)
		require.Equal(t, "m", info.Model)
		return info.AffinityKey
	}
	sys := `{"role":"system","content":"You describe photos."}`
	photo := func(seed string, roleFirst bool, later string) string {
		content := `[{"type":"text","text":"What is in this photo?"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` +
			strings.Repeat(seed, 2<<20/len(seed)) + `"}}]`
		user := `{"content":` + content + `,"role":"user"}`
		if roleFirst {
			user = `{"role":"user","content":` + content + `}`
		}
		return `{"messages":[` + sys + `,` + user + later + `],"model":"m","max_completion_tokens":300}`
	}
	const turn2 = `,{"role":"assistant","content":"A cat."},{"role":"user","content":"What colour?"}`
	for _, roleFirst := range []bool{true, false} {
		cat, dog := keyOf(photo("Y2F0", roleFirst, "")), keyOf(photo("ZG9n", roleFirst, ""))
		assert.NotZero(t, cat)
		assert.NotEqual(t, cat, dog, "two photos, role first %v", roleFirst)
		assert.Equal(t, cat, keyOf(photo("Y2F0", roleFirst, turn2)), "a later turn, role first %v", roleFirst)
	}
	// A document longer than the peek: the key covers its first Depth
	// characters, whole or cut.
	doc := func(text string) string {
		return `{"messages":[` + sys + `,{"role":"user","content":"` + strings.Repeat(text, 2<<20/len(text)) + `"}],"model":"m"}`
	}
	whole := func(body string) uint64 {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body), true, &info)
		return info.AffinityKey
	}
	a, b := doc("Call me Ishmael. "), doc("It was a dark and stormy night.\\n")
	assert.Equal(t, whole(a), keyOf(a))
	assert.Equal(t, whole(b), keyOf(b))
	assert.NotEqual(t, keyOf(a), keyOf(b))
}

// TestInspectKeysAPromptCutByThePeek: a prompt (completions, SGLang's
// text) or a Responses API string input longer than the peek keys on what
// the peek holds of it, as a chat message does: its first Depth
// characters, as whole. It keyed nothing: a completions prompt had no
// affinity, and every Responses call of an application with such an input
// got the key of its instructions alone, all on one endpoint, and another
// than its follow-up turns (which resend the input as an item) went to.
func TestInspectKeysAPromptCutByThePeek(t *testing.T) {
	const peek = 1 << 20
	keyOf := func(path, body string, cut bool) uint64 {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		b := []byte(body)
		if cut {
			b = b[:peek]
		}
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, b, !cut, &info)
		return info.AffinityKey
	}
	long := func(text string) string { return strings.Repeat(text, 2<<20/len(text)) }
	a, b := long("Call me Ishmael. "), long("It was a dark and stormy night.\\n")
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"%s","model":"m","max_tokens":5}`},
		{"/v1/completions", `{"prompt":["%s"],"model":"m","max_tokens":5}`},
		{"/generate", `{"text":"%s","sampling_params":{"max_new_tokens":5}}`},
		{"/v1/responses", `{"input":"%s","instructions":"Summarize.","model":"m"}`},
	} {
		bodyA, bodyB := fmt.Sprintf(c.body, a), fmt.Sprintf(c.body, b)
		keyA := keyOf(c.path, bodyA, true)
		assert.NotZero(t, keyA, c.body)
		assert.Equal(t, keyOf(c.path, bodyA, false), keyA, "%s: cut and whole", c.body)
		assert.Equal(t, keyOf(c.path, bodyB, false), keyOf(c.path, bodyB, true), "%s: cut and whole", c.body)
		assert.NotEqual(t, keyA, keyOf(c.path, bodyB, true), "%s: two documents", c.body)
	}
	// The next turn resends the input as an item: the conversation keeps
	// its key.
	turn2 := `{"input":[{"role":"user","content":"` + a + `"},{"role":"assistant","content":"A whale."},{"role":"user","content":"Whose?"}],"instructions":"Summarize.","model":"m"}`
	assert.Equal(t, keyOf("/v1/responses", `{"input":"`+a+`","instructions":"Summarize.","model":"m"}`, true),
		keyOf("/v1/responses", turn2, true))
}

// TestInspectKeysASystemPastThePeek: the Anthropic SDKs write a Messages
// API body's "system" after its "messages", and openai-python a Responses
// API body's "instructions" after its "input" (both in their arguments'
// alphabetical order). A conversation keyed on its system prompt and first
// turn while its body fit the peek must keep that key once its later turns
// (a pasted log, a screenshot) outgrow the peek: the system prompt is then
// read from the rest of a body held in memory. It was not, so the key lost
// the system prompt and the conversation, at its longest, moved to an
// endpoint without its KV cache. The system prompts here (40 KB, like a
// coding agent's) are larger than other members read past the peek.
func TestInspectKeysASystemPastThePeek(t *testing.T) {
	const peek = 64 << 10
	keyOf := func(path, body string) uint64 {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:min(peek, len(body))]), len(body) <= peek, &info)
		require.Equal(t, "m", info.Model)
		return info.AffinityKey
	}
	sys := strings.Repeat("You are a careful coding agent. ", 40<<10/32)
	log := strings.Repeat("tool output line\\n", 200<<10/18)
	for _, tc := range []struct {
		path, list, system string
	}{
		{"/v1/messages", "messages", `"system":"` + sys + `"`},
		{"/v1/messages", "messages", `"system":[{"type":"text","text":"` + sys + `","cache_control":{"type":"ephemeral"}}]`},
		{"/v1/responses", "input", `"instructions":"` + sys + `"`},
	} {
		first := `{"max_tokens":1024,"` + tc.list + `":[{"role":"user","content":"fix the build"}],"model":"m",` + tc.system + `}`
		later := `{"max_tokens":1024,"` + tc.list + `":[{"role":"user","content":"fix the build"},{"role":"assistant","content":"running it"},` +
			`{"role":"user","content":"` + log + `"}],"model":"m",` + tc.system + `}`
		require.Less(t, len(first), peek)
		require.Greater(t, len(later), peek)
		k1 := keyOf(tc.path, first)
		assert.Equal(t, k1, keyOf(tc.path, later), "%s %.40s", tc.path, tc.system)
		other := strings.Replace(later, "careful", "CAREFUL", 1)
		assert.NotEqual(t, keyOf(tc.path, later), keyOf(tc.path, other), "another system prompt, %s", tc.path)
	}
}

// TestInspectEstimatesAStreamedBodyWithoutItsBase64: a body larger than the
// peek that is not in memory (a gateway forwarding its client's upload) is
// estimated from its size, but not from the size of the base64 the peek
// shows it to carry. Taken whole, a 3 MB photo made 786,000 prompt tokens,
// charged to its endpoint for the life of the call.
func TestInspectEstimatesAStreamedBodyWithoutItsBase64(t *testing.T) {
	const peek = 1 << 20
	blob := strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", 3<<20/24)
	text := strings.Repeat("All work and no play makes Jack a dull boy. ", 3<<20/44)
	for _, tc := range []struct {
		name     string
		body     string
		min, max int
	}{
		{"photo", `{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this photo?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + blob + `"}}]}],"model":"m"}`, 5, 1000},
		{"recording", `{"messages":[{"role":"user","content":[{"type":"text","text":"Transcribe."},{"type":"input_audio","input_audio":{"data":"` + blob + `","format":"wav"}}]}],"model":"m"}`, 2, 1000},
		{"document", `{"messages":[{"role":"user","content":"` + text + `"}],"model":"m"}`, len(text) / 4, len(text)/4 + 100},
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions", io.MultiReader(strings.NewReader(tc.body)))
		r.ContentLength = int64(len(tc.body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(tc.body[:peek]), false, &info)
		assert.GreaterOrEqual(t, info.PromptTokens, tc.min, tc.name)
		assert.LessOrEqual(t, info.PromptTokens, tc.max, tc.name)
	}
}

// TestInspectOllamaImages: Ollama's native calls carry photos as base64
// strings in an "images" list (a message's on /api/chat, the body's on
// /api/generate). They count in the key as image parts do, so two photos
// with one question are two prompts; they did not, and every photo asked
// about alike shared one key and one endpoint. And past the
// peek they are not prompt text: a 3 MB photo counted 786,000 prompt
// tokens, in memory or streamed.
func TestInspectOllamaImages(t *testing.T) {
	const peek = 1 << 20
	photo := func(seed string) string { return strings.Repeat(seed, 3<<20/len(seed)) }
	chat := func(img string) string {
		return `{"model":"llava","messages":[{"role":"user","content":"What is in this photo?","images":["` + img + `"]}],"stream":false}`
	}
	generate := func(img string) string {
		return `{"model":"llava","prompt":"What is in this photo?","images":["` + img + `"],"stream":false}`
	}
	for _, inMemory := range []bool{true, false} {
		for _, tc := range []struct {
			path string
			body func(string) string
		}{{"/api/chat", chat}, {"/api/generate", generate}} {
			body := tc.body(photo("Y2F0"))
			var r *http.Request
			if inMemory {
				r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, strings.NewReader(body))
			} else {
				r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, io.MultiReader(strings.NewReader(body)))
				r.ContentLength = int64(len(body))
			}
			var info httpbalancer.Info
			(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:peek]), false, &info)
			assert.Equal(t, "llava", info.Model)
			assert.LessOrEqual(t, info.PromptTokens, 1000, "%s, in memory %v", tc.path, inMemory)
		}
	}
	for _, img := range []func(string) string{photo, func(s string) string { return s + s }} {
		for _, tc := range []struct {
			path string
			body func(string) string
		}{{"/api/chat", chat}, {"/api/generate", generate}} {
			cat, dog := inspect(tc.path, tc.body(img("Y2F0")), true), inspect(tc.path, tc.body(img("ZG9n")), true)
			assert.NotZero(t, cat.AffinityKey)
			assert.NotEqual(t, cat.AffinityKey, dog.AffinityKey, "%s: two photos", tc.path)
			assert.Equal(t, cat.AffinityKey, inspect(tc.path, tc.body(img("Y2F0")), true).AffinityKey, "%s: one photo", tc.path)
		}
	}
	// Without images, /api/generate keys as any prompt does.
	assert.Equal(t, inspect("/v1/completions", `{"model":"llava","prompt":"What is in this photo?"}`, true).AffinityKey,
		inspect("/api/generate", `{"model":"llava","prompt":"What is in this photo?","images":[],"stream":false}`, true).AffinityKey)
}

// TestInspectReadsPlainStringParts: vLLM takes a plain string in a
// message's content list as a text part (LangChain passes such lists
// through). The scanner stepped over them: the key lost the message's text,
// so every conversation of an application that sends them shared the key
// of its system prompt, on one endpoint, and their text was not counted.
func TestInspectReadsPlainStringParts(t *testing.T) {
	body := func(parts string) string {
		return `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":[` + parts + `]}]}`
	}
	img := `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`
	plain := inspect("/v1/chat/completions", body(`"`+strings.Repeat("What is in this photo? ", 10)+`",`+img), true)
	typed := inspect("/v1/chat/completions", body(`{"type":"text","text":"`+strings.Repeat("What is in this photo? ", 10)+`"},`+img), true)
	other := inspect("/v1/chat/completions", body(`"`+strings.Repeat("Who took this photo? ", 10)+`",`+img), true)
	assert.Equal(t, typed.AffinityKey, plain.AffinityKey)
	assert.NotEqual(t, plain.AffinityKey, other.AffinityKey)
	assert.Equal(t, typed.PromptTokens, plain.PromptTokens)
}

// TestInspectCountsToolsAndToolResults: tool definitions, the tool calls
// an assistant made and the results sent back are prompt text (servers
// render them into the prompt; an agent's tool schemas run to thousands
// of tokens, and the files its tool results carry to most of its
// conversation). A body within the peek counted none of them, while one
// past it counted them with its size.
func TestInspectCountsToolsAndToolResults(t *testing.T) {
	schema := strings.Repeat(`{"type":"function","function":{"name":"read_file","description":"Reads a file from disk.","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},`, 250)
	schema = "[" + schema[:len(schema)-1] + "]"
	file := strings.Repeat("func main() { fmt.Println(\\\"hello\\\") }\\n", 1000)
	args := `"{\"path\":\"` + strings.Repeat("a/", 2000) + `x.go\"}"`
	// Text counts by its value: an escape as the byte it stands for.
	value := func(quoted string) int {
		var v string
		require.NoError(t, json.Unmarshal([]byte(quoted), &v))
		return len(v) + 2 // and its quotes, where a tool call's arguments count as sent
	}
	fileValue := value(`"`+file+`"`) - 2
	for _, tc := range []struct {
		name, path, body string
		min              int
	}{
		{"tools", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":` + schema + `}`, len(schema) / 4},
		{"functions", "/v1/chat/completions", `{"model":"m","functions":` + schema + `,"messages":[{"role":"user","content":"hi"}]}`, len(schema) / 4},
		{"tool calls and results", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":` + args + `}}]},{"role":"tool","tool_call_id":"c1","content":"` + file + `"}]}`, (value(args) + fileValue) / 4},
		{"messages api", "/v1/messages", `{"model":"m","max_tokens":9,"tools":[{"name":"read_file","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read_file","input":{"path":"` + strings.Repeat("a/", 2000) + `"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + file + `"},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"` + file + `"}]}]}]}`, (4000 + 2*fileValue) / 4},
	} {
		info := inspect(tc.path, tc.body, true)
		assert.GreaterOrEqual(t, info.PromptTokens, tc.min, tc.name)
		assert.LessOrEqual(t, info.PromptTokens, len(tc.body)/4, tc.name)
	}
}

// TestInspectKeysAudioAndVideo: the same instruction about two recordings
// or videos is two prompts, as about two images: a transcription service
// sends every call with the same text ("Transcribe this."), and keyed on
// the text alone all of them shared one key and piled onto its owner.
func TestInspectKeysAudioAndVideo(t *testing.T) {
	key := func(part string) uint64 {
		return inspect("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[`+part+`,{"type":"text","text":"Transcribe this."}]}]}`, true).AffinityKey
	}
	for _, part := range []string{
		`{"type":"input_audio","input_audio":{"data":"%s","format":"wav"}}`,
		`{"type":"audio_url","audio_url":{"url":"https://x/%s.wav"}}`,
		`{"type":"video_url","video_url":{"url":"data:video/mp4;base64,%s"}}`,
	} {
		a, b := key(fmt.Sprintf(part, "QUFB")), key(fmt.Sprintf(part, "QkJC"))
		assert.NotEqual(t, a, b, part)
		assert.Equal(t, a, key(fmt.Sprintf(part, "QUFB")), part)
	}
}

// TestInspectCacheSalt: vLLM's cache_salt keeps requests with different
// salts from sharing prefix-cache blocks (a tenant's isolation from
// another's timing). Keyed alike, two tenants with one system prompt and
// different salts were sent to one owner for a cache they cannot share;
// the salt is part of their key now, in every form of key. No salt (or an
// empty one) keys as before.
func TestInspectCacheSalt(t *testing.T) {
	const path = "/v1/chat/completions"
	chat := func(extra string) uint64 {
		return inspect(path, `{"model":"m",`+extra+`"messages":[{"role":"system","content":"You are an agent."},{"role":"user","content":"hi"}]}`, true).AffinityKey
	}
	plain := chat("")
	assert.NotZero(t, plain)
	a, b := chat(`"cache_salt":"tenant-a",`), chat(`"cache_salt":"tenant-b",`)
	assert.NotEqual(t, a, b, "different salts share no cache")
	assert.NotEqual(t, plain, a)
	assert.Equal(t, a, chat(`"cache_salt":"tenant-a",`), "one salt, one key")
	assert.Equal(t, plain, chat(`"cache_salt":"",`))
	assert.Equal(t, a, inspect(path, `{"messages":[{"role":"system","content":"You are an agent."},{"role":"user","content":"hi"}],"cache_salt":"tenant-a","model":"m"}`, true).AffinityKey,
		"wherever the salt is in the body")
	// Completions prompts and explicit sessions too.
	const cpath = "/v1/completions"
	pa := inspect(cpath, `{"model":"m","prompt":"once upon","cache_salt":"tenant-a"}`, true).AffinityKey
	pb := inspect(cpath, `{"model":"m","prompt":"once upon","cache_salt":"tenant-b"}`, true).AffinityKey
	assert.NotEqual(t, pa, pb)
	assert.Equal(t, cache.NewKeyer(42).Prompt("m", "once upon"), inspect(cpath, `{"model":"m","prompt":"once upon"}`, true).AffinityKey)
	sa := inspect(path, `{"model":"m","prompt_cache_key":"s1","cache_salt":"tenant-a","messages":[{"role":"user","content":"x"}]}`, true).AffinityKey
	sb := inspect(path, `{"model":"m","prompt_cache_key":"s1","cache_salt":"tenant-b","messages":[{"role":"user","content":"x"}]}`, true).AffinityKey
	assert.NotEqual(t, sa, sb)
	// Past the peek, where the SDKs put fields they do not know, in a body
	// held in memory.
	long := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 8<<10) + `"}]`
	past := func(body string) uint64 {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:1<<10]), false, &info)
		return info.AffinityKey
	}
	la, lb := past(long+`,"cache_salt":"tenant-a"}`), past(long+`,"cache_salt":"tenant-b"}`)
	assert.NotEqual(t, la, lb)
	assert.NotEqual(t, past(long+`}`), la)
	assert.Equal(t, past(long+`}`), past(long+`,"cache_salt":""}`))
}

// TestInspectTokenIDPrompts: the completions API takes a prompt as token
// IDs ([1, 2, 3], or a list of such lists), as pipelines that tokenize
// themselves send it. Such a prompt got no affinity key and no estimate; it
// is keyed on its leading IDs (prompts that share their first IDs share a
// key, as text prompts sharing their first characters do) and counts a
// token per ID.
func TestInspectTokenIDPrompts(t *testing.T) {
	const path = "/v1/completions"
	ids := func(n, from int) string {
		var b strings.Builder
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, from+i)
		}
		b.WriteByte(']')
		return b.String()
	}
	one := inspect(path, `{"model":"m","prompt":`+ids(3000, 100)+`,"max_tokens":16}`, true)
	assert.NotZero(t, one.AffinityKey)
	assert.Equal(t, 3000, one.PromptTokens)
	other := inspect(path, `{"model":"m","prompt":`+ids(3000, 900)+`,"max_tokens":16}`, true)
	assert.NotEqual(t, one.AffinityKey, other.AffinityKey)
	// The same leading IDs with a different tail: one key.
	tail := inspect(path, `{"model":"m","prompt":`+strings.TrimSuffix(ids(3000, 100), "]")+`,7,7,7]}`, true)
	assert.Equal(t, one.AffinityKey, tail.AffinityKey)
	assert.NotEqual(t, one.AffinityKey, inspect(path, `{"model":"n","prompt":`+ids(3000, 100)+`}`, true).AffinityKey, "model is part of the key")
	// A batch of ID lists: keyed on the first, every ID counted.
	batch := inspect(path, `{"model":"m","prompt":[`+ids(3000, 100)+`,`+ids(500, 5)+`]}`, true)
	assert.Equal(t, one.AffinityKey, batch.AffinityKey)
	assert.Equal(t, 3500, batch.PromptTokens)
	// Not IDs: no key from them.
	assert.Zero(t, inspect(path, `{"model":"m","prompt":[1.5,2]}`, true).AffinityKey)

	// The key covers about as many tokens as a text key does (Depth
	// characters, about Depth/4 tokens), however many digits the IDs
	// have: prompts of 6-digit IDs (a 150k vocabulary) that part after
	// 800 IDs have two keys, as texts that part after 3,200 characters
	// do; after 1,100 IDs, one. The decimal rendering covered 585 IDs.
	parted := func(shared, from int) uint64 {
		p := strings.TrimSuffix(ids(shared, 100_000), "]") + "," + strings.TrimPrefix(ids(300, from), "[")
		return inspect(path, `{"model":"m","prompt":`+p+`}`, true).AffinityKey
	}
	assert.NotEqual(t, parted(800, 120_000), parted(800, 130_000))
	assert.Equal(t, parted(1100, 120_000), parted(1100, 130_000))
	text := func(shared int, tail string) uint64 {
		return inspect(path, `{"model":"m","prompt":"`+strings.Repeat("x", shared)+tail+`"}`, true).AffinityKey
	}
	assert.NotEqual(t, text(3200, "a"), text(3200, "b"))
	assert.Equal(t, text(4400, "a"), text(4400, "b"))
}

// TestInspectTokenIDPromptsPastThePeek: a prompt of token IDs larger than
// the peek (a long context from a pipeline that tokenizes itself) counts a
// token per ID past the peek too, in the proportion of IDs the peek shows,
// whether the rest is streamed or in memory. Estimated from its size as
// text, at 4 bytes a token, 300,000 IDs of 6 digits counted 525,000 tokens
// (612,500 with Python's ", " separators), and it keeps its key.
func TestInspectTokenIDPromptsPastThePeek(t *testing.T) {
	const n, peek = 300_000, 1 << 20
	for _, sep := range []string{",", ", "} {
		var sb strings.Builder
		for i := range n {
			if i > 0 {
				sb.WriteString(sep)
			}
			fmt.Fprint(&sb, 100_000+i)
		}
		ids := "[" + sb.String() + "]"
		for _, tc := range []struct{ path, body string }{
			{"/v1/completions", `{"model":"m","prompt":` + ids + `,"max_tokens":16}`},
			{"/v1/completions", `{"model":"m","prompt":[` + ids + `],"max_tokens":16}`},
			{"/generate", `{"input_ids":` + ids + `,"sampling_params":{"max_new_tokens":16}}`},
		} {
			whole := inspect(tc.path, tc.body, true)
			require.Equal(t, n, whole.PromptTokens)
			for _, mode := range []string{"streamed", "in memory"} {
				var r *http.Request
				if mode == "streamed" {
					r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, io.MultiReader(strings.NewReader(tc.body)))
					r.ContentLength = int64(len(tc.body))
				} else {
					r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, strings.NewReader(tc.body))
				}
				var info httpbalancer.Info
				(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(tc.body[:peek]), false, &info)
				name := fmt.Sprintf("%s %.30s, %q, %s", tc.path, tc.body, sep, mode)
				assert.InEpsilon(t, n, info.PromptTokens, 0.02, name)
				assert.Equal(t, whole.AffinityKey, info.AffinityKey, name)
			}
		}
	}
}

// TestInspectBOM: a body that starts with a UTF-8 byte order mark is read
// as JSON, as Python servers read it (json.loads detects the mark); it was
// read as nothing, so the call went without its model and key.
func TestInspectBOM(t *testing.T) {
	const body = `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":9}`
	plain := inspect("/v1/chat/completions", body, true)
	bom := inspect("/v1/chat/completions", "\xef\xbb\xbf"+body, true)
	assert.Equal(t, "m", bom.Model)
	assert.Equal(t, plain.AffinityKey, bom.AffinityKey)
	assert.Equal(t, plain.MaxOutputTokens, bom.MaxOutputTokens)
}

// TestInspectSamplingParamsNPastThePeek: SGLang's sampling_params.n counts
// in the output bound also when the body is larger than the peek and
// sampling_params is too large for the read of the rest (a regex or JSON
// schema of tens of KiB): the peek's reading stands, as it does for
// max_new_tokens. The rest's reading set n to 0, so 4 choices of 7 tokens
// counted 7.
func TestInspectSamplingParamsNPastThePeek(t *testing.T) {
	body := `{"sampling_params":{"n":4,"max_new_tokens":7,"regex":"` + strings.Repeat("[a-z]", 20<<10/5) + `"},"text":"` + strings.Repeat("x", 200<<10) + `"}`
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal/generate", strings.NewReader(body))
	var info httpbalancer.Info
	(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:64<<10]), false, &info)
	assert.Equal(t, 28, info.MaxOutputTokens)
}

// TestInspectBOMPastThePeek: a body with a byte order mark that is larger
// than the peek is read as one without the mark is: its model, output bound
// and salt past the peek when it is in memory, and its size less the base64
// the peek shows when it is streamed. The mark made the scan of the rest
// give up at the first byte, so such a body went without its model and a
// streamed photo counted as a million tokens.
func TestInspectBOMPastThePeek(t *testing.T) {
	const path, bom = "/v1/chat/completions", "\xef\xbb\xbf"
	text := strings.Repeat("All work and no play makes Jack a dull boy. ", 256<<10/44)
	doc := `{"messages":[{"role":"user","content":"` + text + `"}],"model":"m","max_completion_tokens":9,"cache_salt":"a"}`
	inMemory := func(body string) httpbalancer.Info {
		r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, strings.NewReader(body))
		var info httpbalancer.Info
		(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(body[:64<<10]), false, &info)
		return info
	}
	plain, marked := inMemory(doc), inMemory(bom+doc)
	assert.Equal(t, "m", plain.Model)
	assert.Equal(t, "m", marked.Model)
	assert.Equal(t, 9, marked.MaxOutputTokens)
	assert.Equal(t, plain.AffinityKey, marked.AffinityKey, "salted alike")
	assert.InDelta(t, plain.PromptTokens, marked.PromptTokens, 1)

	const peek = 1 << 20
	blob := strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", 3<<20/24)
	photo := bom + `{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this photo?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + blob + `"}}]}],"model":"m"}`
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, io.MultiReader(strings.NewReader(photo)))
	r.ContentLength = int64(len(photo))
	var info httpbalancer.Info
	(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(photo[:peek]), false, &info)
	assert.LessOrEqual(t, info.PromptTokens, 1000, "a streamed photo")
}

// TestInspectBoundsTheEstimates: a request counts on its endpoint's
// in-flight tokens for as long as it lasts, so a made-up size must not
// claim more than the largest real request could. A streamed body that
// declares 8 GB (a gateway relaying an upload) counted 2^31 prompt tokens
// for the upload's duration, and max_tokens of 2^31-1 as many output
// tokens; both are capped at httpbalancer.MaxTokenEstimate, past the
// largest context windows served, so no real request is cut.
func TestInspectBoundsTheEstimates(t *testing.T) {
	const path = "/v1/chat/completions"
	head := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 200)
	r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+path, io.NopCloser(strings.NewReader(head)))
	r.ContentLength = 8 << 30
	var info httpbalancer.Info
	(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(head), false, &info)
	assert.Equal(t, httpbalancer.MaxTokenEstimate, info.PromptTokens)

	big := inspect(path, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2147483647}`, true)
	assert.Equal(t, httpbalancer.MaxTokenEstimate, big.MaxOutputTokens)
	many := inspect(path, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"n":100}`, true)
	assert.Equal(t, httpbalancer.MaxTokenEstimate, many.MaxOutputTokens)
	// Real sizes are untouched, up to the largest context served today:
	// vLLM serves Llama 4 Scout with 3.6M tokens on 8 H200s.
	assert.Equal(t, 128000, inspect(path, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":128000}`, true).MaxOutputTokens)
	assert.Equal(t, 3_500_000, inspect(path, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3500000}`, true).MaxOutputTokens)
	r, _ = http.NewRequest(http.MethodPost, "http://llm.internal"+path, io.NopCloser(strings.NewReader(head)))
	r.ContentLength = 14_000_000 // 3.5M tokens of text, streamed
	info = httpbalancer.Info{}
	(&httpbalancer.OpenAI{Keyer: cache.NewKeyer(42)}).Inspect(r, []byte(head), false, &info)
	assert.Equal(t, 3_500_000, info.PromptTokens)
}

// A pooling call's LongestInput is its longest single input (a rerank's or
// score call's longest query with its longest document), which is what a
// pooling server bounds by its context window, not the batch's total.
func TestInspectLongestInput(t *testing.T) {
	a := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		name, path, body string
		prompt, longest  int
	}{
		{"one input", "/v1/embeddings", `{"model":"e5","input":"` + a(40) + `"}`, 10, 10},
		{"a batch", "/v1/embeddings", `{"model":"e5","input":["` + a(8) + `","` + a(40) + `","` + a(4) + `"]}`, 13, 10},
		{"TEI's inputs", "/embed", `{"inputs":["` + a(8) + `","` + a(40) + `"]}`, 12, 10},
		{"token-ID lists", "/v1/embeddings", `{"model":"e5","input":[[1,2,3],[1,2,3,4,5]]}`, 8, 5},
		{"one token-ID list", "/v1/embeddings", `{"model":"e5","input":[1,2,3,4]}`, 4, 4},
		{"rerank", "/v1/rerank", `{"model":"bge","query":"` + a(8) + `","documents":["` + a(16) + `","` + a(40) + `"]}`, 16, 12},
		{"TEI's rerank", "/rerank", `{"query":"` + a(8) + `","texts":["` + a(16) + `","` + a(40) + `"]}`, 16, 12},
		{"score, one document", "/v1/score", `{"model":"bge","text_1":["` + a(8) + `","` + a(16) + `"],"text_2":"` + a(40) + `"}`, 16, 14},
		{"score", "/v1/score", `{"model":"bge","text_1":["` + a(8) + `","` + a(16) + `"],"text_2":["` + a(40) + `","` + a(4) + `"]}`, 17, 14},
		{"chat: not a pooling call", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + a(40) + `"}]}`, 10, 0},
		{"batch of completions: its longest prompt", "/v1/completions", `{"model":"m","prompt":["` + a(8) + `","` + a(40) + `"]}`, 12, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "http://llm.internal"+tc.path, strings.NewReader(tc.body))
			var info httpbalancer.Info
			(&httpbalancer.OpenAI{}).Inspect(r, []byte(tc.body), true, &info)
			assert.Equal(t, tc.prompt, info.PromptTokens)
			assert.Equal(t, tc.longest, info.LongestInput)
		})
	}

	// Past the peek: one input is the whole body's estimate; a batch's
	// longest is the longest the peek holds, a lower bound.
	for _, tc := range []struct {
		name, body string
		peek       int
		longest    int
	}{
		{"one input", `{"model":"e5","input":"` + a(4000) + `"}`, 1000, -1},
		{"a batch", `{"model":"e5","input":["` + a(400) + `","` + a(800) + `","` + a(4000) + `"]}`, 2000, 200},
	} {
		t.Run(tc.name+" past the peek", func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "http://llm.internal/v1/embeddings", strings.NewReader(tc.body))
			var info httpbalancer.Info
			(&httpbalancer.OpenAI{}).Inspect(r, []byte(tc.body[:tc.peek]), false, &info)
			assert.Greater(t, info.PromptTokens, 1000)
			if tc.longest < 0 {
				assert.Equal(t, info.PromptTokens, info.LongestInput)
			} else {
				assert.Equal(t, tc.longest, info.LongestInput)
			}
		})
	}
}

// TestInspectRepeatedPromptKeyKeepsTheLast: Python's json, which vLLM and SGLang
// read bodies with, keeps the last of a repeated key, as encoding/json
// does; the affinity key must be the one of the prompt the server runs.
func TestInspectRepeatedPromptKeyKeepsTheLast(t *testing.T) {
	for _, c := range []struct{ path, dup, last string }{
		{"/v1/completions", `{"model":"m","prompt":"other","prompt":"hello"}`, `{"model":"m","prompt":"hello"}`},
		{"/v1/completions", `{"model":"m","prompt":[1,2,3],"prompt":[4,5,6]}`, `{"model":"m","prompt":[4,5,6]}`},
		{"/v1/completions", `{"model":"m","prompt":[1,2,3],"prompt":"hello"}`, `{"model":"m","prompt":"hello"}`},
		{"/v1/completions", `{"model":"m","prompt":["other","x"],"prompt":["hello","x"]}`, `{"model":"m","prompt":["hello","x"]}`},
		{"/v1/responses", `{"model":"m","input":"other","input":"hello"}`, `{"model":"m","input":"hello"}`},
		{"/generate", `{"text":"other","text":"hello"}`, `{"text":"hello"}`},
	} {
		dup, last := inspect(c.path, c.dup, true), inspect(c.path, c.last, true)
		require.NotZero(t, last.AffinityKey, c.last)
		assert.Equal(t, last.AffinityKey, dup.AffinityKey, c.dup)
	}
}

// TestInspectRepeatedTextKeyKeepsTheLast: a message's or a content part's
// repeated text is its last, as the server reads it, not both joined.
func TestInspectRepeatedTextKeyKeepsTheLast(t *testing.T) {
	for _, c := range []struct{ path, dup, last string }{
		{"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"other","content":"hello"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
		{"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"other","text":"hello"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"hello"}]}]}`},
		{"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"other"}],"content":"hello"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
	} {
		dup, last := inspect(c.path, c.dup, true), inspect(c.path, c.last, true)
		require.NotZero(t, last.AffinityKey, c.last)
		assert.Equal(t, last.AffinityKey, dup.AffinityKey, c.dup)
	}
}

// TestInspectRepeatedSystemKeepsTheLast: a system prompt given apart and
// then again as null (or with no text) is no system prompt to the server,
// which reads the last value of a repeated key, and the key is the one of
// a body without it, as it is when the body is read past the peek.
func TestInspectRepeatedSystemKeepsTheLast(t *testing.T) {
	for _, c := range []struct{ path, dup, last string }{
		{"/v1/responses", `{"model":"m","instructions":"sys","input":"hello","instructions":null}`, `{"model":"m","input":"hello"}`},
		{"/v1/messages",
			`{"model":"m","system":"sys","messages":[{"role":"user","content":"hello"}],"system":[]}`,
			`{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
	} {
		dup, last := inspect(c.path, c.dup, true), inspect(c.path, c.last, true)
		require.NotZero(t, last.AffinityKey, c.last)
		assert.Equal(t, last.AffinityKey, dup.AffinityKey, c.dup)
	}
}
