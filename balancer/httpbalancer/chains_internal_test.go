package httpbalancer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIDCaptureFindsTheFirstResponseID(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // "" for none
	}{
		{"json", `{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}`, "resp_abc"},
		{"json with spaces", "{\n  \"id\" :  \"resp_abc\",\n  \"object\": \"response\"}", "resp_abc"},
		{"stream", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s\",\"status\":\"in_progress\"}}\n\n", "resp_s"},
		{"not a string first", `{"id":17,"response":{"id":"resp_2"}}`, "resp_2"},
		{"a longer key is not id", `{"item_id":"msg_1","id":"resp_3"}`, "resp_3"},
		{"escaped", `{"id":"resp_\"x"}`, ""},
		{"empty", `{"id":""}`, ""},
		{"none", `{"object":"response"}`, ""},
		{"too late", `{"output":"` + strings.Repeat("x", 600) + `","id":"resp_late"}`, ""},
		{"too long", `{"id":"` + strings.Repeat("r", maxResponseID+1) + `"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, and fed a byte at a time (a body read in tiny pieces).
			for _, step := range []int{len(tc.body), 1, 7} {
				var c idCapture
				for b := []byte(tc.body); len(b) > 0 && !c.done; {
					n := min(step, len(b))
					c.feed(b[:n])
					b = b[n:]
				}
				assert.Equal(t, tc.want, c.id(), "fed %d bytes at a time", step)
			}
		})
	}
}
