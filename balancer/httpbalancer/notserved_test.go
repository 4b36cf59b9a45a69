package httpbalancer_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// vllmNotFound is vLLM's answer to a call for a model it does not serve
// (a LoRA adapter loaded on other replicas), as its create_error_response
// writes it.
func vllmNotFound(model string) string {
	return fmt.Sprintf(`{"error":{"message":"The model `+"`%s`"+` does not exist.","type":"NotFoundError","param":null,"code":404}}`, model)
}

// loraBackend is a fake vLLM replica that serves the base model "m" and the
// adapters in serves; any other model gets vLLM's 404.
type loraBackend struct {
	*backend
	serves   map[string]bool
	notFound atomic.Int64
}

func newLoRABackend(t *testing.T, name string, adapters ...string) *loraBackend {
	t.Helper()
	b := &loraBackend{backend: &backend{name: name}, serves: map[string]bool{"m": true}}
	for _, a := range adapters {
		b.serves[a] = true
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req struct{ Model string }
		_ = json.Unmarshal(body, &req)
		if !b.serves[req.Model] {
			b.notFound.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, vllmNotFound(req.Model))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.fakeChat(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func loraBody(model string, i int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"question %d"}],"max_tokens":16}`, model, i)
}

// TestModelNotServedGoesElsewhere: of three vLLM replicas only one has
// loaded the LoRA adapter; the others answer its calls 404 at once. Each
// such answer sends the call on to another replica, so no call fails, and
// the balancer then keeps the adapter's calls off the two replicas for
// NotServedMemory: two 404s in 200 calls (before, the replicas without the
// adapter looked idle, drew most of its calls, and every one failed with
// a 404). The base model's calls still go to all three.
func TestModelNotServedGoesElsewhere(t *testing.T) {
	owner := newLoRABackend(t, "owner", "adapter")
	b := newLoRABackend(t, "b")
	c := newLoRABackend(t, "c")
	res := newResults(256)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(owner.backend, b.backend, c.backend),
		BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(7)},
		OnResult:        res.on,
	})
	client := &http.Client{Transport: tr}
	byBackend := map[string]map[string]int{"m": {}, "adapter": {}}
	for i := range 200 {
		model := "m"
		if i%2 == 1 {
			model = "adapter"
		}
		resp, out := post(t, client, loraBody(model, i))
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d (%s): %s", i, model, out)
		byBackend[model][resp.Header.Get("X-Backend")]++
	}
	assert.Equal(t, map[string]int{"owner": 100}, byBackend["adapter"])
	assert.Len(t, byBackend["m"], 3, "the base model's calls use every replica: %v", byBackend["m"])
	assert.Equal(t, int64(1), b.notFound.Load(), "b answered one 404")
	assert.Equal(t, int64(1), c.notFound.Load(), "c answered one 404")
	assert.Equal(t, uint64(2), tr.Stats().Failovers)

	st := statsByID(tr.Balancer())
	for _, id := range []string{"b", "c"} {
		assert.Equal(t, uint64(1), st[id].NotServed, id)
		assert.Zero(t, st[id].Failures, id)
	}
	assert.Zero(t, st["owner"].NotServed)
	assert.Zero(t, totalInFlight(tr.Balancer()))

	var notServed []httpbalancer.Result
	for len(res.c) > 0 {
		if r := <-res.c; r.Outcome.NotServedModel != "" {
			notServed = append(notServed, r)
		}
	}
	require.Len(t, notServed, 2)
	for _, r := range notServed {
		assert.Equal(t, "adapter", r.Outcome.NotServedModel)
		assert.Equal(t, http.StatusNotFound, r.Status)
		assert.True(t, r.FailedOver)
		assert.NoError(t, r.Outcome.Err)
	}
}

// TestModelNotServedReachesTheCallerIntact: when the call cannot go
// elsewhere (failover off here; no other replica, no retry budget), the
// caller gets the 404 byte for byte, and the balancer counts it as a
// not-served answer, not as a success (which made the replica look idle)
// nor as a failure.
func TestModelNotServedReachesTheCallerIntact(t *testing.T) {
	b := newLoRABackend(t, "b")
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(b.backend),
		DisableFailover: true,
		OnResult:        res.on,
	})
	resp, out := post(t, &http.Client{Transport: tr}, loraBody("adapter", 1))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, vllmNotFound("adapter"), string(out))
	st := statsByID(tr.Balancer())["b"]
	assert.Equal(t, uint64(1), st.NotServed)
	assert.Zero(t, st.Successes)
	assert.Zero(t, st.Failures)
	assert.Zero(t, st.InFlight)
	r := <-res.c
	assert.Equal(t, "adapter", r.Outcome.NotServedModel)
	assert.False(t, r.Outcome.ClientError, "a 404 naming the model is NotServedModel")
	assert.Zero(t, st.ClientErrors)
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.False(t, r.FailedOver)
	assert.Zero(t, tr.Stats().Failovers)
}

// TestOther404sAreResponses: a 404 that does not say the model is missing
// (a route the server lacks) is an answer like any other: not retried,
// given to the caller intact, a client error (neither success nor
// failure, see inferlb.Outcome.ClientError).
func TestOther404sAreResponses(t *testing.T) {
	var hits atomic.Int64
	routeless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	}))
	t.Cleanup(routeless.Close)
	other := newBackend(t, "other")
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "routeless", Addr: strings.TrimPrefix(routeless.URL, "http://")}, {ID: "other", Addr: other.addr()}},
		BalancerOptions: preferOpts("routeless"),
	})
	resp, out := post(t, &http.Client{Transport: tr}, loraBody("m", 1))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, `{"detail":"Not Found"}`, string(out))
	assert.Equal(t, int64(1), hits.Load())
	assert.Zero(t, other.hits.Load(), "not retried")
	st := statsByID(tr.Balancer())["routeless"]
	assert.Equal(t, uint64(1), st.ClientErrors)
	assert.Zero(t, st.Successes)
	assert.Zero(t, st.NotServed)
}

func TestNamesMissingModel(t *testing.T) {
	for _, tc := range []struct {
		name, model, body string
		want              bool
	}{
		{"vLLM", "adapter", vllmNotFound("adapter"), true},
		{"vLLM, older", "adapter", `{"object":"error","message":"The model ` + "`adapter`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`, true},
		{"Ollama", "llama3.1:8b", `{"error":"model \"llama3.1:8b\" not found, try pulling it first"}`, true},
		{"Ollama's OpenAI routes", "qwen3", `{"error":{"message":"model \"qwen3\" not found, try pulling it first","type":"api_error","param":null,"code":null}}`, true},
		{"OpenAI", "gpt-x", `{"error":{"message":"The model ` + "`gpt-x`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`, true},
		{"Triton", "ensemble", `{"error":"Request for unknown model: 'ensemble' is not found"}`, true},
		{"a route the server lacks", "m", `{"detail":"Not Found"}`, false},
		{"another model named", "adapter", vllmNotFound("other"), false},
		{"the model, but no word of it missing", "m", `{"error":"m is loading"}`, false},
		{"a short name inside other words", "m", `{"error":{"message":"Response with id 'resp_m1' not found.","type":"NotFoundError"}}`, false},
		{"the name unquoted", "llama", `{"error":"no llama here: route not found"}`, false},
		{"empty name", "", vllmNotFound(""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, httpbalancer.NamesMissingModel([]byte(tc.body), tc.model))
		})
	}
}

// TestModelNotServedFirstCallsSucceed: in a fleet of five where one replica
// has the adapter, a caller's very first call for it (nothing remembered
// yet) meets up to four replicas without it; it goes on until it finds
// the one that has it. With a single retry, three of five first calls
// would fail (each fresh Transport here is a new caller).
func TestModelNotServedFirstCallsSucceed(t *testing.T) {
	owner := newLoRABackend(t, "owner", "adapter")
	fleet := []*backend{owner.backend}
	var lacking []*loraBackend
	for i := range 4 {
		b := newLoRABackend(t, fmt.Sprintf("r%d", i))
		lacking = append(lacking, b)
		fleet = append(fleet, b.backend)
	}
	for seed := range uint64(20) {
		tr := newTransport(t, httpbalancer.Options{
			Endpoints:       endpointsOf(fleet...),
			BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(seed)},
		})
		resp, out := post(t, &http.Client{Transport: tr}, loraBody("adapter", int(seed)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "seed %d: %s", seed, out)
		assert.Equal(t, "owner", resp.Header.Get("X-Backend"))
	}
	var met int64
	for _, b := range lacking {
		met += b.notFound.Load()
	}
	t.Logf("20 first calls met %d replicas without the adapter", met)
	assert.Positive(t, met)
}

// TestNotFoundBodiesReachTheCallerIntact: whatever a 404's body (empty,
// not JSON, at and past the 2 KiB the transport reads, naming the model
// or not), a call that cannot go elsewhere gets it byte for byte, and the
// call ends once (nothing left in flight).
func TestNotFoundBodiesReachTheCallerIntact(t *testing.T) {
	long := func(n int) string {
		s := vllmNotFound("adapter")
		return s + strings.Repeat(" ", n-len(s))
	}
	for _, body := range []string{
		"",
		"not json \x00\xff",
		vllmNotFound("adapter"),
		long(2048),
		long(2049),
		strings.Repeat("x", 5000),
		`{"detail":"Not Found"}`,
	} {
		for _, chunked := range []bool{false, true} {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNotFound)
				if chunked && len(body) > 1 { // no Content-Length: sent in two flushed pieces
					_, _ = io.WriteString(w, body[:1])
					w.(http.Flusher).Flush()
					_, _ = io.WriteString(w, body[1:])
					return
				}
				_, _ = io.WriteString(w, body)
			}))
			tr := newTransport(t, httpbalancer.Options{
				Endpoints:       []inferlb.Endpoint{{Addr: strings.TrimPrefix(srv.URL, "http://")}},
				DisableFailover: true,
			})
			resp, out := post(t, &http.Client{Transport: tr}, loraBody("adapter", 1))
			assert.Equal(t, http.StatusNotFound, resp.StatusCode)
			assert.Equal(t, body, string(out), "%d bytes, chunked %v", len(body), chunked)
			assert.Zero(t, totalInFlight(tr.Balancer()))
			srv.Close()
		}
	}
}

// TestModelNobodyServes: a model no replica serves (a typo) costs one
// round of 404s, not one per call: the first call goes on through every
// replica, and later calls get the 404 from the first replica they meet,
// since a retry never goes to a replica remembered without the model (the
// retry budget is left to failovers that can help).
func TestModelNobodyServes(t *testing.T) {
	bs := []*loraBackend{newLoRABackend(t, "a"), newLoRABackend(t, "b"), newLoRABackend(t, "c")}
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(bs[0].backend, bs[1].backend, bs[2].backend),
		BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(4)},
	})
	client := &http.Client{Transport: tr}
	met := func() (n int64) {
		for _, b := range bs {
			n += b.notFound.Load()
		}
		return n
	}
	resp, out := post(t, client, loraBody("lama", 0))
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, vllmNotFound("lama"), string(out))
	assert.Equal(t, int64(3), met(), "the first call meets every replica")
	for i := 1; i <= 10; i++ {
		resp, out = post(t, client, loraBody("lama", i))
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		assert.Equal(t, vllmNotFound("lama"), string(out))
		assert.Equal(t, int64(3+i), met(), "call %d meets one replica", i)
	}
	assert.Equal(t, uint64(2), tr.Stats().Failovers, "the first call's two hops")
}

// TestModelNotServedLargeFleet: twelve replicas, one with the adapter. A
// new caller's first call for it goes on past up to eleven without it, so
// it always finds the one; a cap of 8 hops (notServedHops returning 8, a
// temporary edit) failed 5 of these 20 (the first 9 replicas met all
// without the adapter: 3 chances in 12).
func TestModelNotServedLargeFleet(t *testing.T) {
	owner := newLoRABackend(t, "owner", "adapter")
	fleet := []*backend{owner.backend}
	for i := range 11 {
		fleet = append(fleet, newLoRABackend(t, fmt.Sprintf("r%d", i)).backend)
	}
	for seed := range uint64(20) {
		tr := newTransport(t, httpbalancer.Options{
			Endpoints:       endpointsOf(fleet...),
			BalancerOptions: balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(100 + seed)},
		})
		resp, out := post(t, &http.Client{Transport: tr}, loraBody("adapter", int(seed)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "seed %d: %s", seed, out)
	}
}
