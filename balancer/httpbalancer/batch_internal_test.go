package httpbalancer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// batchSeeds are bodies whose prompts come as batches, or as lists that are
// not batches, and SGLang's sampling_params as a list.
var batchSeeds = []string{
	`{"model":"m","prompt":["a","b","c"],"max_tokens":256}`,
	`{"model":"m","prompt":[[1,2],[3,4],[5]],"max_tokens":256,"n":2}`,
	`{"model":"m","prompt":[1,2,3],"max_tokens":256}`,
	`{"prompt":["a",[1,2],3,{"role":"user","content":"x"},null,"b"],"prompt":"x","text":[]}`,
	`{"model":"m","input":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"max_output_tokens":9}`,
	`{"model":"e5","input":["a","b","c"],"documents":["x","y"],"query":"q","texts":["t"]}`,
	`{"text":["a","b"],"sampling_params":[{"max_new_tokens":100},{"max_new_tokens":300,"n":2}]}`,
	`{"sampling_params":[{"max_new_tokens":5,"n":3},7,[{"n":9}],{"n":1,"max_new_tokens":7}],"n":4,"text":["a","b"]}`,
	`{"n":2,"sampling_params":[{"max_new_tokens":5},{"max_new_tokens":7,"n":1.5}],"input_ids":[[1],[2],[3]]}`,
	`{"n":2,"sampling_params":[],"parameters":[{"n":3}],"input_ids":[ [ 1 ] , [2] ,"x"]}`,
	`{"text":{"format":{"type":"text"}},"pr\u006fmpt":["a","b"],"input_ids":[[1,2]]}`,
	`{"sampling_params":[{"n":2,"max_new_tokens":4},{"max_new_tokens":`,
}

// scanBatchNew and scanBatchRef are what the two scanners count of a batch.
func scanBatchNew(b []byte, keyed bool) int {
	var o body
	parseBody(b, keyed, &o)
	return o.prompts
}

func scanBatchRef(b []byte, keyed bool) int {
	var o refBody
	refParseBody(b, keyed, &o)
	return o.prompts
}

func checkBatchScan(t *testing.T, b []byte, keyed bool) {
	t.Helper()
	if got, want := scanNew(b, keyed), scanRef(b, keyed); !equalScan(got, want) {
		t.Fatalf("body %q keyed %v:\n got %+v\nwant %+v", b, keyed, got, want)
	}
	if got, want := scanBatchNew(b, keyed), scanBatchRef(b, keyed); got != want {
		t.Fatalf("body %q keyed %v: %d prompts, the reference %d", b, keyed, got, want)
	}
}

// FuzzScannerCountsBatchesAsReference: the scanner reads what the
// reference reads (FuzzScannerMatchesReference's comparison) and counts
// the prompts of a batch as it does, on any input, whole or cut anywhere.
func FuzzScannerCountsBatchesAsReference(f *testing.F) {
	for _, s := range append(batchSeeds, scanSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, keyed := range []bool{false, true} {
			for _, cut := range []int{len(b), len(b) / 2, len(b) - 1} {
				if cut >= 0 {
					checkBatchScan(t, b[:cut], keyed)
				}
			}
		}
	})
}

// TestScannerCountsBatchesAsReference runs the batch seeds cut at every
// length.
func TestScannerCountsBatchesAsReference(t *testing.T) {
	for _, s := range batchSeeds {
		for cut := 0; cut <= len(s); cut++ {
			for _, keyed := range []bool{false, true} {
				checkBatchScan(t, []byte(s[:cut]), keyed)
			}
		}
	}
}

// batchBody builds a batch request whose prompts hold text made to trip a
// scan of the top level (tailText), in a random order of members.
func batchBody(r *rand.Rand) []byte {
	var elems []string
	for range r.IntN(40) {
		switch r.IntN(5) {
		case 0:
			elems = append(elems, fmt.Sprintf("[%d, %d]", r.IntN(1e5), r.IntN(1e5)))
		case 1:
			elems = append(elems, fmt.Sprint(r.IntN(1e5)))
		case 2:
			elems = append(elems, `{"role":"user","content":`+quote(tailText(r))+`}`)
		default:
			elems = append(elems, quote(tailText(r)))
		}
	}
	key := [...]string{"prompt", "text", "input_ids", "input", "documents", `pr\u006fmpt`}[r.IntN(6)]
	members := []string{`"` + key + `":[` + strings.Join(elems, ", ") + `]`, `"model":"m"`, `"max_tokens":9`}
	if r.IntN(3) == 0 {
		members = append(members, `"text":`+quote(tailText(r)))
	}
	if r.IntN(3) == 0 {
		members = append(members, `"sampling_params":[{"max_new_tokens":3,"stop":"]}"},{"n":2}]`)
	}
	r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	return []byte("{" + strings.Join(members, ",\n") + "}")
}

// TestReadTailCountsTheBatch: a batch cut anywhere by the peek, whose rest
// is in memory, counts the prompts parseBody counts in the whole body.
func TestReadTailCountsTheBatch(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 300 {
		b := batchBody(r)
		require.True(t, json.Valid(b), "%s", b)
		var want body
		parseBody(b, true, &want)
		for _, cut := range []int{1, len(b) / 2, len(b) - 1, 1 + r.IntN(len(b)-1)} {
			var got body
			parseBody(b[:cut], true, &got)
			m := inMemory(io.NopCloser(bytes.NewReader(b)))
			readTail(&m, b[:cut], true, &got)
			require.Equal(t, want.prompts, got.prompts, "body %d cut at %d: %s", i, cut, b)
			require.Equal(t, want.n, got.n, "body %d cut at %d: %s", i, cut, b)
			require.Equal(t, want.maxTokens, got.maxTokens, "body %d cut at %d: %s", i, cut, b)
		}
	}
}
