package httpbalancer

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestCallStateKeepsItsSizeClass guards the one allocation per call (see
// call): 640 bytes is a size class of Go's allocator, and the next is 704.
// A field added to call, or to balancer.Pick inside it, that crosses it
// costs every call 64 bytes more (BenchmarkTransportOverhead's B/op).
func TestCallStateKeepsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, int(callHeader), 640, "call with its allocation header")
}

// A call picked just before an Update that drops its endpoint from this
// Transport reaches outgoing after it; on a shared Balancer it must still
// go to this Transport's address for the ID, not to the one another
// adapter gave the Balancer (a gRPC port).
func TestCallPickedBeforeAnUpdateKeepsItsAddress(t *testing.T) {
	b := balancer.New(balancer.Options{})
	tr, err := NewTransport(Options{Balancer: b, Endpoints: []inferlb.Endpoint{
		{ID: "r0", Addr: "10.0.0.1:8000"}, {ID: "r1", Addr: "10.0.0.2:8000"}}})
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "r1", Addr: "10.0.0.2:8001"}})) // the other adapter's port

	c := &call{t: tr}
	for range 1000 {
		if c.pick, err = tr.mem.Pick(&inferlb.Request{}); err == nil && c.pick.ID() == "r1" {
			break
		}
		c.pick.Done(inferlb.Outcome{})
	}
	require.Equal(t, "r1", c.pick.ID())
	require.NoError(t, tr.Update([]inferlb.Endpoint{{ID: "r0", Addr: "10.0.0.1:8000"}})) // r1 leaves this Transport

	r := httptest.NewRequest(http.MethodPost, "http://llm.internal/v1/chat/completions", nil)
	c.out = *r
	out, err := c.outgoing(r, bodyReader{}, nil, true)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8000", out.URL.Host)
	c.pick.Done(inferlb.Outcome{})
}

