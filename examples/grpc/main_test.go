package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGRPCExample runs the example end to end at a small scale, so a change
// that breaks it fails CI: every call and stream through every policy
// succeeds (run fails at the first that does not), each policy has its row
// in both tables, and each row's counts add up to the calls, or the
// streams, sent through it. Which server gets how many depends on timing,
// so only pick_first's row, all on one server, is checked.
func TestGRPCExample(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a second or two of real time")
	}
	var out strings.Builder
	cfg := config{calls: 40, workers: 4, fast: time.Millisecond, slow: 5 * time.Millisecond,
		streams: 8, tokenFast: 500 * time.Microsecond, tokenSlow: 2 * time.Millisecond}
	unary, streamed, err := run(&out, cfg)
	t.Log("\n" + out.String())
	require.NoError(t, err)

	check := func(table string, rows []row, policies []string, want int64) {
		t.Helper()
		var names []string
		for _, r := range rows {
			names = append(names, r.policy)
			var sum int64
			for _, n := range r.calls {
				assert.GreaterOrEqual(t, n, int64(0), "%s table, %s", table, r.policy)
				sum += n
			}
			assert.Equal(t, want, sum, "%s table, %s: %v", table, r.policy, r.calls)
		}
		assert.Equal(t, policies, names, "%s table", table)
	}
	check("unary", unary, []string{"inferlb/llm", "inferlb/emb", "round_robin", "least_request", "ring_hash", "pick_first"}, int64(cfg.calls))
	check("stream", streamed, []string{"inferlb + StreamTiming", "inferlb", "round_robin", "least_request"}, int64(cfg.streams))
	// pick_first sends every call to the one server it connected to (the
	// first, unless connecting to it took over 250 ms: happy eyeballs).
	if len(unary) == 6 {
		c := unary[5].calls
		assert.Contains(t, c, int64(cfg.calls), "pick_first: %v", c)
	}

	// The tables show the same rows.
	lines := map[string]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
		lines[strings.Join(strings.Fields(line), " ")] = true
	}
	for _, r := range append(unary, streamed...) {
		prefix := r.policy
		for _, n := range r.calls {
			prefix += " " + strconv.FormatInt(n, 10)
		}
		found := false
		for l := range lines {
			found = found || strings.HasPrefix(l, prefix+" ")
		}
		assert.True(t, found, "no line %q... in the output", prefix)
	}
}
