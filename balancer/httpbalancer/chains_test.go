package httpbalancer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

const responsesURL = "http://llm.internal/v1/responses"

// responsesServer answers /v1/responses as vLLM does with its in-memory
// store: it names each response after itself, and a follow-up naming a
// response it did not make fails with 404.
type responsesServer struct {
	name string
	mu   sync.Mutex
	made map[string]bool
	n    int
}

func (s *responsesServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Previous string `json:"previous_response_id"`
		Stream   bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if req.Previous != "" && !s.made[req.Previous] {
		s.mu.Unlock()
		http.Error(w, `{"error":{"message":"response not found"}}`, http.StatusNotFound)
		return
	}
	s.n++
	id := fmt.Sprintf("resp_%s_%d", s.name, s.n)
	s.made[id] = true
	s.mu.Unlock()
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\"}}\n\n", id)
		fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"Hi\"}\n\n")
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"status\":\"completed\"}}\n\n", id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id": %q, "object": "response", "status": "completed", "output": [{"id": "msg_1", "type": "message"}]}`, id)
}

// responsesFleet starts n responsesServers named s0, s1, ... and returns
// their endpoints, each with its server's name as ID.
func responsesFleet(t *testing.T, n int) []inferlb.Endpoint {
	t.Helper()
	var eps []inferlb.Endpoint
	for i := range n {
		srv := httptest.NewServer(&responsesServer{name: fmt.Sprintf("s%d", i), made: map[string]bool{}})
		t.Cleanup(srv.Close)
		eps = append(eps, inferlb.Endpoint{ID: fmt.Sprintf("s%d", i), Addr: srv.URL})
	}
	return eps
}

// responseID reads the ID of a /v1/responses answer, JSON or stream.
func responseID(t *testing.T, body []byte) string {
	t.Helper()
	s := string(body)
	i := strings.Index(s, `"id":`)
	require.GreaterOrEqual(t, i, 0, "no id in %s", s)
	var id string
	require.NoError(t, json.NewDecoder(strings.NewReader(s[i+5:])).Decode(&id))
	return id
}

// A conversation on the Responses API sends each follow-up with only its new
// input and the ID of the response it continues. Every turn must reach the
// server that holds the conversation, which stores the responses it made.
func TestResponsesFollowUpsReachTheirConversation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			eps := responsesFleet(t, 4)
			tr := newTransport(t, httpbalancer.Options{Endpoints: eps,
				BalancerOptions: balancer.Options{MinKeyReuse: -1, SlowStartWindow: -1}})
			client := &http.Client{Transport: tr}
			const conversations, turns = 12, 6
			last := make([]string, conversations)
			where := make([]string, conversations)
			for turn := range turns {
				for c := range conversations {
					body := fmt.Sprintf(`{"model":"m","input":"conversation %d opens","stream":%v}`, c, stream)
					if turn > 0 {
						body = fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"turn %d of %d","stream":%v}`, last[c], turn, c, stream)
					}
					resp, err := client.Post(responsesURL, "application/json", strings.NewReader(body))
					require.NoError(t, err)
					got, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.NoError(t, resp.Body.Close())
					require.Equal(t, http.StatusOK, resp.StatusCode, "conversation %d turn %d: %s", c, turn, got)
					last[c] = responseID(t, got)
					server := strings.Split(last[c], "_")[1]
					if turn == 0 {
						where[c] = server
					}
					assert.Equal(t, where[c], server, "conversation %d turn %d", c, turn)
				}
			}
			seen := map[string]bool{}
			for _, w := range where {
				seen[w] = true
			}
			assert.Greater(t, len(seen), 1, "the conversations all opened on one server")
		})
	}
}

// With ResponseMemory off, follow-ups are keyed on their own input and
// scatter: the test above would fail, which shows it tests the memory.
func TestResponsesFollowUpsScatterWithoutTheMemory(t *testing.T) {
	eps := responsesFleet(t, 4)
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps, ResponseMemory: -1,
		BalancerOptions: balancer.Options{MinKeyReuse: -1, SlowStartWindow: -1}})
	client := &http.Client{Transport: tr}
	notFound := 0
	for c := range 12 {
		resp, err := client.Post(responsesURL, "application/json", strings.NewReader(fmt.Sprintf(`{"model":"m","input":"conversation %d opens"}`, c)))
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		prev := responseID(t, got)
		for turn := 1; turn < 4; turn++ {
			resp, err := client.Post(responsesURL, "application/json", strings.NewReader(fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"turn %d of %d"}`, prev, turn, c)))
			require.NoError(t, err)
			got, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusNotFound {
				notFound++
				break
			}
			prev = responseID(t, got)
		}
	}
	assert.Positive(t, notFound, "follow-ups found their server without the memory")
}

