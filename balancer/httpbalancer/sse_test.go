package httpbalancer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// tickingBody hands out its bytes at most n at a time and advances the
// clock by a millisecond at each Read, so the clock tells which read
// delivered a byte.
type tickingBody struct {
	b     []byte
	n     int
	clock *testutil.Clock
}

func (t *tickingBody) Read(p []byte) (int, error) {
	t.clock.Advance(time.Millisecond)
	if len(t.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), t.n)], t.b)
	t.b = t.b[k:]
	return k, nil
}

func (t *tickingBody) Close() error { return nil }

// sseRig is a Transport whose Base answers every call with one SSE stream,
// handed out n bytes a read with the balancer's clock a millisecond later
// at each read (tickingBody), so tests see where reads split the stream.
type sseRig struct {
	tr   *httpbalancer.Transport
	res  *results
	body string
	n    int // bytes a read, for the next call
}

func newSSERig(t *testing.T, body string) *sseRig {
	t.Helper()
	return newStreamRig(t, body, "text/event-stream")
}

// newStreamRig is newSSERig for a stream of the given content type.
func newStreamRig(t *testing.T, body, contentType string) *sseRig {
	t.Helper()
	clock := testutil.NewClock()
	g := &sseRig{res: newResults(1), body: body}
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {contentType}},
			Body: &tickingBody{b: []byte(body), n: g.n, clock: clock}, Request: r}, nil
	})
	g.tr = newTransport(t, httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}},
		Base:            base,
		BalancerOptions: balancer.Options{Clock: clock},
		OnResult:        g.res.on,
	})
	return g
}

// send makes one streamed chat call whose body gives n bytes a read and
// returns its response.
func (g *sseRig) send(t *testing.T, n int) *http.Response {
	t.Helper()
	g.n = n
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	resp, err := g.tr.RoundTrip(req)
	require.NoError(t, err)
	return resp
}

// call makes one streamed chat call read n bytes at a time, checks the
// caller got the stream byte for byte, and returns what was reported.
func (g *sseRig) call(t *testing.T, n int) httpbalancer.Result {
	t.Helper()
	resp := g.send(t, n)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, g.body, string(got), "%d bytes a read", n)
	return <-g.res.c
}

