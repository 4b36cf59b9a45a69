package httpbalancer

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
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

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// TestResponseChainsAreBounded: response IDs come from backends and
// previous_response_id from clients; however many distinct ones pass, the
// table holds ResponseEntries entries, and a lookup of an ID it never saw
// finds nothing.
func TestResponseChainsAreBounded(t *testing.T) {
	r := &responseChains{ttl: time.Hour, clock: fixedClock{time.Unix(1e9, 0)}}
	k := cache.NewKeyer(1)
	for i := range 4 * ResponseEntries {
		r.remember(k.Session(strconv.Itoa(i)), uint64(i)+1, uint64(i%8)+1)
	}
	assert.Equal(t, ResponseEntries, r.sessions().Cap())
	assert.LessOrEqual(t, r.sessions().Len(), ResponseEntries)
	_, _, ok := r.lookup(k.Session("never-seen"))
	assert.False(t, ok)
}

// TestMaxResponsesSizesTheTable: Options.MaxResponses sets how many
// responses are remembered (two entries each), a fleet passing more than the
// default's 8,192 per ResponseMemory keeps them all, and the option is
// bounded at parse time, naming the field.
func TestMaxResponsesSizesTheTable(t *testing.T) {
	for _, tc := range []struct{ max, entries int }{{0, ResponseEntries}, {100_000, 1 << 18}, {1 << 20, 1 << 21}} {
		c, err := (&Options{MaxResponses: tc.max}).resolve()
		require.NoError(t, err)
		assert.Equal(t, tc.entries, c.chains.sessions().Cap(), "MaxResponses %d", tc.max)
	}
	c, err := (&Options{MaxResponses: 20_000}).resolve()
	require.NoError(t, err)
	c.chains.clock = fixedClock{time.Unix(1e9, 0)}
	k := cache.NewKeyer(1)
	for i := range 12_000 { // more than the default's 8,192
		c.chains.remember(k.Session(strconv.Itoa(i)), uint64(i)+1, uint64(i%8)+1)
	}
	_, _, ok := c.chains.lookup(k.Session("0"))
	assert.True(t, ok, "the oldest of 12,000 responses is still remembered")
	for _, bad := range []int{-1, MaxMaxResponses + 1} {
		_, err := (&Options{MaxResponses: bad}).resolve()
		require.ErrorContains(t, err, "MaxResponses")
	}
}

// FuzzIDCapture: whatever a /v1/responses answer holds, and however it is
// read, the ID captured is the one captured of the answer read at once: a
// string value of an "id" key within the first 512 bytes, at most
// maxResponseID bytes, without escapes, that a JSON object holding it as
// its first key reads the same.
func FuzzIDCapture(f *testing.F) {
	f.Add([]byte(`{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}`), uint8(1))
	f.Add([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\" :\t\"resp_s\"}}\n\n"), uint8(5))
	f.Add([]byte(`{"id":17,"item_id":"x","id":"resp_\"x","id":""}`), uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		var whole idCapture
		whole.feed(b)
		var c idCapture
		for p := b; len(p) > 0 && !c.done; {
			n := min(int(step%32)+1, len(p))
			c.feed(p[:n])
			p = p[n:]
		}
		id := whole.id()
		if c.id() != id {
			t.Fatalf("%q read %d bytes at a time: ID %q, read at once %q", b, step%32+1, c.id(), id)
		}
		if id == "" {
			return
		}
		if len(id) > maxResponseID || strings.ContainsAny(id, `\"`) || !strings.Contains(string(b[:min(len(b), len(whole.buf))]), `"`+id+`"`) {
			t.Fatalf("%q: ID %q", b, id)
		}
		var v struct {
			ID string `json:"id"`
		}
		if js := `{"id":"` + id + `"}`; utf8.ValidString(id) && !strings.ContainsFunc(id, func(r rune) bool { return r < ' ' }) {
			if err := json.Unmarshal([]byte(js), &v); err != nil || v.ID != id {
				t.Fatalf("%q: ID %q, which JSON reads as %q (%v)", b, id, v.ID, err)
			}
		}
	})
}