// FuzzSSEScan: no stream, cut into reads of any size, makes the SSE scanner
// panic; it never counts more events than the stream has lines; the reads'
// sizes, equal or mixed, change nothing it finds, nor do the bytes of a last line that has
// not ended; and when the stream's error lines are
// well-formed JSON, the code it reads from them is the one encoding/json
// reads (see errScan and jsonErrorCode).
func FuzzSSEScan(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: {\"error\": {\"code\": 500}}\n\ndata: [DONE]\n\n"), uint8(3))
	f.Add([]byte(`{"message":{"tool_calls":[{"function":{"arguments":{"done":true}}}]},"done":false}`+"\n"+`{"message":{"content":"\"done\":true"},"done":false}`+"\n"+`{"done_reason":"stop","done":true}`+"\n"), uint8(64+5))
	f.Add([]byte("data:{\"error\"\r\n\r\nevent: error\ndata: x\n\n"), uint8(1))
	f.Add([]byte("data: {\"error\":"+strings.Repeat("x", 3000)+"\"code\": 503}\n\n"), uint8(17))
	f.Add([]byte("data: {\"error\": {\"message\": \""+strings.Repeat(`a\"code\": 500\\`, 200)+"\", \"param\": {\"code\": 501}, \"code\": 400}}\n\n"), uint8(5))
	f.Add([]byte("data: {\"error\": [{\"code\": 500}], \"c\\u006fde\": 503}\r\n\r\ndata: {\"error\": {\"code\": 5.0e2, \"\\u0063\\u006f\\u0064\\u0065\": 504}}\n\n"), uint8(2))
	f.Add([]byte("data: {\"error\": {\"code\": 500}, \"error\": \"x\", \"code\": null}\n\ndata:{\"error\":{},\"code\":599 }\n"), uint8(9))
	f.Add([]byte("data:{\"error\":\"Model is overloaded\",\"error_type\":\"overloaded\"}\n\ndata: {\"error\":{\"message\":\"Request failed during generation: x\",\"http_status_code\":422}}\n\n"), uint8(4))
	f.Add([]byte("data: {\"error\": {\"message\": \"\\u004dodel is overloaded\"}, \"\\u0065rror_type\": \"validation\"}\n\n"), uint8(7))
	f.Add([]byte("data: {\"error\": {\"object\": \"error\", \"message\": \"The request queue is full.\", \"code\": 503}}\n\n"), uint8(11))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\nevent: error\r\ndata: 5\r\n\r\n"), uint8(6))
	f.Add([]byte("{\"message\":{\"content\":\"a\"},\"done\":false}\n\r\n{\"error\":\"x\"}\n{\"done\" : true}\n{\"done\": true}\n"), uint8(64+3))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\",\"param\":null,\"sequence_number\":3}\n\n"), uint8(8))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"code\":\"rate_l\\u0069mit_exceeded\",\"code\":\"invalid_prompt\"}\n\ndata: {\"error\": {\"code\": \"server_error\"}, \"code\": \"rate_limit_exceeded\"}\n\n"), uint8(5))
	f.Add([]byte("event: response.failed\r\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\"}}}\r\n\r\n"), uint8(13))
	f.Add([]byte("event: response.failed\ndata: {\"response\":{\"error\":{\"code\":\"invalid_prompt\",\"code\":\"\"},\"error\":\"Model is overloaded\"},\"code\":\"server_error\"}\n\nevent: response.failed\ndata: {\"error\":{\"code\":500},\"response\":{\"error\":{\"code\":\"rate_limit_exceeded\"}}}\n\n"), uint8(7))
	f.Add([]byte("event: response.failed\ndata: {\"response\":null}\n\nevent: response.failed\ndata: {\"response\":{\"error\":{\"code\":\"x\"},\"code\":503}}\n\n"), uint8(3))
	f.Add([]byte("data: {\"a\":1}\r\revent: error\rdata: {\"error\": {\"code\": 500}}\r\r\ndata: x\r\n\r"), uint8(14))
	f.Add([]byte("event: ping\r\ndata: x\r\rdata: {\"error\": \"Model is overloaded\"}\r\n\revent: response.failed\rdata: {\"response\":{}}\r\r"), uint8(12))
	f.Add([]byte("data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"+
		"data: {\"choices\": [{\"index\":0,\"delta\": { \"role\" : \"assistant\", \"content\": null, \"refusal\":null }}]}\r\n\r\n"+
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"), uint8(5))
	f.Add([]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"usage\":{\"output_tokens\":7}},\"usage\":{\"iterations\":[{\"output_tokens\":4}],\"output_tokens\":9}}\n\n"), uint8(3))
	f.Add([]byte("event: response.completed\r\ndata: {\"response\":{\"output\":[{\"text\":\"\\\"usage\\\":{\\\"output_tokens\\\":1}\"}],\"usage\":{\"output_tokens\": 12 }},\"type\":\"response.completed\"}\r\n\r\n"), uint8(10))
	f.Add([]byte("{\"message\":{\"content\":\"\\\"eval_count\\\":3\"},\"done\":false,\"eval_count\":4}\n{\"eval_count\":282,\"done\":true,\"x\":{\"eval_count\":1}}\n"), uint8(64+6))
	f.Add([]byte("data: {\ndata:   \"choices\": [],\r\n: x\ndata:\"usage\": {\"completion_tokens\": 7\ndata: }}\n\ndata: {\"choices\":[{\"delta\":\ndata: {\"content\":\"a\"}}]}\n\n"), uint8(4))
	f.Add([]byte("event: error\rdata: {\rdata: \"error\": {\"code\": 503,\rdata: \"message\": \"x\"}}\r\revent: message_delta\ndata: {\"usage\":\ndata:{\"output_tokens\":5}}\n\n"), uint8(3))
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		size := int(n%64) + 1
		ndjson := n&64 != 0 // an Ollama stream
		s := &sseState{counting: true, ndjson: ndjson}
		clock := testutil.NewClock()
		for p := body; len(p) > 0; {
			k := min(size, len(p))
			s.scan(p[:k], clock)
			p = p[k:]
		}
		lines := sseLines(body)
		if ndjson {
			lines = bytes.Split(body, []byte("\n"))
			lines = lines[:len(lines)-1]
		}
		if s.events.Load() > int64(len(lines)) {
			t.Fatalf("%d events in %d lines", s.events.Load(), len(lines))
		}
		code := s.errCode.Load()
		if code != 0 && (code < 100 || code > 599) {
			t.Fatalf("error code %d", code)
		}
		whole := &sseState{counting: true, ndjson: ndjson}
		whole.scan(body, clock)
		if whole.events.Load() != s.events.Load() || whole.errCode.Load() != code {
			t.Fatalf("%d bytes a read: %d events, code %d; in one read: %d events, code %d",
				size, s.events.Load(), code, whole.events.Load(), whole.errCode.Load())
		}
		if n, w := s.outTokens.Load(), whole.outTokens.Load(); n != w || n < 0 {
			t.Fatalf("%d bytes a read: %d output tokens; in one read: %d", size, n, w)
		}
		// Reads of mixed sizes, as a network delivers a stream (1 to
		// 2*size bytes each, drawn from n and the length): after each
		// read the record is that of the bytes so far read at once (so
		// an event counts in the read that ends its line, and its time
		// is that read's); past 256 bytes, at the end only (each check
		// reads the stream again: the fuzzer's pace falls with the square
		// of the length).
		r := rand.New(rand.NewPCG(uint64(n), uint64(len(body))))
		var cuts []int
		for at := 0; at < len(body); {
			at = min(at+1+r.IntN(2*size), len(body))
			cuts = append(cuts, at)
		}
		if len(body) <= 256 {
			requireSplitsAgree(t, body, ndjson, cuts)
		} else {
			mixed := &sseState{counting: true, ndjson: ndjson}
			from := 0
			for _, to := range cuts {
				mixed.scan(body[from:to], clock)
				from = to
			}
			if got, want := recordOf(mixed), recordOf(whole); got != want {
				t.Fatalf("read in cuts %v: %+v; in one read: %+v", cuts, got, want)
			}
		}
		// Nothing is read from a line that has not ended.
		at, cr := lineStart(body, len(body), ndjson)
		cut := scanWhole(body[:at], ndjson)
		if cr {
			cut = scanEnded(body[:at])
		}
		if got := recordOf(whole); got != cut {
			t.Fatalf("the stream: %+v; cut at its last line's start, %d: %+v", got, at, cut)
		}
		if ndjson {
			// An error line carries no code: it is read as a 500, once
			// it has ended.
			want := int32(0)
			for _, line := range lines {
				if bytes.HasPrefix(line, []byte(`{"error"`)) {
					want = 500
				}
			}
			if code != want {
				t.Fatalf("an NDJSON stream gave error code %d, want %d", code, want)
			}
			// A line is an event unless blank, an error or the stream's
			// last object, whose own (top-level) "done" is true. That is
			// read exactly of lines in encoding/json's compact form; any
			// other line may go either way.
			lo, hi := 0, 0
			for _, line := range lines {
				line = bytes.TrimSuffix(line, []byte("\r"))
				if len(line) == 0 || bytes.HasPrefix(line, []byte(`{"error"`)) {
					continue
				}
				var compact bytes.Buffer
				if json.Compact(&compact, line) != nil || !bytes.Equal(compact.Bytes(), line) || bytes.Count(line, []byte("{"))+bytes.Count(line, []byte("[")) > 200 {
					hi++
					continue
				}
				if !topLevelDone(line) {
					lo++
					hi++
				}
			}
			if ev := int(s.events.Load()); ev < lo || ev > hi {
				t.Fatalf("%d events, want %d to %d", ev, lo, hi)
			}
			return
		}
		// The code of the last error line that has one, as encoding/json
		// reads it: a data line that starts an error object, or any data
		// line in an event of type "error". Of one-line events only: a data
		// line that leaves an object open goes on in the event's next data
		// lines (TestErrorJSONOverSeveralDataLines).
		for _, line := range lines {
			if off := dataValue(line); off >= 0 && len(line) > off && line[off] == '{' &&
				!bytes.HasSuffix(bytes.TrimRight(line[off:], " \t\r"), []byte("}")) {
				return
			}
		}
		want := int32(0)
		typed := false  // in an event of type "error"
		failed := false // in a response.failed event
		for _, line := range lines {
			if len(line) == 0 {
				typed, failed = false, false
				continue
			}
			if typ, ok := bytes.CutPrefix(line, []byte("event:")); ok {
				typ = bytes.TrimPrefix(typ, []byte(" "))
				typed = string(typ) == "error"
				if failed = string(typ) == "response.failed"; failed {
					want = 500 // the Responses API's failed response
				}
				continue
			}
			off := errorValue(line, typed || failed)
			if off < 0 {
				continue
			}
			if !json.Valid(line[off:]) {
				return // errScan reads what it can of a broken line
			}
			if failed {
				c, ok := jsonFailedCode(t, line[off:])
				if !ok {
					return
				}
				want = int32(c)
				continue
			}
			if c := jsonErrorCode(t, line[off:]); c > 0 {
				want = int32(c)
			}
		}
		if code != want {
			t.Fatalf("error code %d, encoding/json reads %d", code, want)
		}
	})
}