// TestStreamEventsAtEveryReadBoundary: the streams of real servers, read
// in pieces of every size, reach the caller unchanged, and the outcome
// counts their token events and times the first one, whatever the line
// endings, comments and terminator. An event counts once however many data
// lines it has, and the typed events of the Responses and Messages APIs
// count only when they carry tokens: vLLM's response.created comes before
// the prompt is scheduled.
func TestStreamEventsAtEveryReadBoundary(t *testing.T) {
	for _, s := range []struct {
		name   string
		body   string
		events int
		first  string // the stream up to the end of the first token event's first data line
	}{
		{"vLLM", "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n", 2, "data: {\"a\":1}\n"},
		{"CRLF (sse-starlette)", "data: {\"a\":1}\r\n\r\ndata: {\"a\":2}\r\n\r\ndata: [DONE]\r\n\r\n", 2, "data: {\"a\":1}\r\n"},
		{"no space (TGI)", "data:{\"a\":1}\n\ndata:{\"a\":2}\n\ndata:[DONE]\n\n", 2, "data:{\"a\":1}\n"},
		{"comments", ": ping\n\ndata: {\"a\":1}\n\n: ping - 2026-01-01 00:00:00\r\n\r\ndata: {\"a\":2}\n\n", 2, ": ping\n\ndata: {\"a\":1}\n"},
		{"no [DONE]", "data: {\"a\":1}\n\ndata: {\"a\":2}\n\n", 2, "data: {\"a\":1}\n"},
		{"multi-line data", "data: a\ndata: b\n\ndata: c\r\ndata: d\r\n\r\ndata: [DONE]\n\n", 2, "data: a\n"},
		{"custom event type", "event: token\ndata: a\n\nevent:x\r\ndata: b\r\n\r\n", 2, "event: token\ndata: a\n"},
		{"explicit message type", "event: message\ndata: a\n\nevent:message\r\ndata: b\r\n\r\n", 2, "event: message\ndata: a\n"},
		{"Responses API", "event: response.created\ndata: {\"id\":\"resp_1\"}\n\n" +
			"event: response.in_progress\ndata: {}\n\n" +
			"event: response.output_item.added\ndata: {}\n\n" +
			"event: response.reasoning_text.delta\ndata: {\"delta\":\"x\"}\n\n" +
			"event: response.output_text.delta\r\ndata: {\"delta\":\"y\"}\r\n\r\n" +
			"event: response.output_text.done\ndata: {}\n\n" +
			"event: response.completed\ndata: {}\n\n", 2,
			"event: response.created\ndata: {\"id\":\"resp_1\"}\n\nevent: response.in_progress\ndata: {}\n\n" +
				"event: response.output_item.added\ndata: {}\n\nevent: response.reasoning_text.delta\ndata: {\"delta\":\"x\"}\n"},
		{"Anthropic Messages API", "event: message_start\ndata: {}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n" +
			"event: content_block_start\ndata: {}\n\nevent: content_block_delta\ndata: {\"delta\":\"x\"}\n\n" +
			"event: content_block_delta\ndata: {\"delta\":\"y\"}\n\nevent: content_block_stop\ndata: {}\n\nevent: message_stop\ndata: {}\n\n", 2,
			"event: message_start\ndata: {}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_start\ndata: {}\n\n" +
				"event: content_block_delta\ndata: {\"delta\":\"x\"}\n"},
		{"error event", "data: {\"a\":1}\n\nevent: error\ndata: {\"error\":\"boom\"}\n\ndata: {\"a\":2}\n\n", 2, "data: {\"a\":1}\n"},
		// A bare CR ends a line too (WHATWG's EventSource), once the byte
		// after it shows it is not a CRLF's: first runs to that byte.
		{"bare CR", "data: {\"a\":1}\r\rdata: {\"a\":2}\r\rdata: [DONE]\r\r", 2, "data: {\"a\":1}\r\r"},
		{"bare CR, typed and multi-line", "event: ping\rdata: {}\r\revent: token\rdata: a\rdata: b\r\rdata: c\r\r", 2, "event: ping\rdata: {}\r\revent: token\rdata: a\rd"},
		{"mixed endings", "event: ping\r\ndata: x\r\rdata: {\"a\":1}\n\ndata: {\"a\":2}\r\r", 2, "event: ping\r\ndata: x\r\rdata: {\"a\":1}\n"},
	} {
		t.Run(s.name, func(t *testing.T) {
			rig := newSSERig(t, s.body)
			for n := 1; n <= len(s.body); n++ {
				r := rig.call(t, n)
				require.Equal(t, s.events, r.Events, "%d bytes a read", n)
				reads := (len(s.first) + n - 1) / n // the read that ends the first token's data line
				require.Equal(t, time.Duration(reads)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
			}
		})
	}
}

// TestBareCRAtEOFEndsTheLine: a CR that ends the stream ends its line, as
// a LF would (no LF can follow it), whatever the reads' sizes.
func TestBareCRAtEOFEndsTheLine(t *testing.T) {
	body := "data: {\"a\":1}\r\rdata: {\"a\":2}\r"
	rig := newSSERig(t, body)
	for n := 1; n <= len(body); n++ {
		require.Equal(t, 2, rig.call(t, n).Events, "%d bytes a read", n)
	}
}

// TestNDJSONStreamTokensAtEveryReadBoundary: Ollama streams a chat as
// newline-delimited JSON (application/x-ndjson), one object a chunk and a
// last one that says "done":true and carries no token. Each chunk line is
// a token event, timed as an SSE event is, whatever the reads' sizes; the
// done line, blank lines and an error line are not, and an error line
// (a runner that crashed mid-stream) is the endpoint's failure.
func TestNDJSONStreamTokensAtEveryReadBoundary(t *testing.T) {
	chunk := func(c string) string {
		return `{"model":"llama3","created_at":"2026-12-05T05:00:00Z","message":{"role":"assistant","content":"` + c + `"},"done":false}` + "\n"
	}
	done := `{"model":"llama3","created_at":"2026-12-05T05:00:01Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"total_duration":5,"eval_count":3}` + "\n"
	toolCall := `{"model":"llama3.2","created_at":"2026-12-05T05:00:00Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"add_todo","arguments":{"task":"buy milk","done":true}}}]},"done":false}` + "\n"
	for _, s := range []struct {
		name   string
		body   string
		events int
		first  string
	}{
		{"chat", chunk("a") + chunk("b") + chunk("c") + done, 3, chunk("a")},
		{"CRLF and blank lines", "\r\n" + strings.ReplaceAll(chunk("a")+chunk("b")+done, "\n", "\r\n"), 2, "\r\n" + strings.ReplaceAll(chunk("a"), "\n", "\r\n")},
		{"done with spaces", chunk("a") + `{"done": true}` + "\n", 1, chunk("a")},
		// A to-do tool's call: its arguments' "done": true is not the
		// chunk's own, which is false; the chunk is an event.
		{"tool call arguments", toolCall + chunk("b") + done, 2, toolCall},
		{"done in text", chunk(`\"done\":true`) + chunk(`{\"done\": true}`) + done, 2, chunk(`\"done\":true`)},
		{"done as a value", `{"message":{"content":"done"},"status":"done","done":false}` + "\n" + done, 1, `{"message":{"content":"done"},"status":"done","done":false}` + "\n"},
		{"an error line", chunk("a") + `{"error":"model runner has unexpectedly stopped"}` + "\n", 1, chunk("a")},
	} {
		failed := strings.Contains(s.body, `{"error"`)
		t.Run(s.name, func(t *testing.T) {
			rig := newStreamRig(t, s.body, "application/x-ndjson")
			for n := 1; n <= len(s.body); n++ {
				r := rig.call(t, n)
				require.Equal(t, s.events, r.Events, "%d bytes a read", n)
				var se *httpbalancer.StatusError
				require.Equal(t, failed, errors.As(r.Outcome.Err, &se) && se.StatusCode == http.StatusInternalServerError,
					"%d bytes a read: the error line is the endpoint's failure (outcome %v)", n, r.Outcome.Err)
				reads := (len(s.first) + n - 1) / n
				require.Equal(t, time.Duration(reads)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
			}
		})
	}
}

var errConnClosed = errors.New("use of closed network connection")

// closingBody is a response body whose Read blocks until Close, then fails
// as a connection closed under it does. Its Close returns only when
// proceed is closed, so a test can let the blocked Read return first, as
// net/http's may.
type closingBody struct {
	reading, closing, proceed chan struct{}
}

func (b *closingBody) Read([]byte) (int, error) {
	close(b.reading)
	<-b.closing
	return 0, errConnClosed
}

func (b *closingBody) Close() error {
	close(b.closing)
	<-b.proceed
	return nil
}

// TestCloseDuringReadIsNotAFailure: a caller that stops a stream by closing
// its body while another goroutine is blocked reading it ends the call as
// any Close before EOF does. The blocked Read fails because of the Close
// and may return before Close does; the endpoint must not be blamed for
// that error.
func TestCloseDuringReadIsNotAFailure(t *testing.T) {
	body := &closingBody{reading: make(chan struct{}), closing: make(chan struct{}), proceed: make(chan struct{})}
	base := baseFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: r}, nil
	})
	res := newResults(2)
	tr := newTransport(t, httpbalancer.Options{Endpoints: []inferlb.Endpoint{{ID: "e", Addr: "10.0.0.1:80"}}, Base: base, OnResult: res.on})
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)

	readErr := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 64))
		readErr <- err
	}()
	<-body.reading
	closed := make(chan error, 1)
	go func() { closed <- resp.Body.Close() }()
	require.ErrorIs(t, <-readErr, errConnClosed) // the Read is back before Close is
	close(body.proceed)
	require.NoError(t, <-closed)

	require.EqualValues(t, 1, res.n.Load())
	r := <-res.c
	require.NoError(t, r.Outcome.Err)
	st := statsByID(tr.Balancer())["e"]
	require.EqualValues(t, 1, st.Successes)
	require.Zero(t, st.Failures)
}

