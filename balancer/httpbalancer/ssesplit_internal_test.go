package httpbalancer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/internal/testutil"
)

// scanRecord is what the stream scanner has recorded: what finish reports.
type scanRecord struct {
	events    int64
	errCode   int32
	outTokens int32
}

func recordOf(s *sseState) scanRecord {
	return scanRecord{s.events.Load(), s.errCode.Load(), s.outTokens.Load()}
}

// scanWhole is the record of body read in one Read, not yet at its end.
func scanWhole(body []byte, ndjson bool) scanRecord {
	s := &sseState{counting: true, ndjson: ndjson}
	s.scan(body, testutil.NewClock())
	return recordOf(s)
}

// requireSplitsAgree reads body in the reads that cuts (increasing
// offsets) make and checks that after each read the record is the one of
// the bytes so far read in one Read: what is recorded, and so in which
// read an event counts (its time), depends on the bytes, not on how they
// came.
func requireSplitsAgree(t *testing.T, body []byte, ndjson bool, cuts []int) {
	t.Helper()
	s := &sseState{counting: true, ndjson: ndjson}
	clock := testutil.NewClock()
	from := 0
	for _, to := range append(cuts, len(body)) {
		if to <= from {
			continue
		}
		s.scan(body[from:to], clock)
		from = to
		if got, want := recordOf(s), scanWhole(body[:to], ndjson); got != want {
			t.Fatalf("%q read in cuts %v: after %d bytes %+v, in one read %+v", body, cuts, to, got, want)
		}
	}
	if s.crEnd { // at EOF, as Read ends it
		s.endCR(clock)
		if got, want := recordOf(s), scanEnded(body); got != want {
			t.Fatalf("%q read in cuts %v: at EOF %+v, in one read %+v", body, cuts, got, want)
		}
	}
}

// lineStart is where the line that holds body[k-1] starts (k when
// body[:k] ends a line): the bytes a scanner has seen whole lines of,
// once it has seen body[:k]. A line ends at a LF, and (not in NDJSON) at
// a CR that a byte other than a LF follows: then cr, and the scanner
// knows it ended only at that byte.
func lineStart(body []byte, k int, ndjson bool) (at int, cr bool) {
	for j := k - 1; j >= 0; j-- {
		if body[j] == '\n' {
			return j + 1, false
		}
		if !ndjson && body[j] == '\r' && j+1 < k && body[j+1] != '\n' {
			return j + 1, true
		}
	}
	return 0, false
}

// scanEnded is scanWhole of a body whose last byte is a CR that ends its
// line (another byte follows, no LF).
func scanEnded(body []byte) scanRecord {
	s := &sseState{counting: true}
	clock := testutil.NewClock()
	s.scan(body, clock)
	if s.crEnd {
		s.endCR(clock)
	}
	return recordOf(s)
}

