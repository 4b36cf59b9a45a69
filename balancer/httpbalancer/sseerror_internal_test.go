package httpbalancer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
)

// errorLines are error events and the code errScan reads from each.
var errorLines = []struct {
	line string
	code int
}{
	{`data: {"error": {"object": "error", "message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`, 500},
	{`data:{"error":{"message":"engine dead","code":503}}` + "\r", 503},
	{`data: {"error": {"message": "` + strings.Repeat(`x\"y\\`, 1000) + `", "code": 502}}`, 502},
	{`data: {"error": {"message": "` + strings.Repeat(`x`, 5000) + `", "code": 400}}`, 400},
	{`data: {"error": {"message": "{\"code\": 500}", "code": 400}}`, 400},
	{`data: {"error": {"message": "\\\"code\\\": 500 \\", "x": "\\"}}`, 0},
	{`data: {"error": {"param": {"code": 500}, "details": [{"code": 501}]}}`, 0},
	{`data: {"error": "` + strings.Repeat(`x`, 5000) + `", "code": 504}`, 504},
	{`data: {"error": {"code": 400}, "code": 500}`, 400},
	{`data: {"error": {"code": null}, "code": 500}`, 500},
	{`data: {"error": {"code": 500}, "error": "replaced"}`, 0},
	{`data: {"error": {"code": 500, "code": "replaced"}}`, 0},
	{`data: {"error": {"\u0063ode": 501}}`, 501},
	{`data: {"error": {"co": 500, "codes": 501, "Code": 502}}`, 0},
	{`data: {"error": {"code": "500"}}`, 0},
	{`data: {"error": {"code": 500.5}}`, 0},
	{`data: {"error": {"code": 5e2}}`, 0},
	{`data: {"error": {"code": -500}}`, 0},
	{`data: {"error": {"code": 5000}}`, 0},
	{`data: {"error": {"code": 99}}`, 0},
	{`data: {"error": { "code" : 599 } }`, 599},
	{`data: {"error": {"message": "cut off", "code": 500`, 500}, // the line ended: so did the number
	{`data: {"error": {"message": "cut off`, 0},
	{`data: {"error": {"message" "no colon", "code": 500}}`, 0}, // broken before the code
	// TGI's native streams: no code, an error_type.
	{`data:{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}`, 500},
	{`data:{"error":"Model is overloaded","error_type":"overloaded"}`, 429},
	{`data:{"error":"Incomplete generation stream","error_type":"incomplete_generation_stream"}`, 500},
	{`data:{"error":"Incomplete generation","error_type":"incomplete_generation"}`, 500},
	{`data:{"error":"Stream event serialization error","error_type":"stream_serialization_error"}`, 500},
	{`data:{"error":"Input validation error: inputs must have less than 4096 tokens","error_type":"validation"}`, 0},
	{`data:{"error":"Template error: x","error_type":"template_error"}`, 0},
	{`data: {"error": "x", "\u0065rror_type": "\u006fverloaded"}`, 429},
	{`data: {"error": "x", "error_type": "overloaded` + strings.Repeat(`x`, 300) + `"}`, 0},
	{`data: {"error": "x", "error_type": "` + strings.Repeat(`\u0078`, 100) + `"}`, 0},
	{`data: {"error": "x", "error_type": "generation", "error_type": "validation"}`, 0},
	{`data: {"error": "x", "error_type": "generation", "error_type": null}`, 0},
	{`data: {"error": {"code": 400}, "error_type": "generation"}`, 400},
	{`data: {"error": {"error_type": "generation"}}`, 0},
	// TGI's OpenAI-compatible streams: the error's message says what
	// happened; its http_status_code is 422 whatever did.
	{`data:{"error":{"message":"Request failed during generation: Server error: CUDA out of memory. Tried to allocate 2.00 GiB","http_status_code":422}}`, 500},
	{`data:{"error":{"message":"Model is overloaded","http_status_code":422}}`, 429},
	{`data:{"error":{"message":"Incomplete generation stream","http_status_code":422}}`, 500},
	{`data:{"error":{"message":"Input validation error: ` + "`inputs`" + ` must not be empty","http_status_code":422}}`, 0},
	{`data: {"error": {"message": "\u004dodel is overloaded"}}`, 429},
	{`data: {"error": {"message": "` + strings.Repeat(`\u0052`, 1) + `equest failed during generation` + strings.Repeat(`\n`, 3000) + `"}}`, 500},
	{`data: {"error": {"message": "Request failed during generatio"}}`, 0},
	{`data: {"error": {"message": " Model is overloaded"}}`, 0},
	{`data: {"error": {"message": "Model is overloaded"}, "error": "boom"}`, 0},
	{`data: {"error": {"message": "Model is overloaded", "message": 5}}`, 0},
	{`data: {"error": {"message": "Model is overloaded", "code": 500}}`, 429}, // the text says overload: a 5xx code does not make it a failure
	{`data: {"error": {"message": "Model is overloaded", "code": 400}}`, 400},
	// SGLang's load shedding (--max-queued-requests): a 503 error event
	// that is an overload answer, not a failure.
	{`data: {"error": {"object": "error", "message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}`, 429},
	{`data: {"error": {"object": "error", "message": "The request is aborted by a higher priority request.", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}`, 429},
	{`data: {"error": {"message": "The request queue is full.", "code": 400}}`, 400},
	{`data: {"error": {"message": "The request queue", "code": 503}}`, 503},
	{`data: {"error": {"message": "The request is aborted by a higher", "code": 503}}`, 503},
	{`data: {"error": {"code": 503, "message": "The request queue is full."}}`, 429},
	{`data: {"error": {"message": "` + escapeAll("The request is aborted by a higher priority request.") + `", "code": 503}}`, 429},
	{`data: {"error": {"param": {"message": "Model is overloaded"}}}`, 0},
	{`data: {"error": "boom", "message": "Model is overloaded"}`, 0},
	{`data: {"error": "Model is overloaded"}`, 429},
	{`data: {"error": "Model is overloaded", "error_type": "generation"}`, 500},
	{`data: {"error": {"message": "Model is overl`, 0}, // cut off: no text
	// Every byte escaped: the longest spellings of what is read.
	{`data: {"error": {"message": "` + escapeAll("Request failed during generation: CUDA out of memory") + `"}}`, 500},
	{`data: {"error": "x", "error_type": "` + escapeAll("incomplete_generation_stream") + `"}`, 500},
	{`data: {"error": "x", "` + escapeAll("error_type") + `": "generation"}`, 500},
	{`data: {"error": {"` + escapeAll("message") + `": "Model is overloaded"}}`, 429},
}