// expiring is a context whose deadline passes when expire is called, so a
// test can end a call by its deadline at an exact point without timing.
type expiring struct {
	context.Context
	done chan struct{}
}

func newExpiring() *expiring {
	return &expiring{Context: context.Background(), done: make(chan struct{})}
}

func (c *expiring) expire()                     { close(c.done) }
func (c *expiring) Done() <-chan struct{}       { return c.done }
func (c *expiring) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *expiring) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestDeadlineMidStreamIsNotAFailure: the caller's deadline ending a
// stream that was producing tokens counts as neither success nor failure
// (ErrDeadlineMidStream); the same deadline passing before the first token
// is a failure of the endpoint.
func TestDeadlineMidStreamIsNotAFailure(t *testing.T) {
	for _, tokens := range []int{1, 0} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for range tokens {
				fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done() // a long generation, until the caller gives up
		}))
		res := newResults(2)
		tr := newTransport(t, httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
			OnResult:  res.on,
		})
		ctx := newExpiring()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		if tokens > 0 {
			buf := make([]byte, 256)
			n, err := resp.Body.Read(buf)
			require.NoError(t, err)
			require.Contains(t, string(buf[:n]), "tok")
		}
		ctx.expire()
		_, err = io.Copy(io.Discard, resp.Body)
		require.Error(t, err)
		require.NoError(t, resp.Body.Close())
		r := <-res.c
		st := statsByID(tr.Balancer())["e"]
		require.ErrorIs(t, r.Outcome.Err, context.DeadlineExceeded, "tokens=%d", tokens)
		if tokens > 0 {
			require.ErrorIs(t, r.Outcome.Err, httpbalancer.ErrDeadlineMidStream)
			require.ErrorIs(t, r.Outcome.Err, context.Canceled, "counted as neither")
			require.Equal(t, "inferlb: the caller's deadline ended the answer after it began (a stream's first token, another body's headers)", r.Outcome.Err.Error())
			require.True(t, r.Outcome.Canceled())
			require.Zero(t, st.Failures)
		} else {
			require.False(t, r.Outcome.Canceled())
			require.EqualValues(t, 1, st.Failures)
		}
		srv.Close()
	}
}

// TestStreamErrorEventIsTheEndpointsFailure: a 200 stream that reports an
// error object mid-way, as vLLM and SGLang do when generation fails, is the
// endpoint's failure when its code is a 5xx and not when it is a 4xx or has
// none, wherever the reads split it; the event is no token. The code is the
// error object's own (or the top-level object's), however long the message
// before it, and never text inside the message or a nested object.
func TestStreamErrorEventIsTheEndpointsFailure(t *testing.T) {
	long := strings.Repeat("x", 2000)
	// A Python traceback as a JSON string: 5 KB of escapes and quotes,
	// and text that looks like a code.
	trace := strings.Repeat(`Traceback (most recent call last):\n  File \"/vllm/engine.py\", line 42, in step\n    raise EngineDeadError({\"code\": 500})\n`, 40)
	vllm := func(message string, code int) string {
		return "data: {\"a\":1}\n\ndata: {\"error\": {\"object\": \"error\", \"message\": \"" + message +
			"\", \"type\": \"X\", \"param\": null, \"code\": " + fmt.Sprint(code) + "}}\n\ndata: [DONE]\n\n"
	}
	for _, s := range []struct {
		name   string
		body   string
		code   int // StatusError code reported; 0 for a success
		events int
	}{
		{"vLLM 500", "data: {\"a\":1}\n\ndata: {\"error\": {\"object\": \"error\", \"message\": \"Internal server error\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\ndata: [DONE]\n\n", 500, 1},
		{"no space, CRLF", "data:{\"a\":1}\r\n\r\ndata:{\"error\":{\"message\":\"engine dead\",\"code\":503}}\r\n\r\n", 503, 1},
		{"400 is the request's", "data: {\"a\":1}\n\ndata: {\"error\": {\"message\": \"bad tool call\", \"type\": \"BadRequestError\", \"code\": 400}}\n\ndata: [DONE]\n\n", 0, 1},
		{"no code", "data: {\"a\":1}\n\ndata: {\"error\": \"boom\"}\n\n", 0, 1},
		{"code past a long message", "data: {\"a\":1}\n\ndata: {\"error\": {\"message\": \"" + long + "\", \"code\": 500}}\n\n", 500, 1},
		{"500 past a traceback", vllm(trace, 500), 500, 1},
		{"400 past a traceback", vllm(trace, 400), 0, 1},
		{"a code in the message is text", vllm(`bad value {\"code\": 500, \"x\": 1}`, 400), 0, 1},
		{"a code in the message is text, then none", "data: {\"error\": {\"message\": \"\\\"code\\\": 500\"}}\n\n", 0, 0},
		{"a nested code is not the error's", "data: {\"error\": {\"param\": {\"code\": 500}, \"code\": 422}}\n\n", 0, 0},
		{"top-level code", "data: {\"error\": \"" + long + "\", \"code\": 502}\r\n\r\n", 502, 0},
		{"the error object's code first", "data: {\"error\": {\"code\": 400}, \"code\": 500}\n\n", 0, 0},
		{"a string code is none", "data: {\"error\": {\"message\": \"" + long + "\", \"code\": \"500\"}}\n\n", 0, 0},
		{"short", "data: {\"error\":{\"code\":500}}\n\n", 500, 0},
		{"bare CR", "data: {\"a\":1}\r\rdata: {\"error\": {\"message\": \"" + long + "\", \"code\": 500}}\r\rdata: [DONE]\r\r", 500, 1},
		{"bare CR, ended by EOF", "data: {\"a\":1}\r\rdata: {\"error\": {\"code\": 503}}\r", 503, 1},
		{"bare CR, 400", "data: {\"a\":1}\r\rdata: {\"error\": {\"code\": 400}}\r\rdata: {\"a\":2}\r\r", 0, 2},
		{"error text in a token", "data: {\"delta\":\"{\\\"error\\\": \\\"code\\\": 500\"}\n\n", 0, 1},
	} {
		t.Run(s.name, func(t *testing.T) {
			rig := newSSERig(t, s.body)
			for _, n := range []int{1, 2, 3, 7, 16, 17, 64, len(s.body)} {
				requireStreamOutcome(t, rig.call(t, n), n, s.events, s.code, false)
			}
		})
	}
}