// sseLines splits an SSE stream into its lines as WHATWG's EventSource
// does, at a CRLF, a LF or a bare CR, without their ends; the bytes after
// the last line end are a line that has not ended, and so is a line whose
// CR ends the stream (a LF may follow).
func sseLines(body []byte) [][]byte {
	var lines [][]byte
	for start, i := 0, 0; i < len(body); i++ {
		switch {
		case body[i] == '\n':
			lines = append(lines, body[start:i])
			start = i + 1
		case body[i] == '\r' && i+1 < len(body):
			lines = append(lines, body[start:i])
			if body[i+1] == '\n' {
				i++
			}
			start = i + 1
		}
	}
	return lines
}

// jsonFailedCode is errScan's reading of a well-formed response.failed
// event's data (errScan.failedCode), done with encoding/json: the code
// jsonErrorCode reads from its "response" object, else 400 when that
// object's error has a string code that is not empty, else 500. Not ok
// for data with more than one top-level "response" (errScan reads the
// first, encoding/json the last).
func jsonFailedCode(t *testing.T, js []byte) (int, bool) {
	dec := json.NewDecoder(bytes.NewReader(js))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 500, true // not an object: no response in it
	}
	seen := 0
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", js, err)
		}
		if key == "response" {
			seen++
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatalf("%q: %v", js, err)
		}
	}
	if seen > 1 {
		return 0, false
	}
	var top map[string]json.RawMessage
	_ = json.Unmarshal(js, &top)
	var resp map[string]json.RawMessage
	if json.Unmarshal(top["response"], &resp) != nil || resp == nil {
		return 500, true
	}
	if c := jsonErrorCode(t, top["response"]); c != 0 {
		return c, true
	}
	var e map[string]json.RawMessage
	var code string
	if json.Unmarshal(resp["error"], &e) == nil && e != nil && json.Unmarshal(e["code"], &code) == nil && code != "" {
		return 400, true
	}
	return 500, true
}