// The official client's Responses API, chaining turns by
// previous_response_id, streamed and not: every turn reaches the server
// that holds the conversation.
func TestOpenAIClientResponsesConversation(t *testing.T) {
	eps := responsesFleet(t, 4)
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps,
		BalancerOptions: balancer.Options{MinKeyReuse: -1, SlowStartWindow: -1}})
	client := openAIClient(tr)
	ctx := context.Background()
	for c := range 8 {
		var prev, home string
		for turn := range 5 {
			params := responses.ResponseNewParams{
				Model: "m",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("conversation %d, turn %d", c, turn))},
			}
			if prev != "" {
				params.PreviousResponseID = openai.String(prev)
			}
			var id string
			if turn%2 == 0 {
				r, err := client.Responses.New(ctx, params)
				require.NoError(t, err, "conversation %d turn %d", c, turn)
				id = r.ID
			} else {
				st := client.Responses.NewStreaming(ctx, params)
				for st.Next() {
					if ev := st.Current(); ev.Type == "response.created" {
						id = ev.Response.ID
					}
				}
				require.NoError(t, st.Err(), "conversation %d turn %d", c, turn)
				require.NoError(t, st.Close())
			}
			require.NotEmpty(t, id)
			server := strings.Split(id, "_")[1]
			if turn == 0 {
				home = server
			}
			assert.Equal(t, home, server, "conversation %d turn %d", c, turn)
			prev = id
		}
	}
}

// A follow-up goes to the server that made the response it continues even
// when that server is far over its load bound, where the conversation's key
// alone would spill it (to a server that does not have the response). So
// does one that names a prompt_cache_key too (a client that sets one per
// conversation sends it with every turn), which is its affinity key: it
// used to go where that key went, not to the response, and failed with
// 404 once the key spilled.
func TestResponsesFollowUpStaysPinnedUnderLoad(t *testing.T) {
	for _, cacheKey := range []string{"", `"prompt_cache_key":"conv-1",`} {
		t.Run(fmt.Sprintf("prompt_cache_key=%v", cacheKey != ""), func(t *testing.T) {
			followUpStaysPinnedUnderLoad(t, cacheKey)
		})
	}
}

func followUpStaysPinnedUnderLoad(t *testing.T, cacheKey string) {
	eps := responsesFleet(t, 4)
	b := balancer.New(balancer.Options{MinKeyReuse: -1, SlowStartWindow: -1})
	tr := newTransport(t, httpbalancer.Options{Endpoints: eps, Balancer: b})
	client := &http.Client{Transport: tr}
	post := func(body string) (string, int) {
		t.Helper()
		resp, err := client.Post(responsesURL, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		if resp.StatusCode != http.StatusOK {
			return "", resp.StatusCode
		}
		return responseID(t, got), resp.StatusCode
	}
	opening := `{"model":"m",` + cacheKey + `"input":"a long conversation opens"}`
	prev, _ := post(opening)
	home := strings.Split(prev, "_")[1]

	// Another adapter's calls keep the home server far over its bound.
	other, err := b.NewMembership()
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Update([]inferlb.Endpoint{{ID: home, Addr: "10.9.9.9:1"}}))
	var held []balancer.Pick
	for range 40 {
		p, err := other.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		held = append(held, p)
	}
	defer func() {
		for i := range held {
			held[i].Done(inferlb.Outcome{})
		}
	}()
	// The opening's key alone now spills elsewhere ...
	again, _ := post(opening)
	assert.NotEqual(t, home, strings.Split(again, "_")[1], "the key did not spill: the test shows nothing")
	// ... but every follow-up reaches the server that has the conversation.
	for turn := 1; turn <= 5; turn++ {
		id, code := post(fmt.Sprintf(`{"model":"m",%s"previous_response_id":%q,"input":"turn %d"}`, cacheKey, prev, turn))
		require.Equal(t, http.StatusOK, code, "turn %d", turn)
		assert.Equal(t, home, strings.Split(id, "_")[1], "turn %d", turn)
		prev = id
	}
}

// chunkBody hands out its bytes without ever reporting EOF, as a body
// whose end has not arrived yet.
type chunkBody struct{ r *strings.Reader }

func (b *chunkBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *chunkBody) Close() error               { return nil }

// A caller may Close a response body on one goroutine while another reads
// it (to stop a stream). The Read that finds a Responses answer's ID and the
// Close that reports the call must not race (run with -race).
func TestResponseIDCaptureAndCloseDoNotRace(t *testing.T) {
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		return &http.Response{StatusCode: http.StatusOK, Request: r,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   &chunkBody{strings.NewReader(`{"id":"resp_abc","object":"response"`)}}, nil
	})
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}, Base: base})
	req, err := http.NewRequest(http.MethodPost, responsesURL, strings.NewReader(`{"model":"m","input":"hello there"}`))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		_, _ = resp.Body.Read(buf) // finds the ID
	})
	wg.Go(func() { _ = resp.Body.Close() }) // reports the call
	wg.Wait()
}