// TestStreamErrorEventKinds: TGI checks a streamed request and takes its queue
// slot after the 200 headers (and SGLang sheds a stream after them too), so an overloaded or failing TGI answers with
// a stream that ends in an error event without a code: {"error": text,
// "error_type": kind} on its native routes, {"error": {"message": text,
// "http_status_code": 422}} on its OpenAI-compatible ones, 422 whatever the
// error. Overloaded is an overload answer, a failed or cut generation the
// endpoint's failure, a validation error the request's; wherever the reads
// split the event. The Messages API (/v1/messages, which vLLM and SGLang
// serve) reports a failure mid-stream as an event of type "error" whose
// error's type is its kind: internal_error (vLLM's and SGLang's for an
// exception while streaming) and api_error are failures, overloaded_error
// an overload, invalid_request_error the request's. The Responses API
// (/v1/responses) reports one as an event of type "error" with a string
// code (server_error a failure, rate_limit_exceeded an overload, others
// such as invalid_prompt the request's), or ends the response with a
// response.failed event: a failure; response.incomplete (a token limit
// reached) is not one.
func TestStreamErrorEventKinds(t *testing.T) {
	token := `data:{"index":1,"token":{"id":330,"text":" A","logprob":-0.5,"special":false},"generated_text":null,"details":null,"top_tokens":null}` + "\n\n"
	chunk := `data: {"object":"chat.completion.chunk","id":"","created":1,"model":"m","system_fingerprint":"3.3.4-native","choices":[{"index":0,"delta":{"role":"assistant","content":" A"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	native := func(text, kind string) string {
		return `data:{"error":"` + text + `","error_type":"` + kind + `"}` + "\n\n"
	}
	delta := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" A\"}}\n\n"
	messagesError := func(kind, text string) string {
		return "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"" + kind + "\",\"message\":\"" + text + "\"}}\n\ndata: [DONE]\n\n"
	}
	openai := func(text string) string {
		return `data: {"error":{"message":"` + text + `","http_status_code":422}}` + "\n\ndata: [DONE]\n\n"
	}
	responsesStart := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"},\"sequence_number\":0}\n\n"
	responsesDelta := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" A\",\"sequence_number\":1}\n\n"
	responsesError := func(code string) string {
		return "event: error\ndata: {\"type\":\"error\",\"code\":\"" + code + "\",\"message\":\"x\",\"param\":null,\"sequence_number\":2}\n\n"
	}
	responsesFailed := "event: response.failed\r\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"The model failed to generate a response.\"}},\"sequence_number\":2}\r\n\r\n"
	// A failed response's error sits inside the response object, after its
	// output, which can be long.
	failedWith := func(errorJSON string) string {
		return "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"failed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" +
			strings.Repeat("a long answer, with \\\"code\\\": 500 in it; ", 40) + "\"}]}],\"error\":" + errorJSON + ",\"usage\":null},\"code\":\"rate_limit_exceeded\"}\n\n"
	}
	for _, s := range []struct {
		name       string
		body       string
		code       int // StatusError code reported; 0 for none
		overloaded bool
		events     int
	}{
		{"native overloaded", native("Model is overloaded", "overloaded"), 0, true, 0},
		{"native generation failed", token + native("Request failed during generation: Server error: CUDA out of memory. Tried to allocate 1.00 GiB", "generation"), 500, false, 1},
		{"native stream cut", token + native("Incomplete generation stream", "incomplete_generation_stream"), 500, false, 1},
		{"native validation", native("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`", "validation"), 0, false, 0},
		{"openai overloaded", openai("Model is overloaded"), 0, true, 0},
		{"openai generation failed", chunk + openai("Request failed during generation: Server error: CUDA out of memory"), 500, false, 1},
		{"openai stream cut", chunk + openai("Incomplete generation stream"), 500, false, 1},
		{"openai validation", openai("Input validation error: `temperature` must be strictly positive"), 0, false, 0},
		// SGLang sheds load (--max-queued-requests) the same way, with a
		// 503 error event on a 200 stream: an overload too.
		{"SGLang queue full", `data: {"error": {"object": "error", "message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}` + "\n\ndata: [DONE]\n\n", 0, true, 0},
		{"SGLang engine failed", chunk + `data: {"error": {"object": "error", "message": "Internal server error", "type": "InternalServerError", "param": null, "code": 503}}` + "\n\ndata: [DONE]\n\n", 503, false, 1},
		{"messages internal error", delta + messagesError("internal_error", "CUDA error: an illegal memory access was encountered"), 500, false, 1},
		{"messages overloaded", messagesError("overloaded_error", "Overloaded"), 0, true, 0},
		{"messages invalid request", messagesError("invalid_request_error", "prompt is too long: 9000 tokens > 8192 maximum"), 0, false, 0},
		{"responses server error", responsesStart + responsesDelta + responsesError("server_error"), 500, false, 1},
		{"responses rate limited", responsesStart + responsesError("rate_limit_exceeded"), 0, true, 0},
		{"responses invalid prompt", responsesStart + responsesError("invalid_prompt"), 0, false, 0},
		{"responses failed", responsesStart + responsesDelta + responsesFailed, 500, false, 1},
		// Data too short to hold a response's error (it fits the
		// scanner's line buffer, so it is read whole: failedLineCode): a
		// response that failed and says nothing of why is the endpoint's
		// failure.
		{"responses failed short data", responsesStart + responsesDelta + "event: response.failed\ndata: {}\n\n", 500, false, 1},
		{"responses failed short data, CRLF", responsesStart + responsesDelta + "event: response.failed\r\ndata: null\r\n\r\n", 500, false, 1},
		// The error's code says whose failure it is (the envelope's own
		// members do not count).
		{"responses failed rate limited", responsesStart + failedWith(`{"code":"rate_limit_exceeded","message":"Slow down"}`), 0, true, 0},
		{"responses failed bad image", responsesStart + responsesDelta + failedWith(`{"code":"invalid_image_url","message":"x"}`), 0, false, 1},
		{"responses failed too long", responsesStart + failedWith(`{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model."}`), 0, false, 0},
		{"responses failed server error", responsesStart + responsesDelta + failedWith(`{"message":"x","code":"server_error"}`), 500, false, 1},
		{"responses failed no code", responsesStart + responsesDelta + failedWith(`{"code":null,"message":"x"}`), 500, false, 1},
		{"responses failed no error", responsesStart + responsesDelta + failedWith(`null`), 500, false, 1},
		{"responses incomplete", responsesStart + responsesDelta + "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"id\":\"resp_1\",\"status\":\"incomplete\"}}\n\n", 0, false, 1},
	} {
		t.Run(s.name, func(t *testing.T) {
			rig := newSSERig(t, s.body)
			for _, n := range []int{1, 2, 5, 16, 64, len(s.body)} {
				requireStreamOutcome(t, rig.call(t, n), n, s.events, s.code, s.overloaded)
			}
		})
	}
}

