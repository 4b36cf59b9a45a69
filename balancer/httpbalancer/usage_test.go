package httpbalancer_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// countCase is a stream whose first three token events are the first
// bytes of body: first ends with the first one's line, tokens with the
// third's. tokens is the OutputTokens to report.
type countCase struct {
	name          string
	first, stream string
	body          string
	tokens        int
}

// requireCounts reads each case's body at every read size and checks that
// it reports 3 token events timed as before, and OutputTokens tokens;
// then calls an httptest server that streams it at path, a line a flush.
func requireCounts(t *testing.T, path, contentType string, cases []countCase) {
	t.Helper()
	// The byte after which the read that ends a token event's line comes:
	// an SSE event's data line ends before its blank line, an NDJSON
	// line at its LF.
	end := lineEnd
	if contentType == "application/x-ndjson" {
		end = func(s string) int { return len(s) }
	}
	for _, s := range cases {
		t.Run(s.name, func(t *testing.T) {
			require.True(t, strings.HasPrefix(s.body, s.stream) && strings.HasPrefix(s.stream, s.first))
			rig := newStreamRig(t, s.body, contentType)
			for n := 1; n <= len(s.body); n++ {
				r := rig.callWhole(t, n)
				require.Equal(t, 3, r.Events, "%d bytes a read", n)
				require.Equal(t, s.tokens, r.Outcome.OutputTokens, "%d bytes a read", n)
				first, last := (end(s.first)+n-1)/n, (end(s.stream)+n-1)/n
				require.Equal(t, time.Duration(first)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
				require.Equal(t, time.Duration(last-first)*time.Millisecond/2, r.TimeBetweenTokens, "%d bytes a read", n)
			}
			r := serverCall(t, path, contentType, s.body)
			require.Equal(t, 3, r.Events, "over HTTP")
			require.Equal(t, s.tokens, r.Outcome.OutputTokens, "over HTTP")
		})
	}
}

// serverCall makes one streamed call through a Transport to an httptest
// server that answers it with body, flushing it a line at a time, and
// returns what was reported.
func serverCall(t *testing.T, path, contentType, body string) httpbalancer.Result {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		for _, line := range strings.SplitAfter(body, "\n") {
			_, _ = io.WriteString(w, line)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	res := newResults(1)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		OnResult:  res.on,
	})
	req, err := http.NewRequest(http.MethodPost, "http://llm.internal"+path,
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":64}`))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, body, string(got))
	return <-res.c
}

// sseEvent is an SSE event of type typ with one data line.
func sseEvent(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

// TestMessagesStreamUsageGivesOutputTokens: a Messages API stream
// (/v1/messages) ends with a message_delta event whose usage.output_tokens
// is the server's count of the whole message's output tokens (cumulative:
// Anthropic's streaming docs, "Streaming Messages"; vLLM's
// vllm/entrypoints/anthropic/serving.py, message_stream_converter, which
// fills it from the usage chunk's completion_tokens). It is reported as
// Outcome.OutputTokens in place of the count of content_block_delta
// events, at every read boundary; the events still time the first token
// and the gaps. Only that event's own usage counts: not message_start's,
// not a member of the same name in a tool call's arguments, in the delta
// or in usage's iterations (Anthropic's, one a server-tool round); a count
// that is no plain integer leaves the estimate.
func TestMessagesStreamUsageGivesOutputTokens(t *testing.T) {
	// vLLM's events (AnthropicStreamEvent.model_dump_json, exclude_unset:
	// its fields in their declared order).
	start := sseEvent("message_start", `{"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],`+
		`"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"output_tokens":0}}}`)
	block := sseEvent("content_block_start", `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}`)
	text := func(s string) string {
		return sseEvent("content_block_delta", `{"type":"content_block_delta","delta":{"type":"text_delta","text":"`+s+`"},"index":0}`)
	}
	first := start + block + text("Hello there,")
	stream := first + text(" how are") + text(" you?")
	stop := sseEvent("content_block_stop", `{"type":"content_block_stop","index":0}`)
	msgDelta := func(usage string) string {
		return sseEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"}`+usage+`}`)
	}
	end := sseEvent("message_stop", `{"type":"message_stop"}`)
	// Anthropic's, as its docs show them (spaced, with ping events).
	aStart := sseEvent("message_start", `{"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", `+
		`"content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}`) +
		sseEvent("content_block_start", `{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}`) +
		sseEvent("ping", `{"type": "ping"}`)
	aText := func(s string) string {
		return sseEvent("content_block_delta", `{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "`+s+`"}}`)
	}
	aStream := aStart + aText("Hello") + aText("!") + aText(" How")
	aEnd := sseEvent("content_block_stop", `{"type": "content_block_stop", "index": 0}`)
	// A tool call whose arguments hold the member's name and a count.
	tool := start + sseEvent("content_block_start", `{"type":"content_block_start","content_block":{"type":"tool_use","id":"call_1","name":"report","input":{}},"index":0}`)
	args := func(s string) string {
		return sseEvent("content_block_delta", `{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"`+s+`"},"index":0}`)
	}
	toolStream := tool + args(`{\"usage\": {\"output_tokens\": 99}`) + args(`, \"output_tokens\":98`) + args(`}`)
	crlf := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	cases := []countCase{
		{"vLLM", first, stream, stream + stop + msgDelta(`,"usage":{"input_tokens":21,"output_tokens":9}`) + end, 9},
		{"vLLM, CRLF", crlf(first), crlf(stream), crlf(stream + stop + msgDelta(`,"usage":{"input_tokens":21,"output_tokens":9}`) + end), 9},
		{"no space after event:", first, stream, stream + stop + strings.Replace(msgDelta(`,"usage":{"output_tokens":9}`), "event: ", "event:", 1) + end, 9},
		{"Anthropic", aFirst(aStart, aText), aStream, aStream + aEnd + sseEvent("message_delta",
			`{"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}`) +
			sseEvent("message_stop", `{"type": "message_stop"}`), 15},
		{"Anthropic, server tools", aFirst(aStart, aText), aStream, aStream + aEnd + sseEvent("message_delta",
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":6,"cache_creation_input_tokens":0,`+
				`"cache_read_input_tokens":41203,"output_tokens":21,"server_tool_use":{"web_search_requests":1},"iterations":[{"input_tokens":5,"output_tokens":41}]}}`), 21},
		{"iterations first", first, stream, stream + stop + msgDelta(`,"usage":{"iterations":[{"output_tokens":41},{"output_tokens":40}],"output_tokens":21}`) + end, 21},
		{"the delta's is not usage's", first, stream, stream + stop + sseEvent("message_delta",
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","usage":{"output_tokens":7},"output_tokens":8},"output_tokens":6,"usage":{"output_tokens":9}}`) + end, 9},
		{"several message_delta events", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":5}`) + msgDelta(`,"usage":{"output_tokens":12}`) + end, 12},
		{"no usage", first, stream, stream + stop + msgDelta("") + end, 3},
		{"usage null", first, stream, stream + stop + msgDelta(`,"usage":null`) + end, 3},
		{"count null", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":null}`) + end, 3},
		{"a fraction", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":9.5}`) + end, 3},
		{"an exponent", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":9e1}`) + end, 3},
		{"negative", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":-9}`) + end, 3},
		{"too large", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":2147483648}`) + end, 3},
		{"a string", first, stream, stream + stop + msgDelta(`,"usage":{"output_tokens":"9"}`) + end, 3},
		{"escaped key", first, stream, stream + stop + msgDelta(`,"usage":{"output\u005ftokens":9}`) + end, 3},
		// message_start's count is where the message began (Anthropic's 1,
		// vLLM's 0), not its output.
		{"message_start's", strings.Replace(first, `"output_tokens":0`, `"output_tokens":99`, 1),
			strings.Replace(stream, `"output_tokens":0`, `"output_tokens":99`, 1), strings.Replace(stream, `"output_tokens":0`, `"output_tokens":99`, 1) + stop + msgDelta("") + end, 3},
		{"tool call arguments", tool + args(`{\"usage\": {\"output_tokens\": 99}`), toolStream, toolStream + stop + msgDelta(`,"usage":null`) + end, 3},
		{"not a message_delta event", first, stream, stream + stop + msgDelta("") +
			sseEvent("message_stop", `{"type":"message_stop","usage":{"output_tokens":99}}`), 3},
		// A stream cut inside message_delta's data line (the connection
		// ended, or the caller closed the body) has no such event, at
		// every read size, as an Ollama stream cut in its last line has
		// no last object. Before, the count was read from the cut line.
		{"cut in the message_delta line", first, stream, stream + stop + strings.TrimSuffix(msgDelta(`,"usage":{"output_tokens":9}`), "\n\n"), 3},
		{"cut after the count", first, stream, stream + stop + "event: message_delta\ndata: {\"usage\":{\"output_tokens\":9,", 3},
	}
	requireCounts(t, "/v1/messages", "text/event-stream", cases)
}

// aFirst is an Anthropic stream up to its first token event.
func aFirst(start string, text func(string) string) string { return start + text("Hello") }

// TestResponsesStreamUsageGivesOutputTokens: a Responses API stream
// (/v1/responses) ends with a response.completed event (response.incomplete
// when the output bound cut it) carrying the whole response, whose
// usage.output_tokens is the server's count (OpenAI's streaming events
// reference; vLLM's vllm/entrypoints/openai/responses/api_router.py, which
// frames each event as "event: {type}\ndata: {model_dump_json}", and
// SGLang's serving_responses.py, whose ResponseCompletedEvent's usage maps
// completion_tokens to output_tokens; both dump openai-python's models,
// SGLang's fields in their own order: response, sequence_number, type). It is
// reported as Outcome.OutputTokens in place of the count of
// response.output_text.delta events; the events still time the tokens.
// Only the response's own usage counts, not the output's text or a
// function call's arguments that hold the member's name, not a tool's
// schema, not an earlier event's response.
func TestResponsesStreamUsageGivesOutputTokens(t *testing.T) {
	resp := func(status, output, usage string) string {
		return `{"id":"resp_1","created_at":1765000000,"error":null,"incomplete_details":null,"instructions":null,"metadata":null,"model":"m",` +
			`"object":"response","output":[` + output + `],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,` +
			`"max_output_tokens":64,"previous_response_id":null,"status":"` + status + `","usage":` + usage + `}`
	}
	head := sseEvent("response.created", `{"type":"response.created","response":`+resp("in_progress", "", "null")+`,"sequence_number":0}`) +
		sseEvent("response.in_progress", `{"type":"response.in_progress","response":`+resp("in_progress", "", "null")+`,"sequence_number":1}`) +
		sseEvent("response.output_item.added", `{"type":"response.output_item.added","item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2}`) +
		sseEvent("response.content_part.added", `{"type":"response.content_part.added","content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":3}`)
	delta := func(s string) string {
		return sseEvent("response.output_text.delta", `{"type":"response.output_text.delta","content_index":0,"delta":"`+s+`","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":4}`)
	}
	first := head + delta("Hello there,")
	stream := first + delta(" how are") + delta(" you?")
	message := func(text string) string {
		return `{"id":"msg_1","content":[{"annotations":[],"text":"` + text + `","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}`
	}
	done := sseEvent("response.output_text.done", `{"type":"response.output_text.done","content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"text":"Hello there, how are you?"}`) +
		sseEvent("response.content_part.done", `{"type":"response.content_part.done","content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"Hello there, how are you?","type":"output_text"},"sequence_number":8}`) +
		sseEvent("response.output_item.done", `{"type":"response.output_item.done","item":`+message("Hello there, how are you?")+`,"output_index":0,"sequence_number":9}`)
	usage := func(n string) string {
		return `{"input_tokens":21,"input_tokens_details":{"cached_tokens":0},"output_tokens":` + n + `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":30}`
	}
	completed := func(output, usage string) string {
		return sseEvent("response.completed", `{"type":"response.completed","response":`+resp("completed", output, usage)+`,"sequence_number":10}`)
	}
	text := message("Hello there, how are you?")
	// The output's text, a function call's arguments and a tool's schema
	// that hold the member's name and a count.
	quoted := message(`Say \"usage\":{\"output_tokens\":99}, \"response\":{\"usage\":{\"output_tokens\":98}}`)
	call := `{"arguments":"{\"response\":{\"usage\":{\"output_tokens\":99}}}","call_id":"call_1","name":"f","type":"function_call","id":"fc_1","status":"completed"}`
	schema := strings.Replace(resp("completed", text, "null"), `"tools":[]`,
		`"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"usage":{"type":"object","default":{"output_tokens":99}}}}}]`, 1)
	crlf := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	cases := []countCase{
		{"vLLM, OpenAI", first, stream, stream + done + completed(text, usage("9")), 9},
		{"CRLF", crlf(first), crlf(stream), crlf(stream + done + completed(text, usage("9"))), 9},
		{"SGLang", first, stream, stream + done + sseEvent("response.completed",
			`{"response":`+resp("completed", text, usage("9"))+`,"sequence_number":10,"type":"response.completed"}`), 9},
		{"incomplete", first, stream, stream + done + sseEvent("response.incomplete", `{"type":"response.incomplete","response":`+
			strings.Replace(resp("incomplete", text, usage("64")), `"incomplete_details":null`, `"incomplete_details":{"reason":"max_output_tokens"}`, 1)+`,"sequence_number":10}`), 64},
		{"the text's", first, stream, stream + done + completed(quoted, usage("9")), 9},
		{"the text's, no usage", first, stream, stream + done + completed(quoted, "null"), 3},
		{"a function call's arguments", first, stream, stream + done + completed(call, "null"), 3},
		{"a tool's schema", first, stream, stream + done + sseEvent("response.completed", `{"type":"response.completed","response":`+schema+`,"sequence_number":10}`), 3},
		{"not the response's usage", first, stream, stream + done + sseEvent("response.completed",
			`{"type":"response.completed","usage":{"output_tokens":99},"response":`+resp("completed", text, "null")+`}`), 3},
		{"an earlier event's response", strings.Replace(first, `"usage":null`, `"usage":`+usage("99"), 1),
			strings.Replace(stream, `"usage":null`, `"usage":`+usage("99"), 1), strings.Replace(stream, `"usage":null`, `"usage":`+usage("99"), 1) + done, 3},
		{"no completed event", first, stream, stream + done, 3},
		{"details only", first, stream, stream + done + completed(text, `{"output_tokens_details":{"reasoning_tokens":7}}`), 3},
		{"a fraction", first, stream, stream + done + completed(text, usage("9.0")), 3},
		// Cut inside response.completed's data line: no such event.
		{"cut in the completed line", first, stream, stream + done + strings.TrimSuffix(completed(text, usage("9")), "\n\n"), 3},
	}
	requireCounts(t, "/v1/responses", "text/event-stream", cases)
}

// TestOllamaStreamEvalCountGivesOutputTokens: Ollama's /api/chat and
// /api/generate streams end with an object that says "done": true and
// whose eval_count is the number of tokens generated (ollama docs/api.md,
// its streaming examples). It is reported as Outcome.OutputTokens in place
// of the count of lines, read only from that line's own member: not a
// tool call's arguments, not text, not a line before the last.
func TestOllamaStreamEvalCountGivesOutputTokens(t *testing.T) {
	chat := func(c string) string {
		return `{"model":"llama3.2","created_at":"2026-12-05T05:00:00Z","message":{"role":"assistant","content":"` + c + `"},"done":false}` + "\n"
	}
	chatDone := func(metrics string) string {
		return `{"model":"llama3.2","created_at":"2026-12-05T05:00:01Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true` + metrics + "}\n"
	}
	const metrics = `,"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000`
	gen := func(c string) string {
		return `{"model":"llama3.2","created_at":"2026-12-05T05:00:00Z","response":"` + c + `","done":false}` + "\n"
	}
	genDone := `{"model":"llama3.2","created_at":"2026-12-05T05:00:01Z","response":"","done":true,"done_reason":"stop","context":[1,2,3,[4]],` +
		`"total_duration":10706818083,"load_duration":6338219291,"prompt_eval_count":26,"prompt_eval_duration":130079000,"eval_count":259,"eval_duration":4232710000}` + "\n"
	first := chat("The")
	stream := first + chat(" sky") + chat(" is")
	before := first + chat(" sky") + strings.Replace(chat(" is"), `"done":false`, `"done":false,"eval_count":99`, 1)
	toolCall := `{"model":"llama3.2","created_at":"2026-12-05T05:00:00Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"log","arguments":{"done":true,"eval_count":99}}}]},"done":false}` + "\n"
	crlf := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	cases := []countCase{
		{"chat", first, stream, stream + chatDone(metrics), 282},
		{"chat, CRLF", crlf(first), crlf(stream), crlf(stream + chatDone(metrics)), 282},
		{"generate", gen("The"), gen("The") + gen(" sky") + gen(" is"), gen("The") + gen(" sky") + gen(" is") + genDone, 259},
		{"count before done", first, stream, stream + `{"eval_count":12,"done":true}` + "\n", 12},
		{"spaced", first, stream, stream + `{"done": true, "eval_count" : 12 }` + "\n", 12},
		{"no count", first, stream, stream + chatDone(""), 3},
		{"a line before the last", first, before, before + chatDone(""), 3},
		{"nested", first, stream, stream + chatDone(`,"metrics":{"eval_count":99}`), 3},
		{"tool call arguments", toolCall, toolCall + chat(" sky") + chat(" is"), toolCall + chat(" sky") + chat(" is") + chatDone(""), 3},
		{"in text", chat(`\"eval_count\":99`), chat(`\"eval_count\":99`) + chat(" sky") + chat(" is"), chat(`\"eval_count\":99`) + chat(" sky") + chat(" is") + chatDone(""), 3},
		{"a fraction", first, stream, stream + chatDone(`,"eval_count":2.5e2`), 3},
		// A stream cut inside its last line (no LF: the connection ended,
		// or the caller closed the body) has no last object, at every
		// read size, whichever of "done" and eval_count comes first: the
		// line is no event either. Before, the count was read when "done"
		// had shown before eval_count's number ended, which for a count
		// before done depended on where the reads split the line.
		{"cut in the last line", first, stream, stream + strings.TrimSuffix(chatDone(metrics), "\n"), 3},
		{"cut in the last line, count before done", first, stream, stream + `{"eval_count":12,"done":true}`, 3},
		{"cut in the last line, count before done, at its value", first, stream, stream + `{"eval_count":1 "done":t`, 3},
	}
	requireCounts(t, "/api/chat", "application/x-ndjson", cases)
}

// splitData is an SSE event of type typ (none when "") whose JSON data is
// indented and sent a line of it a data line, as an SSE library frames
// data with line breaks (sse-starlette, axum): the event's data is its
// data lines joined with "\n". sep ends each line.
func splitData(typ, data, sep string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(data), "", "  "); err != nil {
		panic(err)
	}
	ev := ""
	if typ != "" {
		ev = "event: " + typ + sep
	}
	for line := range strings.SplitSeq(b.String(), "\n") {
		ev += "data: " + line + sep
	}
	return ev + sep
}

// requireSplitCounts is requireCounts for streams whose first and third
// token events (first and stream end with them) have their JSON over
// several data lines: such an event is read at its end, its blank line,
// as the SSE framing dispatches it, and times its token there. cr: the
// lines end with a bare CR, which ends its line at the byte after it.
func requireSplitCounts(t *testing.T, path string, cr bool, cases []countCase) {
	t.Helper()
	for _, s := range cases {
		t.Run(s.name, func(t *testing.T) {
			require.True(t, strings.HasPrefix(s.body, s.stream) && strings.HasPrefix(s.stream, s.first))
			firstEnd, streamEnd := len(s.first), len(s.stream)
			if cr {
				firstEnd, streamEnd = firstEnd+1, streamEnd+1
			}
			rig := newSSERig(t, s.body)
			for n := 1; n <= len(s.body); n++ {
				r := rig.callWhole(t, n)
				require.Equal(t, 3, r.Events, "%d bytes a read", n)
				require.Equal(t, s.tokens, r.Outcome.OutputTokens, "%d bytes a read", n)
				first, last := (firstEnd+n-1)/n, (streamEnd+n-1)/n
				require.Equal(t, time.Duration(first)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
				require.Equal(t, time.Duration(last-first)*time.Millisecond/2, r.TimeBetweenTokens, "%d bytes a read", n)
			}
			if !cr { // a line a flush
				r := serverCall(t, path, "text/event-stream", s.body)
				require.Equal(t, 3, r.Events, "over HTTP")
				require.Equal(t, s.tokens, r.Outcome.OutputTokens, "over HTTP")
			}
		})
	}
}

// TestJSONOverSeveralDataLines: an event whose JSON comes over several
// data lines (the SSE framing joins them with "\n", white space in JSON;
// openai-python's, openai-go's and Anthropic's SDK decoders join them so)
// is read as one JSON value: an OpenAI-style stream's role, finish and
// usage chunks are no token events and the usage chunk's
// completion_tokens is the output tokens; a Messages API message_delta's
// and a Responses API response.completed's output_tokens are read.
// Comment lines and a "data:" without its space among the data lines
// change nothing, nor do the line endings.
func TestJSONOverSeveralDataLines(t *testing.T) {
	chunk := func(choices, usage string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1765000000,"model":"m","choices":` + choices + usage + `}`
	}
	tok := func(s string) string {
		return chunk(`[{"index":0,"delta":{"content":"`+s+`"},"logprobs":null,"finish_reason":null}]`, "")
	}
	role := chunk(`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`, "")
	finish := chunk(`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]`, "")
	usage := chunk("[]", `,"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}`)
	for _, sep := range []string{"\n", "\r\n", "\r"} {
		s := func(data string) string { return splitData("", data, sep) }
		first := s(role) + s(tok("Hello there,"))
		stream := first + s(tok(" how are")) + s(tok(" you?"))
		body := stream + s(finish) + s(usage) + "data: [DONE]" + sep + sep
		commented := strings.Replace(strings.Replace(body, `  "usage": {`+sep, `  "usage": {`+sep+": keep-alive"+sep, 1),
			`data:     "completion_tokens"`, `data:"completion_tokens"`, 1)
		require.NotEqual(t, body, commented)
		// A line break right after a key's colon, the value on the next
		// data line (indented, or not): white space in the joined JSON.
		// Before, the role and finish chunks after "delta": and the usage
		// chunk after "choices": counted as tokens (6 events, the first
		// timed at the role chunk), and completion_tokens was not read.
		brk := func(data string) string {
			for _, key := range []string{`"choices":`, `"delta":`, `"completion_tokens":`} {
				data = strings.ReplaceAll(data, key, key+sep+"data:   ")
			}
			return "data: " + data + sep + sep
		}
		bFirst := brk(role) + brk(tok("Hello there,"))
		bStream := bFirst + brk(tok(" how are")) + brk(tok(" you?"))
		broken := bStream + brk(finish) + brk(usage) + "data: [DONE]" + sep + sep
		t.Run(strconv.Quote(sep), func(t *testing.T) {
			requireSplitCounts(t, "/v1/chat/completions", sep == "\r", []countCase{
				{"chat", first, stream, body, 9},
				{"comments, no space", first, stream, commented, 9},
				{"a line break after a colon", bFirst, bStream, broken, 9},
			})
		})
	}
	// A Messages API stream, message_delta's JSON over several lines.
	text := func(s string) string {
		return sseEvent("content_block_delta", `{"type":"content_block_delta","delta":{"type":"text_delta","text":"`+s+`"},"index":0}`)
	}
	mFirst := sseEvent("message_start", `{"type":"message_start","message":{"id":"m1","usage":{"input_tokens":21,"output_tokens":0}}}`) + text("Hello")
	mStream := mFirst + text(" how") + text(" you?")
	mDelta := `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":21,"output_tokens":9}}`
	requireCounts(t, "/v1/messages", "text/event-stream", []countCase{
		{"message_delta", mFirst, mStream, mStream + splitData("message_delta", mDelta, "\n") + sseEvent("message_stop", `{"type":"message_stop"}`), 9},
		// Cut where the number ends: the join is its delimiter.
		{"cut after the count", mFirst, mStream, mStream + "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9\ndata: }}\n\n", 9},
		// The stream ends before the event's blank line: the event is
		// never whole, and its count is not read, as its token would not
		// count. Before, the count was read from it.
		{"cut before its blank line", mFirst, mStream, mStream + strings.TrimSuffix(splitData("message_delta", mDelta, "\n"), "\n"), 3},
	})
	// A Responses API stream, response.completed's JSON over several
	// lines, its output's objects before its usage.
	delta := func(s string) string {
		return sseEvent("response.output_text.delta", `{"type":"response.output_text.delta","content_index":0,"delta":"`+s+`","item_id":"msg_1","output_index":0}`)
	}
	rFirst := sseEvent("response.created", `{"type":"response.created","response":{"id":"resp_1","usage":null}}`) + delta("Hello")
	rStream := rFirst + delta(" how") + delta(" you?")
	completed := `{"type":"response.completed","response":{"id":"resp_1","output":[{"id":"msg_1","content":[{"annotations":[],"text":"Hello how you?","type":"output_text"}],` +
		`"role":"assistant","type":"message"}],"usage":{"input_tokens":21,"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0}}},"sequence_number":10}`
	requireCounts(t, "/v1/responses", "text/event-stream", []countCase{
		{"response.completed", rFirst, rStream, rStream + splitData("response.completed", completed, "\n"), 9},
	})
}

// TestErrorJSONOverSeveralDataLines: an error event or a failed response
// whose JSON comes over several data lines is read whole for its code, as
// a one-line one is: a Messages API error event, a Responses API error
// event and response.failed, at every read boundary.
func TestErrorJSONOverSeveralDataLines(t *testing.T) {
	delta := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" A\"}}\n\n"
	failed := func(code string) string {
		return `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_1","status":"failed","output":[{"type":"message","content":[{"type":"output_text","text":"a"}]}],` +
			`"error":{"message":"x","code":"` + code + `"},"usage":null}}`
	}
	for _, s := range []struct {
		name       string
		body       string
		code       int
		overloaded bool
		events     int
	}{
		{"messages internal error", delta + splitData("error", `{"type":"error","error":{"type":"internal_error","message":"CUDA error"}}`, "\n"), 500, false, 1},
		{"messages overloaded", splitData("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "\r\n"), 0, true, 0},
		{"responses server error", splitData("error", `{"type":"error","code":"server_error","message":"x","param":null}`, "\r"), 500, false, 0},
		{"responses failed", delta + splitData("response.failed", failed("server_error"), "\n"), 500, false, 1},
		{"responses failed rate limited", splitData("response.failed", failed("rate_limit_exceeded"), "\n"), 0, true, 0},
		{"responses failed bad image", delta + splitData("response.failed", failed("invalid_image_url"), "\n"), 0, false, 1},
	} {
		t.Run(s.name, func(t *testing.T) {
			rig := newSSERig(t, s.body)
			for n := 1; n <= len(s.body); n++ {
				requireStreamOutcome(t, rig.call(t, n), n, s.events, s.code, s.overloaded)
			}
		})
	}
}