// sseSplitCorpus are streams, and pieces to make more of, that exercise
// what the scanner reads: one-line and multi-line events, the chunks that
// carry no token, the servers' counts, error events, line endings, and
// streams cut anywhere.
var sseSplitCorpus = []string{
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
	"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":7,\"total_tokens\":10}}\n\n",
	"data: [DONE]\n\n",
	"data: {\n  \"choices\": [],\n  \"usage\": {\n    \"completion_tokens\": 7\n  }\n}\n\n",
	"data: {\ndata:   \"choices\": [\ndata:     {\ndata:       \"delta\": {\ndata:         \"role\": \"assistant\",\ndata:         \"content\": \"\"\ndata:       }\ndata:     }\ndata:   ]\ndata: }\n\n",
	"data: {\ndata:   \"choices\": [],\ndata:   \"usage\": {\ndata:     \"completion_tokens\": 7\ndata:   }\ndata: }\n\n",
	"data: {\"choices\":[],\"usage\":{\"completion_tokens\":\ndata: 7}}\n\n",
	"data: {\"choices\":[{\"delta\":\ndata: {\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
	"data: {\"choices\":\ndata: []}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
	"event: message_delta\ndata: {\"usage\":\ndata:{\"output_tokens\":5}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\n\n",
	"event: response.completed\r\ndata: {\"response\":{\"usage\":{\"output_tokens\": 12 }}}\r\n\r\n",
	"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
	"data: {\"error\": {\"code\": 503}}\n\n",
	"data: {\r\"error\": {\"code\": 500}}\r\r",
	"event: response.failed\ndata: {\"response\":{\"error\":{\"code\":\"server_error\"}}}\n\n",
	": keep-alive\r\n\r\n",
	"data: a\ndata: b\n\n",
	"event: response.output_text.delta\rdata: {\"delta\":\"x\"}\r\r",
	"event: response.failed\r\ndata: {\r\ndata: \"response\": {\"error\": {\"code\": \"rate_limit_exceeded\"}}}\r\n\r\n",
	"event: ping\ndata: {\"type\": \"ping\"}\n\n",
	"data:{\"error\":\"Model is overloaded\",\"error_type\":\"overloaded\"}\n\n",
	"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"a long token text that fills the buffer\"}}]}\n\n",
	"data:{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
	"id: 7\nretry: 10\ndata:[DONE]\n\n",
	"data: {\"choices\": [{\"delta\":\t\t{}}], \"usage\": {\"completion_tokens\":\t 4}}\n\n",
	"\r",
}

var ndjsonSplitCorpus = []string{
	"{\"message\":{\"content\":\"a\"},\"done\":false}\n",
	"{\"message\":{\"content\":\"\\\"done\\\":true\"},\"done\":false,\"eval_count\":4}\n",
	"{\"done\":true,\"eval_count\":12}\n",
	"{\"eval_count\":12,\"done\":true}\n",
	"{\"error\":\"x\"}\n",
	"\r\n",
	"{\"done\": true, \"eval_count\" : 12 }\r\n",
	"{\"model\":\"m\",\"message\":{\"tool_calls\":[{\"function\":{\"arguments\":{\"done\":true,\"eval_count\":99}}}]},\"done\":false}\n",
}

// TestSSEScanAtEveryCut: each stream of the corpus, whole and cut short
// at every byte, and streams made of its pieces at random, read in two
// reads cut at every byte and in random reads, record what the same bytes
// read at once record, after every read; and a stream cut inside a line
// records what it records cut at that line's start.
func TestSSEScanAtEveryCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for _, c := range []struct {
		ndjson bool
		corpus []string
	}{{false, sseSplitCorpus}, {true, ndjsonSplitCorpus}} {
		var bodies [][]byte
		for _, s := range c.corpus {
			bodies = append(bodies, []byte(s))
		}
		for range rounds {
			var b strings.Builder
			for range 1 + rng.IntN(5) {
				b.WriteString(c.corpus[rng.IntN(len(c.corpus))])
			}
			s := b.String()
			switch rng.IntN(4) {
			case 0:
				s = s[:rng.IntN(len(s)+1)] // cut anywhere
			case 1:
				s = strings.ReplaceAll(s, "\n", "\r\n")
			}
			bodies = append(bodies, []byte(s))
		}
		for _, body := range bodies {
			for k := 1; k < len(body); k++ {
				requireSplitsAgree(t, body, c.ndjson, []int{k})
			}
			// Nothing is read from a line that has not ended: what a
			// stream cut inside a line records is what it records cut
			// at the line's start (the server's counts too: an event
			// cut short is not one).
			for k := 1; k <= len(body); k++ {
				at, cr := lineStart(body, k, c.ndjson)
				want := scanWhole(body[:at], c.ndjson)
				if cr {
					want = scanEnded(body[:at])
				}
				if got := scanWhole(body[:k], c.ndjson); got != want {
					t.Fatalf("%q cut at %d: %+v; cut at its line's start, %d: %+v", body, k, got, at, want)
				}
			}
			for range 20 {
				var cuts []int
				for at := 0; at < len(body); {
					at = min(at+1+rng.IntN(8), len(body))
					cuts = append(cuts, at)
				}
				requireSplitsAgree(t, body, c.ndjson, cuts)
			}
		}
	}
}