// requireStreamOutcome checks what a stream read n bytes a read reported:
// its token events, and a StatusError with code (none for 0), or an
// overload answer without a hint.
func requireStreamOutcome(t *testing.T, r httpbalancer.Result, n, events, code int, overloaded bool) {
	t.Helper()
	require.Equal(t, events, r.Events, "%d bytes a read", n)
	require.Equal(t, overloaded, r.Outcome.Overloaded, "%d bytes a read", n)
	require.Zero(t, r.Outcome.RetryAfter, "no hint in an event")
	if code == 0 {
		require.NoError(t, r.Outcome.Err, "%d bytes a read", n)
		return
	}
	var se *httpbalancer.StatusError
	require.ErrorAs(t, r.Outcome.Err, &se, "%d bytes a read", n)
	require.Equal(t, code, se.StatusCode)
	require.Equal(t, fmt.Sprintf("inferlb: endpoint answered %d %s", code, http.StatusText(code)), se.Error())
}

// TestDeadlineInABodyAfterItsHeadersIsNotAFailure: an answer that is no
// stream (an embedding's JSON) had begun once its headers came: the
// caller's deadline ending the body while the caller reads it counts as
// neither, as it does for a stream after its first token. It counted as
// the endpoint's failure, so large embedding batches read under a tight
// deadline opened healthy endpoints' breakers.
func TestDeadlineInABodyAfterItsHeadersIsNotAFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","embedding":[0.1,`)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest of a large batch, not read in time
	}))
	defer srv.Close()
	res := newResults(5)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "e", Addr: strings.TrimPrefix(srv.URL, "http://")}},
		OnResult:  res.on,
	})
	for range 5 { // the default breaker opens at 5 failures in a row
		ctx := newExpiring()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://emb/v1/embeddings", strings.NewReader(`{"model":"e5","input":["a"]}`))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		buf := make([]byte, 16)
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		ctx.expire()
		_, err = io.Copy(io.Discard, resp.Body)
		require.Error(t, err)
		require.NoError(t, resp.Body.Close())
		r := <-res.c
		require.ErrorIs(t, r.Outcome.Err, httpbalancer.ErrDeadlineMidStream)
		require.ErrorIs(t, r.Outcome.Err, context.DeadlineExceeded)
		require.True(t, r.Outcome.Canceled())
	}
	st := statsByID(tr.Balancer())["e"]
	require.Zero(t, st.Failures)
	require.False(t, st.BreakerOpen)
}

