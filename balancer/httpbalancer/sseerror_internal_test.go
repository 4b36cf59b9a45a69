package httpbalancer

import (
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
}

func TestErrorCode(t *testing.T) {
	for _, l := range errorLines {
		assert.Equal(t, l.code, errorCode([]byte(l.line)), "%.80s", l.line)
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