// jsonErrorCode is errScan's reading of a well-formed error object, done
// with encoding/json: the error object's integer status code, else the
// top-level object's (a 5xx one a 429 when the error's text says the call
// was shed), else the status TGI's error_type names, else the one the
// error object's type names, else the one a string code of the error
// object, else of the top-level object, names, else the one the error's
// text (the error object's message, or the error as a string) starts
// with, else 0.
func jsonErrorCode(t *testing.T, js []byte) int {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		if js = bytes.TrimSpace(js); len(js) > 0 && js[0] == '{' {
			t.Fatalf("%q: %v", js, err)
		}
		return 0 // a typed error event's data that is not an object
	}
	status := func(raw json.RawMessage) int {
		n, err := strconv.Atoi(string(raw))
		if err != nil || n < 100 || n > 599 {
			return 0
		}
		return n
	}
	var e map[string]json.RawMessage
	_ = json.Unmarshal(top["error"], &e)
	var text string
	if e != nil {
		_ = json.Unmarshal(e["message"], &text)
	} else {
		_ = json.Unmarshal(top["error"], &text)
	}
	textSays := 0
	for prefix, n := range map[string]int{
		"Model is overloaded":                                 429,
		"The request queue is full":                           429,
		"The request is aborted by a higher priority request": 429,
		"Request failed during generation":                    500,
		"Incomplete generation":                               500,
		"Stream event serialization error":                    500,
	} {
		if strings.HasPrefix(text, prefix) {
			textSays = n
		}
	}
	code := status(e["code"])
	if code == 0 {
		code = status(top["code"])
	}
	switch {
	case code >= 500 && textSays == 429:
		return 429
	case code != 0:
		return code
	}
	kinds := map[string]int{
		"overloaded": 429, "overloaded_error": 429, "rate_limit_error": 429,
		"generation": 500, "incomplete_generation": 500, "incomplete_generation_stream": 500,
		"stream_serialization_error": 500, "api_error": 500, "internal_error": 500,
	}
	var kind string
	if json.Unmarshal(top["error_type"], &kind) == nil && kinds[kind] != 0 {
		return kinds[kind]
	}
	kind = ""
	if e != nil && json.Unmarshal(e["type"], &kind) == nil && kinds[kind] != 0 {
		return kinds[kind]
	}
	codes := map[string]int{"server_error": 500, "rate_limit_exceeded": 429}
	for _, raw := range []json.RawMessage{e["code"], top["code"]} {
		var c string
		if json.Unmarshal(raw, &c) == nil && codes[c] != 0 {
			return codes[c]
		}
	}
	return textSays
}

// A data line with nothing in it ("data:" or "data: ") carries no token:
// it is not the first token, and an event whose first data line is empty
// counts at its next data line, the one with the chunk.
func TestSSEEmptyDataIsNoToken(t *testing.T) {
	clock := testutil.NewClock()
	s := &sseState{counting: true}
	for _, read := range []string{"data:\n\n", "data: \r\n\r\n", "data:\ndata: {\"x\":1}\n\n", "data: {\"x\":2}\n\ndata: [DONE]\n\n"} {
		clock.Advance(time.Millisecond)
		s.readNs = 0 // a new Read
		s.scan([]byte(read), clock)
	}
	assert.EqualValues(t, 2, s.events.Load(), "two chunks")
	assert.Equal(t, testutil.Epoch.Add(3*time.Millisecond).UnixNano(), s.firstNs.Load(), "the first token came with the third read")
}

// topLevelDone reports whether line, a JSON value in compact form, is an
// object with a member "done" (the key as written) whose value is true.
func topLevelDone(line []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	for dec.More() {
		from := dec.InputOffset()
		if _, err := dec.Token(); err != nil {
			return false
		}
		key := bytes.TrimPrefix(line[from:dec.InputOffset()], []byte(","))
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return false
		}
		if string(key) == `"done"` && string(v) == "true" {
			return true
		}
	}
	return false
}