// TestStreamChunksWithoutTokensAreNotCounted: the chunks of real
// OpenAI-style streams that carry no token are not counted, at every read
// boundary: vLLM's chat stream opens with a chunk that holds only the role
// ({"role":"assistant","content":""}, sent with the first token), and a
// call that asks stream_options.include_usage ends with a chunk whose
// choices are empty and that carries the usage. Counted, the output tokens
// were two too many and the time between tokens the span over N+1 gaps,
// not N-1. Nor is the finish chunk whose delta is empty ({}: OpenAI's,
// SGLang's, llama.cpp's), which OpenAI's usage.completion_tokens does not
// count. Time to first token is the first token's chunk's. A chunk with
// empty text and no role (vLLM's last, {"content":""} at finish_reason: the
// end of generation's token, which vLLM's usage counts) counts, and so do
// the role's chunks that carry text (TGI's) or a tool call. A role chunk
// after the first token (SGLang's for choice 1 with n = 2) is no token,
// unless the token chunks give the role too (TGI's: its last, with no
// text, is the end of generation's token).
func TestStreamChunksWithoutTokensAreNotCounted(t *testing.T) {
	const model = `"model":"meta-llama/Llama-3.1-8B-Instruct"`
	chat := func(choices string) string {
		return `data: {"id":"chatcmpl-9f1c2d3e4b5a69788796a5b4c3d2e1f0","object":"chat.completion.chunk","created":1765000000,` +
			model + `,"choices":` + choices + "}\n\n"
	}
	delta := func(d, finish string) string {
		return `[{"index":0,"delta":` + d + `,"logprobs":null,"finish_reason":` + finish + `}]`
	}
	usage := func(n int) string {
		return `data: {"id":"chatcmpl-9f1c2d3e4b5a69788796a5b4c3d2e1f0","object":"chat.completion.chunk","created":1765000000,` +
			model + `,"choices":[],"usage":{"prompt_tokens":21,"total_tokens":` + strconv.Itoa(21+n) + `,"completion_tokens":` + strconv.Itoa(n) + `}}` + "\n\n"
	}
	role := chat(delta(`{"role":"assistant","content":""}`, "null"))
	tok := func(s string) string { return chat(delta(`{"content":"`+s+`"}`, "null")) }
	last := chat(`[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]`)
	done := "data: [DONE]\n\n"

	cmpl := func(text, finish string) string {
		return `data: {"id":"cmpl-0a1b2c3d4e5f60718293a4b5c6d7e8f9","object":"text_completion","created":1765000000,` + model +
			`,"choices":[{"index":0,"text":"` + text + `","logprobs":null,"finish_reason":` + finish + `,"stop_reason":null}]}` + "\n\n"
	}
	cmplUsage := `data: {"id":"cmpl-0a1b2c3d4e5f60718293a4b5c6d7e8f9","object":"text_completion","created":1765000000,` + model +
		`,"choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}` + "\n\n"

	openai := func(d, finish string) string {
		return `data: {"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1765000000,"model":"gpt-4o-mini-2024-07-18",` +
			`"system_fingerprint":"fp_01","choices":[{"index":0,"delta":` + d + `,"logprobs":null,"finish_reason":` + finish + `}],"usage":null}` + "\n\n"
	}
	openaiUsage := `data: {"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1765000000,"model":"gpt-4o-mini-2024-07-18",` +
		`"system_fingerprint":"fp_01","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}` + "\n\n"
	// SGLang's chunks (sse_utils.build_sse_content), and its usage chunk.
	sglang := func(index int, d, finish string) string {
		return `data: {"id":"7d2f0e6c5b4a49388271605f4e3d2c1b","object":"chat.completion.chunk","created":1765000000,"model":"qwen",` +
			`"choices":[{"index":` + strconv.Itoa(index) + `,"delta":` + d + `,"logprobs":null,"finish_reason":` + finish + `,"matched_stop":null}]}` + "\n\n"
	}
	sglangUsage := `data: {"id":"7d2f0e6c5b4a49388271605f4e3d2c1b","object":"chat.completion.chunk","created":1765000000,"model":"qwen",` +
		`"choices":[],"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2,"prompt_tokens_details":null,"reasoning_tokens":0}}` + "\n\n"
	llamacpp := func(d, finish string) string {
		return `data: {"choices":[{"finish_reason":` + finish + `,"index":0,"delta":` + d + `}],"created":1765000000,"id":"chatcmpl-x",` +
			`"model":"gpt-3.5-turbo","system_fingerprint":"b5000","object":"chat.completion.chunk"}` + "\n\n"
	}

	for _, s := range []struct {
		name        string
		body        string
		events      int
		first, last string // the stream up to the end of the first and the last token events
	}{
		{"vLLM chat with usage", role + tok("Hello") + tok(" there") + last + usage(3) + done, 3,
			role + tok("Hello"), role + tok("Hello") + tok(" there") + last},
		{"vLLM chat", role + tok("Hi") + last + done, 2, role + tok("Hi"), role + tok("Hi") + last},
		{"vLLM chat, CRLF", strings.ReplaceAll(role+tok("Hi")+last+usage(2), "\n", "\r\n"), 2,
			strings.ReplaceAll(role+tok("Hi"), "\n", "\r\n"), strings.ReplaceAll(role+tok("Hi")+last, "\n", "\r\n")},
		{"vLLM completions with usage", cmpl(" Paris", "null") + cmpl(".", "null") + cmpl(" It", `"length"`) + cmplUsage + done, 3,
			cmpl(" Paris", "null"), cmpl(" Paris", "null") + cmpl(".", "null") + cmpl(" It", `"length"`)},
		// OpenAI's finish chunk has an empty delta, and its
		// usage.completion_tokens does not count it.
		{"OpenAI", openai(`{"role":"assistant","content":"","refusal":null}`, "null") + openai(`{"content":"Hi"}`, "null") +
			openai(`{"content":"!"}`, "null") + openai(`{}`, `"stop"`) + openaiUsage + done, 2,
			openai(`{"role":"assistant","content":"","refusal":null}`, "null") + openai(`{"content":"Hi"}`, "null"),
			openai(`{"role":"assistant","content":"","refusal":null}`, "null") + openai(`{"content":"Hi"}`, "null") + openai(`{"content":"!"}`, "null")},
		{"llama.cpp", llamacpp(`{"role":"assistant","content":null}`, "null") + llamacpp(`{"content":"Hi"}`, "null") +
			llamacpp(`{"content":"!"}`, "null") + llamacpp(` { } `, `"stop"`) + done, 2,
			llamacpp(`{"role":"assistant","content":null}`, "null") + llamacpp(`{"content":"Hi"}`, "null"),
			llamacpp(`{"role":"assistant","content":null}`, "null") + llamacpp(`{"content":"Hi"}`, "null") + llamacpp(`{"content":"!"}`, "null")},
		// SGLang sends the finish chunk, its delta empty, after the last
		// token's.
		{"SGLang", sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null") +
			sglang(0, `{"content":"!"}`, "null") + sglang(0, `{}`, `"stop"`) + sglangUsage + done, 2,
			sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null"),
			sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null") + sglang(0, `{"content":"!"}`, "null")},
		// With n = 2 SGLang sends choice 1's role chunk when its first
		// output comes, after choice 0's first token.
		{"SGLang, n = 2", sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null") +
			sglang(1, `{"role":"assistant","content":""}`, "null") + sglang(1, `{"content":"Yo"}`, "null") +
			sglang(0, `{"content":"!"}`, "null") + sglang(1, `{"content":"?"}`, "null") +
			sglang(0, `{}`, `"stop"`) + sglang(1, `{}`, `"stop"`) + done, 4,
			sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null"),
			sglang(0, `{"role":"assistant","content":""}`, "null") + sglang(0, `{"content":"Hi"}`, "null") +
				sglang(1, `{"role":"assistant","content":""}`, "null") + sglang(1, `{"content":"Yo"}`, "null") +
				sglang(0, `{"content":"!"}`, "null") + sglang(1, `{"content":"?"}`, "null")},
		// TGI repeats the role in every delta: each carries a token, its
		// last (the end of generation's, with no text) too.
		{"TGI", chat(delta(`{"role":"assistant","content":"Hi"}`, "null")) + chat(delta(`{"role":"assistant","content":"!"}`, "null")) +
			chat(delta(`{"role":"assistant","content":""}`, `"stop"`)) + done, 3,
			chat(delta(`{"role":"assistant","content":"Hi"}`, "null")),
			chat(delta(`{"role":"assistant","content":"Hi"}`, "null")) + chat(delta(`{"role":"assistant","content":"!"}`, "null")) +
				chat(delta(`{"role":"assistant","content":""}`, `"stop"`))},
		{"role with text", chat(delta(`{"role":"assistant","content":"Hi"}`, "null")) + chat(delta(`{"role":"assistant","content":"!"}`, `"stop"`)), 2,
			chat(delta(`{"role":"assistant","content":"Hi"}`, "null")),
			chat(delta(`{"role":"assistant","content":"Hi"}`, "null")) + chat(delta(`{"role":"assistant","content":"!"}`, `"stop"`))},
		{"role with a tool call", chat(delta(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`, "null")) + tok("x"), 2,
			chat(delta(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`, "null")),
			chat(delta(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`, "null")) + tok("x")},
		// Text that reads as an empty choices list or a role's delta is
		// text: its quotes are escaped.
		{"look-alikes in text", role + tok(`[\"choices\":[]]`) + tok(`\"delta\":{\"role\":\"assistant\",\"content\":\"\"}`) + done, 2,
			role + tok(`[\"choices\":[]]`), role + tok(`[\"choices\":[]]`) + tok(`\"delta\":{\"role\":\"assistant\",\"content\":\"\"}`)},
	} {
		t.Run(s.name, func(t *testing.T) {
			require.True(t, strings.HasPrefix(s.body, s.last) && strings.HasPrefix(s.last, s.first))
			rig := newSSERig(t, s.body)
			for n := 1; n <= len(s.body); n++ {
				r := rig.callWhole(t, n)
				require.Equal(t, s.events, r.Events, "%d bytes a read", n)
				require.Equal(t, s.events, r.Outcome.OutputTokens, "%d bytes a read", n)
				first, last := (lineEnd(s.first)+n-1)/n, (lineEnd(s.last)+n-1)/n // the reads that end those lines
				require.Equal(t, time.Duration(first)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
				require.Equal(t, time.Duration(last-first)*time.Millisecond/time.Duration(s.events-1), r.TimeBetweenTokens, "%d bytes a read", n)
			}
		})
	}
}

// lineEnd is the length of an SSE stream up to the end of its last event's
// data line: without the blank line that ends the event.
func lineEnd(s string) int {
	return len(strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r"))
}

// callWhole is call for a stream longer than io.ReadAll's first buffer:
// it reads into a buffer as long as the stream, so every Read but the last
// gets n bytes.
func (g *sseRig) callWhole(t *testing.T, n int) httpbalancer.Result {
	t.Helper()
	resp := g.send(t, n)
	got := make([]byte, 0, len(g.body)+1)
	for {
		k, err := resp.Body.Read(got[len(got):cap(got)])
		got = got[:len(got)+k]
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.NoError(t, resp.Body.Close())
	require.Equal(t, g.body, string(got), "%d bytes a read", n)
	return <-g.res.c
}

// TestStreamUsageGivesOutputTokens: a stream the caller asked
// stream_options.include_usage for ends with a usage chunk (its choices
// []), whose usage.completion_tokens is the server's own count of the
// output tokens: reported as Outcome.OutputTokens in place of the count of
// token events, at every read boundary, which counts one event for a chunk
// of several tokens (SGLang's stream_interval, speculative decoding). The
// events still time the first token and the gaps. A count that is no
// plain integer, and the usage of a chunk with choices (vLLM's
// continuous_usage_stats), leave the events' estimate.
func TestStreamUsageGivesOutputTokens(t *testing.T) {
	chunk := func(choices, usage string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1765000000,"model":"m","choices":` + choices + usage + "}\n\n"
	}
	tok := func(s string) string {
		return chunk(`[{"index":0,"delta":{"content":"`+s+`"},"logprobs":null,"finish_reason":null}]`, "")
	}
	role := chunk(`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`, "")
	stream := role + tok("Hello there,") + tok(" how are") + tok(" you?") // three events
	const done = "data: [DONE]\n\n"
	for _, s := range []struct {
		name   string
		usage  string // the usage chunk's usage member
		tokens int
	}{
		{"vLLM", `,"usage":{"prompt_tokens":21,"total_tokens":30,"completion_tokens":9}`, 9},
		{"SGLang", `,"usage":{"prompt_tokens":21,"total_tokens":30,"completion_tokens":9,"prompt_tokens_details":null,"reasoning_tokens":0}`, 9},
		{"OpenAI", `,"usage":{"prompt_tokens":21,"completion_tokens":12,"total_tokens":33,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},` +
			`"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`, 12},
		{"details first", `,"usage":{"completion_tokens_details":{"reasoning_tokens":4},"completion_tokens":2147483647}`, 2147483647},
		{"spaced", `, "usage": {"prompt_tokens": 21, "completion_tokens": 9 }`, 9},
		{"null", `,"usage":{"prompt_tokens":21,"completion_tokens":null}`, 3},
		{"a fraction", `,"usage":{"completion_tokens":9.5}`, 3},
		{"too large", `,"usage":{"completion_tokens":2147483648}`, 3},
		{"wraps 2^32", `,"usage":{"completion_tokens":4294967300}`, 3},
		{"negative", `,"usage":{"completion_tokens":-9}`, 3},
		{"a string", `,"usage":{"completion_tokens":"9"}`, 3},
		{"zero", `,"usage":{"completion_tokens":0}`, 3},
		{"escaped in a string", `,"x":"\"completion_tokens\":9","usage":null`, 3},
	} {
		t.Run(s.name, func(t *testing.T) {
			body := stream + chunk("[]", s.usage) + done
			rig := newSSERig(t, body)
			for n := 1; n <= len(body); n++ {
				r := rig.callWhole(t, n)
				require.Equal(t, 3, r.Events, "%d bytes a read", n)
				require.Equal(t, s.tokens, r.Outcome.OutputTokens, "%d bytes a read", n)
				first, last := (lineEnd(role+tok("Hello there,"))+n-1)/n, (lineEnd(stream)+n-1)/n
				require.Equal(t, time.Duration(first)*time.Millisecond, r.Outcome.TTFT, "%d bytes a read", n)
				require.Equal(t, time.Duration(last-first)*time.Millisecond/2, r.TimeBetweenTokens, "%d bytes a read", n)
			}
		})
	}
	t.Run("continuous usage", func(t *testing.T) {
		// vLLM's stream_options.continuous_usage_stats: every chunk has
		// the usage so far; the last, with choices [], the whole.
		tok := func(s string, n int) string {
			return chunk(`[{"index":0,"delta":{"content":"`+s+`"},"logprobs":null,"finish_reason":null}]`,
				`,"usage":{"prompt_tokens":21,"total_tokens":`+strconv.Itoa(21+n)+`,"completion_tokens":`+strconv.Itoa(n)+`}`)
		}
		body := role + tok("Hello there,", 3) + tok(" how", 4) + chunk("[]", `,"usage":{"prompt_tokens":21,"total_tokens":27,"completion_tokens":6}`) + done
		r := newSSERig(t, body).callWhole(t, 7)
		require.Equal(t, 2, r.Events)
		require.Equal(t, 6, r.Outcome.OutputTokens)
		body = role + tok("Hello there,", 3) + tok(" how", 4) + done // no usage chunk
		r = newSSERig(t, body).callWhole(t, 7)
		require.Equal(t, 2, r.Outcome.OutputTokens)
	})
	// A stream cut inside the usage chunk's data line (the connection
	// ended, or the caller closed the body) has no usage chunk, at every
	// read size: its count is read when its line ends, as a token event
	// counts then and as an Ollama stream's last line is read. Before, the
	// count was read from the cut line.
	for _, cut := range []struct{ name, body string }{
		{"cut in the usage chunk's line", strings.TrimSuffix(chunk("[]", `,"usage":{"prompt_tokens":21,"total_tokens":30,"completion_tokens":9}`), "\n\n")},
		{"cut after the count", `data: {"id":"chatcmpl-1","choices":[],"usage":{"completion_tokens":9,`},
	} {
		t.Run(cut.name, func(t *testing.T) {
			body := stream + cut.body
			rig := newSSERig(t, body)
			for n := 1; n <= len(body); n++ {
				r := rig.callWhole(t, n)
				require.Equal(t, 3, r.Events, "%d bytes a read", n)
				require.Equal(t, 3, r.Outcome.OutputTokens, "%d bytes a read", n)
			}
		})
	}
}
