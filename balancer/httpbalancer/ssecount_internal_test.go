package httpbalancer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferlb/inferlb/internal/testutil"
)

// TestStreamScanDoesNotAllocate: following a stream's chunks (the role
// chunk, token chunks, the empty-delta finish chunk, the usage chunk that
// the output token count is read from) allocates nothing, in reads of any
// size: the scanner runs on every chunk of every stream.
func TestStreamScanDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	const head = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1765000000,"model":"m","choices":`
	body := []byte(head + `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		strings.Repeat(head+`[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`+"\n\n", 50) +
		head + `[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" +
		head + `[],"usage":{"prompt_tokens":9,"completion_tokens":50,"total_tokens":59}}` + "\n\n" + "data: [DONE]\n\n")
	s := new(sseState)
	for _, n := range []int{1, 7, 64, len(body)} {
		allocs := testing.AllocsPerRun(10, func() {
			*s = sseState{counting: true}
			for p := body; len(p) > 0; p = p[min(len(p), n):] {
				s.scan(p[:min(len(p), n)], clock)
			}
		})
		assert.Zero(t, allocs, "%d bytes a read", n)
		assert.EqualValues(t, 50, s.events.Load(), "%d bytes a read", n)
		assert.EqualValues(t, 50, s.outTokens.Load(), "%d bytes a read", n)
	}
}

// TestServerCountScanDoesNotAllocate: reading the server's count of the
// output tokens from a Messages API stream's message_delta event, a
// Responses API stream's response.completed event and an Ollama stream's
// last line allocates nothing, in reads of any size.
func TestServerCountScanDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	text := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\" token\"},\"index\":0}\n\n"
	delta := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"content_index\":0,\"delta\":\" token\",\"item_id\":\"msg_1\",\"output_index\":0}\n\n"
	line := `{"model":"llama3.2","created_at":"2026-12-05T05:00:00Z","message":{"role":"assistant","content":" token"},"done":false}` + "\n"
	for _, s := range []struct {
		name   string
		body   []byte
		ndjson bool
	}{
		{"messages", []byte(strings.Repeat(text, 50) + "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}," +
			"\"usage\":{\"input_tokens\":9,\"output_tokens\":60}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), false},
		{"responses", []byte(strings.Repeat(delta, 50) + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\"," +
			"\"output\":[{\"content\":[{\"text\":\"" + strings.Repeat(" token", 50) + "\",\"type\":\"output_text\"}]}]," +
			"\"usage\":{\"input_tokens\":9,\"output_tokens\":60,\"output_tokens_details\":{\"reasoning_tokens\":0}}}}\n\n"), false},
		{"ollama", []byte(strings.Repeat(line, 50) + `{"model":"llama3.2","done_reason":"stop","done":true,"prompt_eval_count":26,"eval_count":60}` + "\n"), true},
	} {
		st := new(sseState)
		for _, n := range []int{1, 7, 64, len(s.body)} {
			allocs := testing.AllocsPerRun(10, func() {
				*st = sseState{counting: true, ndjson: s.ndjson}
				for p := s.body; len(p) > 0; p = p[min(len(p), n):] {
					st.scan(p[:min(len(p), n)], clock)
				}
			})
			assert.Zero(t, allocs, "%s: %d bytes a read", s.name, n)
			assert.EqualValues(t, 50, st.events.Load(), "%s: %d bytes a read", s.name, n)
			assert.EqualValues(t, 60, st.outTokens.Load(), "%s: %d bytes a read", s.name, n)
		}
	}
}

// TestSplitEventScanDoesNotAllocate: following events whose JSON comes
// over several data lines allocates nothing and keeps nothing of them but
// fixed state, however many lines an event has (10,000 here, of a usage
// chunk whose count comes last), in reads of any size.
func TestSplitEventScanDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	tok := "data: {\n data: \"choices\": [\ndata: {\"delta\": {\"content\": \" token\"}}\ndata: ]\ndata: }\n\n"
	body := []byte(strings.Repeat(tok, 50) + "data: {\"choices\": [],\n" + strings.Repeat("data:   \"x\": 1,\n: keep-alive\n", 10000) +
		"data: \"usage\": {\"completion_tokens\": 60}}\n\n")
	s := new(sseState)
	for _, n := range []int{1, 7, 64, len(body)} {
		allocs := testing.AllocsPerRun(5, func() {
			*s = sseState{counting: true}
			for p := body; len(p) > 0; p = p[min(len(p), n):] {
				s.scan(p[:min(len(p), n)], clock)
			}
		})
		assert.Zero(t, allocs, "%d bytes a read", n)
		assert.EqualValues(t, 50, s.events.Load(), "%d bytes a read", n)
		assert.EqualValues(t, 60, s.outTokens.Load(), "%d bytes a read", n)
	}
}

// BenchmarkStreamScan follows a chat stream (the role chunk, 50 token
// chunks, the finish and usage chunks) and a Messages API stream, an
// event a Read, as a server flushes them: the scanner's cost per stream.
func BenchmarkStreamScan(b *testing.B) {
	clock := testutil.NewClock()
	const head = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1765000000,"model":"m","choices":`
	chat := []string{head + `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n"}
	for range 50 {
		chat = append(chat, head+`[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`+"\n\n")
	}
	chat = append(chat, head+`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`+"\n\n",
		head+`[],"usage":{"prompt_tokens":9,"completion_tokens":50,"total_tokens":59}}`+"\n\n", "data: [DONE]\n\n")
	messages := []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n"}
	for range 50 {
		messages = append(messages, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" token\"}}\n\n")
	}
	messages = append(messages, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":50}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	for _, s := range []struct {
		name   string
		events []string
	}{{"chat", chat}, {"messages", messages}} {
		reads := make([][]byte, len(s.events))
		for i, e := range s.events {
			reads[i] = []byte(e)
		}
		b.Run(s.name, func(b *testing.B) {
			st := new(sseState)
			for b.Loop() {
				*st = sseState{counting: true}
				for _, p := range reads {
					st.scan(p, clock)
				}
			}
			if st.events.Load() != 50 || st.outTokens.Load() != 50 {
				b.Fatalf("events %d, output tokens %d; want 50, 50", st.events.Load(), st.outTokens.Load())
			}
		})
	}
}

// TestIndentedErrorEventIsReadForItsCode: a server that writes its events'
// JSON indented (one data line per line of JSON, as sse-starlette frames
// data that holds line breaks) writes its error object so too: "{" alone
// on the first data line, its "error" key on the next. Such an event is
// the stream's failure, read for its code, and no token; a chunk whose
// first key is another stays a token.
func TestIndentedErrorEventIsReadForItsCode(t *testing.T) {
	clock := testutil.NewClock()
	tok := "data: {\ndata:   \"choices\": [{\"delta\": {\"content\": \"a\"}}]\ndata: }\n\n"
	for _, tc := range []struct {
		name   string
		body   string
		events int64
		code   int32
	}{
		{"error", tok + "data: {\ndata:   \"error\": {\ndata:     \"message\": \"x\",\ndata:     \"code\": 503\ndata:   }\ndata: }\n\n", 1, 503},
		{"error, CRLF and a comment", tok + "data: { \r\n: keep-alive\r\ndata:\r\ndata:\t\"error\": {\"code\": 500}\r\ndata: }\r\n\r\n", 1, 500},
		{"another first key", tok + "data: {\ndata:   \"id\": \"error\",\ndata:   \"choices\": [{\"delta\": {\"content\": \"b\"}}]\ndata: }\n\n", 2, 0},
	} {
		body := []byte(tc.body)
		for _, n := range []int{1, 2, 7, len(body)} {
			s := &sseState{counting: true}
			for p := body; len(p) > 0; p = p[min(len(p), n):] {
				s.scan(p[:min(len(p), n)], clock)
			}
			assert.Equal(t, tc.events, s.events.Load(), "%s: %d bytes a read: token events", tc.name, n)
			assert.Equal(t, tc.code, s.errCode.Load(), "%s: %d bytes a read: error code", tc.name, n)
		}
	}
}