// escapeAll writes s as JSON string contents with every character escaped.
func escapeAll(s string) string {
	var b strings.Builder
	for _, r := range s {
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

func TestErrorCode(t *testing.T) {
	for _, l := range errorLines {
		assert.Equal(t, l.code, errorCode([]byte(l.line), false), "%.80s", l.line)
	}
}

// TestErrorEventAtEveryCut: an error line reads the same however the reads
// cut it: one byte a read, and in two reads cut at every byte, so a key, an
// escape or the code itself is split at each of its bytes somewhere.
func TestErrorEventAtEveryCut(t *testing.T) {
	clock := testutil.NewClock()
	for _, l := range errorLines {
		body := []byte("data: {\"a\":1}\n\n" + l.line + "\n\n")
		s := &sseState{counting: true}
		for i := range body {
			s.scan(body[i:i+1], clock)
		}
		require.EqualValues(t, l.code, s.errCode.Load(), "a byte a read: %.80s", l.line)
		require.EqualValues(t, 1, s.events.Load())
		for k := range len(body) + 1 {
			s := &sseState{counting: true}
			s.scan(body[:k], clock)
			s.scan(body[k:], clock)
			require.EqualValues(t, l.code, s.errCode.Load(), "cut at %d: %.80s", k, l.line)
		}
	}
}

// TestErrorEventMemory: reading the code of an error line of any length
// takes one allocation of a fixed size, at the stream's first error line.
func TestErrorEventMemory(t *testing.T) {
	clock := testutil.NewClock()
	line := []byte(`data: {"error": {"message": "` + strings.Repeat(`Traceback\n  File \"x.py\"`, 1<<16) + `", "code": 500}}` + "\n\n")
	s := new(sseState)
	allocs := testing.AllocsPerRun(10, func() {
		*s = sseState{counting: true}
		for p := line; len(p) > 0; p = p[min(len(p), 4096):] {
			s.scan(p[:min(len(p), 4096)], clock)
		}
		for range 3 { // later error lines reuse it
			s.scan(line, clock)
		}
	})
	assert.Equal(t, 1.0, allocs)
	assert.EqualValues(t, 500, s.errCode.Load())
}

// typedErrorEvents are streams whose failure is an event of type "error"
// (the Messages API's, which vLLM and SGLang serve at /v1/messages): its
// data is {"type": "error", "error": {"type": kind, "message": ...}}, and
// the kind says what happened. Each ends with the code errScan reads.
var typedErrorEvents = []struct {
	body string
	code int
}{
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"CUDA error: an illegal memory access was encountered\"}}\n\ndata: [DONE]\n\n", 500},
	{"event: error\r\ndata: {\"type\": \"error\", \"error\": {\"details\": null, \"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\r\n\r\n", 429},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"x\"}}\n\n", 500},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"x\"}}\n\n", 429},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long\"}}\n\n", 0},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"" + strings.Repeat(`Traceback \"x\"\n`, 500) + "\"}}\n\n", 500},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"message\":\"" + strings.Repeat("x", 300) + "\",\"type\":\"overloaded_error\"}}\n\n", 429},
	{"event: error\ndata: {\"error\":{\"type\":\"internal_error\"},\"type\":\"error\"}\n\n", 500},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"code\":400}}\n\n", 400},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"\\u006fverloaded_error\"}}\n\n", 429},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":{\"x\":\"internal_error\"}}}\n\n", 0},
	{"event: error\ndata: {\"type\":\"internal_error\",\"error\":\"x\"}\n\n", 0},                            // the kind is the error object's
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"param\":{\"type\":\"internal_error\"}}}\n\n", 0}, // not a nested object's
	{"event: error\ndata: boom\n\n", 0},
	{"event: error\ndata:\n\n", 0},
	{"event: error\ndata: 5\n\n", 0},
	{"event: error\n\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\"}}\n\n", 0}, // the blank line ended the error event
	{"event: errors\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\"}}\n\n", 0},
	{"data: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\"}}\n\n", 0}, // untyped, and not an error object first
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\"}}\n\ndata: {\"a\":1}\n\n", 500},
	{"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\"}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", 429},
}

// TestTypedErrorEventAtEveryCut: a typed error event's kind is read however
// the reads cut the stream, in one read, a byte a read and two reads cut
// at every byte; the event is no token.
func TestTypedErrorEventAtEveryCut(t *testing.T) {
	clock := testutil.NewClock()
	for _, e := range typedErrorEvents {
		body := []byte(e.body)
		whole := &sseState{counting: true}
		whole.scan(body, clock)
		require.EqualValues(t, e.code, whole.errCode.Load(), "in one read: %.100q", e.body)
		s := &sseState{counting: true}
		for i := range body {
			s.scan(body[i:i+1], clock)
		}
		require.EqualValues(t, e.code, s.errCode.Load(), "a byte a read: %.100q", e.body)
		require.EqualValues(t, whole.events.Load(), s.events.Load())
		for k := range len(body) + 1 {
			s := &sseState{counting: true}
			s.scan(body[:k], clock)
			s.scan(body[k:], clock)
			require.EqualValues(t, e.code, s.errCode.Load(), "cut at %d: %.100q", k, e.body)
		}
	}
}
