package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

func policyNames(c config) map[string][]string {
	out := map[string][]string{}
	for _, sc := range c.scenarios {
		for _, p := range sc.Policies {
			out[sc.Name] = append(out[sc.Name], p.Name)
		}
	}
	return out
}

// A policy name that matches nothing used to be dropped in silence: a typo
// in -policies printed tables without the policy, or no table at all, and
// a comparison could be published without the row it was run for.
func TestPoliciesNamingNoPolicyIsAnError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-scenario", "shared-prefix", "-policies", "round-robin,inferlb-affinity"}, `-policies: no policy "inferlb-affinity" in scenario shared-prefix`},
		{[]string{"-scenario", "tenants", "-policies", "oracle"}, `-policies: no policy "oracle" in scenario tenants`},
		{[]string{"-scenario", "all", "-policies", "inferlb,orcale"}, `-policies: no policy "orcale" in any scenario`},
		{[]string{"-policies", " , "}, `-policies " , " names no policy`},
	} {
		var stderr bytes.Buffer
		_, err := parse(tc.args, &stderr)
		require.Error(t, err, "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%q: printed", tc.args)
	}
}

func TestPoliciesKeepsTheNamedOnesWhereTheyRun(t *testing.T) {
	c, err := parse([]string{"-scenario", "shared-prefix", "-policies", " round-robin ,inferlb -affinity,"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"shared-prefix": {"round-robin", "inferlb -affinity"}}, policyNames(c))

	// With every scenario, a name needs to match in one of them; the
	// scenarios it matches nothing in are left out, not run empty.
	c, err = parse([]string{"-scenario", "all", "-policies", "inferlb shards=2"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"tenants": {"inferlb shards=2"}}, policyNames(c))
	require.Len(t, c.scenarios, 1)
}

// Values the command cannot honour used to be replaced in silence: -clients
// 0 ran (and labelled) one client, -parallel 0 one run at a time; words
// after the flags were ignored, so "fleetsim mix -quick" ran the default
// scenario in full; and -clients was dropped for a scenario that fixes its
// own client counts.
func TestFlagValuesTheCommandCannotHonourAreErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-clients", "0"}, "-clients 0: must be at least 1"},
		{[]string{"-clients", "-8"}, "-clients -8: must be at least 1"},
		{[]string{"-parallel", "0"}, "-parallel 0: must be at least 1"},
		{[]string{"mix", "-quick"}, `unexpected argument "mix"`},
		{[]string{"-scenario", "mix", "-quick", "extra"}, `unexpected argument "extra"`},
		{[]string{"-scenario", "multi-client", "-clients", "4"}, "-clients 4: scenario multi-client runs 1 and 8 clients"},
		{[]string{"-estimate-error", "1"}, "-estimate-error 1: must be at least 0 and below 1"},
		{[]string{"-estimate-error", "-0.1"}, "-estimate-error -0.1: must be at least 0"},
		{[]string{"-estimate-error", "NaN"}, "-estimate-error NaN"},
		{[]string{"-declared-output", "-2"}, "-declared-output -2: must be 0"},
		{[]string{"-chat-rerender", "1.5"}, "-chat-rerender 1.5: must be a share from 0 to 1"},
		{[]string{"-chat-rerender", "NaN"}, "-chat-rerender NaN"},
		// Every replica is scraped that often in virtual time: 1ns
		// scheduled a billion scrapes a simulated second and never ended.
		// Each client is a Balancer of its own: 10,000 took 1.3 GB for
		// one quick run, and 100,000 ran the machine out of memory.
		{[]string{"-clients", "1001"}, "-clients 1001: must be at most 1000"},
		{[]string{"-scrape", "1ns"}, "-scrape 1ns: must be at least 10ms"},
		{[]string{"-scrape", "9ms"}, "-scrape 9ms: must be at least 10ms"},
		{[]string{"-scrape", "-1s"}, "-scrape -1s: must be at least 10ms"},
		{[]string{"-seeds", "-1"}, "-seeds -1: must be from 1 to 50"},
		{[]string{"-seeds", "51"}, "-seeds 51: must be from 1 to 50"},
	} {
		var stderr bytes.Buffer
		_, err := parse(tc.args, &stderr)
		require.Error(t, err, "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%q: printed", tc.args)
	}
	c, err := parse([]string{"-scenario", "shared-prefix", "-clients", "8", "-parallel", "3"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 8, c.clients)
	assert.Equal(t, 3, c.par)
	_, err = parse([]string{"-scenario", "all", "-clients", "8"}, &bytes.Buffer{})
	assert.NoError(t, err, "with every scenario, multi-client keeps its own and the rest take -clients")
	c, err = parse([]string{"-scenario", "all", "-estimate-error", "0.3", "-declared-output", "4"}, &bytes.Buffer{})
	require.NoError(t, err)
	for _, sc := range c.scenarios {
		assert.Equal(t, fleetsim.Estimate{PromptError: 0.3, OutputFactor: 4}, sc.Estimate, sc.Name)
	}
	for _, share := range []string{"", "0", "1"} {
		args := []string{"-scenario", "lora"}
		want := fleetsim.ChatRerender
		if share != "" {
			args = append(args, "-chat-rerender", share)
			want = map[string]float64{"0": 0, "1": 1}[share]
		}
		c, err = parse(args, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, want, c.scenarios[0].Workload(10).(*fleetsim.Chat).Rerender, "%q", args)
	}
}

// idle sends nothing.
type idle struct{}

func (idle) Start(fleetsim.Sim)                         {}
func (idle) Done(fleetsim.Sim, *fleetsim.Request, bool) {}

// A scenario with Seeds runs that many seeds from -seed on; its table
// by model has a row per policy and seed, and the scenarios that make no
// model fail have none.
func TestSeedsAndTheTableByModel(t *testing.T) {
	sc := fleetsim.ModelFailureScenario()
	sc.Workload = func(float64) fleetsim.Workload { return idle{} }
	sc.Warmup, sc.Duration, sc.Drain = time.Second, 2*time.Second, time.Second
	res := runScenario(sc, 5, 1, 2)
	require.Len(t, res, 4*len(sc.Policies))
	var seeds []uint64
	for _, r := range res {
		if len(seeds) == 0 || seeds[len(seeds)-1] != r.Seed {
			seeds = append(seeds, r.Seed)
		}
	}
	assert.Equal(t, []uint64{5, 6, 7, 8}, seeds)
	rows := byModelRows(sc, res)
	require.Len(t, rows, 1+len(res))
	assert.Equal(t, []string{"policy", "seed", "healthy tok/s", "healthy failed", "healthy TTFT p99", "healthy on r0+r3",
		"lora-sql failed", "trips", "ejections", "capped", "model failures", "model-failing events"}, rows[0])
	assert.Equal(t, []string{"round-robin", "5", "0", "0", "0.000s", "0 (0.0%)", "0", "-", "-", "-", "-", "-"}, rows[1])
	assert.Equal(t, []string{"inferlb", "8", "0", "0", "0.000s", "0 (0.0%)", "0", "0", "0", "0", "0", "0"}, rows[len(rows)-5])
	var md bytes.Buffer
	printScenario(&md, sc, res)
	assert.Contains(t, md.String(), "seed 5\n", "the first seed's table")
	assert.NotContains(t, md.String(), "seed 6\n")
	assert.Contains(t, md.String(), "seeds 5-8")
	assert.Contains(t, md.String(), "across 4 seeds (5-8) at ", "the spread across the seeds")

	all := fleetsim.ModelFailureEverywhereScenario()
	assert.NotContains(t, byModelRows(all, res)[0], "healthy on r0+r3", "it fails on every replica")
	assert.Nil(t, byModelRows(fleetsim.LoRAScenario(), res))
}

// The lora-slots scenario runs seeds 1-4 and gets a table of adapter
// slots with a row per policy and seed, and one by class; the scenarios
// whose replicas do not limit adapters get neither.
func TestTheTableOfAdapterSlots(t *testing.T) {
	sc := fleetsim.LoRASlotsScenario()
	sc.Workload = func(float64) fleetsim.Workload { return idle{} }
	sc.Warmup, sc.Duration, sc.Drain = time.Second, 2*time.Second, time.Second
	sc.Rates = []float64{sc.Headline}
	res := runScenario(sc, 1, 1, 2)
	require.Len(t, res, 4*len(sc.Policies))
	rows := loraRows(sc, res)
	require.Len(t, rows, 1+len(res))
	assert.Equal(t, []string{"policy", "seed", "tok/s", "TTFT p50", "p99", "E2E p50", "p99", "slot-waited calls", "slot wait mean", "p99", "loads/replica", "max"}, rows[0])
	assert.Equal(t, []string{"round-robin", "1", "0", "0.000s", "0.000s", "0.000s", "0.000s", "0 (0.0%)", "0.000s", "0.000s", "0", "0"}, rows[1])
	assert.Equal(t, []string{"inferlb no-lora", "4"}, rows[len(rows)-1][:2])
	var out bytes.Buffer
	printScenario(&out, sc, res)
	assert.Contains(t, out.String(), "adapter slots at 30 req/s (seeds 1-4;")
	assert.Nil(t, loraRows(fleetsim.ModelFailureScenario(), nil))
	mf := fleetsim.ModelFailureScenario()
	mf.Workload = func(float64) fleetsim.Workload { return idle{} }
	mf.Warmup, mf.Duration, mf.Drain = time.Second, 2*time.Second, time.Second
	assert.Nil(t, loraRows(mf, runScenario(mf, 1, 1, 2)))
}

// The per-seed tables (by model, adapter slots, context windows) list a
// row per policy, client count and seed at the headline rate, with a
// clients column only when the run had more than one count.
func TestSeedRows(t *testing.T) {
	sc := &fleetsim.Scenario{Headline: 10, Policies: []fleetsim.Policy{{Name: "a"}, {Name: "b"}}}
	res := []fleetsim.Result{
		{Policy: "b", Clients: 1, Seed: 1, Rate: 10, Requests: 5},
		{Policy: "a", Clients: 1, Seed: 1, Rate: 10, Requests: 6},
		{Policy: "a", Clients: 1, Seed: 2, Rate: 5, Requests: 7}, // not the headline rate
		{Policy: "a", Clients: 8, Seed: 1, Rate: 10, Requests: 8},
		{Policy: "a", Clients: 8, Seed: 2, Rate: 10, Requests: 0}, // not kept
	}
	keep := func(r fleetsim.Result) bool { return r.Requests > 0 }
	cells := func(r fleetsim.Result) []string { return []string{fmt.Sprint(r.Requests)} }
	assert.Equal(t, [][]string{
		{"policy", "clients", "seed", "calls"},
		{"a", "1", "1", "6"},
		{"b", "1", "1", "5"},
		{"a", "8", "1", "8"},
	}, seedRows(sc, res, []string{"calls"}, keep, cells))
	assert.Equal(t, [][]string{
		{"policy", "seed", "calls"},
		{"a", "1", "6"},
		{"b", "1", "5"},
	}, seedRows(sc, res[:3], []string{"calls"}, keep, cells))
}

// -extra adds the stronger baselines to every scenario run, after its own
// policies, where -policies can then keep them; a name that is no extra
// baseline is an error.
func TestExtraAddsBaselines(t *testing.T) {
	c, err := parse([]string{"-scenario", "embedding", "-extra", "least-conn, consistent-hash-bounded", "-policies", "least-request,least-conn,consistent-hash-bounded,inferlb"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"embedding": {"least-request", "inferlb", "least-conn", "consistent-hash-bounded"}}, policyNames(c))

	c, err = parse([]string{"-scenario", "all", "-extra", "least-conn"}, &bytes.Buffer{})
	require.NoError(t, err)
	for _, sc := range c.scenarios {
		assert.Equal(t, "least-conn", sc.Policies[len(sc.Policies)-1].Name, sc.Name)
	}
	d, err := parse([]string{"-scenario", "all"}, &bytes.Buffer{})
	require.NoError(t, err)
	for _, sc := range d.scenarios {
		assert.NotContains(t, policyNames(d)[sc.Name], "least-conn", "not without -extra")
	}

	for _, tc := range []struct{ args, want string }{
		{"least-connections", `-extra: no extra baseline "least-connections"`},
		{" , ", `-extra " , " names no policy`},
	} {
		var stderr bytes.Buffer
		_, err := parse([]string{"-extra", tc.args}, &stderr)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, stderr.String(), tc.want)
	}
}

// A scenario with a replica whose telemetry reaches no client prints each
// replica's share of the calls, by policy and offered load in the
// scenario's order; the others print no such table.
func TestTheTableOfLoadShares(t *testing.T) {
	sc := &fleetsim.Scenario{Rates: []float64{10, 20}, Fleet: make([]fleetsim.ReplicaSpec, 2),
		Policies: []fleetsim.Policy{{Name: "a"}, {Name: "b"}}}
	res := []fleetsim.Result{
		{Policy: "b", Clients: 8, Seed: 1, Rate: 10, Share: []float64{0.5, 0.5}, MaxMean: 1, TTFTP50: 0.1, TTFTP90: 0.2, TTFTP99: 0.3, Throughput: 100},
		{Policy: "a", Clients: 8, Seed: 1, Rate: 20, Share: []float64{0.25, 0.75}, MaxMean: 1.5, TTFTP50: 0.1, TTFTP90: 0.2, TTFTP99: 3, Throughput: 200},
		{Policy: "a", Clients: 8, Seed: 1, Rate: 10, Share: []float64{0.4, 0.6}, MaxMean: 1.2, TTFTP50: 0.1, TTFTP90: 0.2, TTFTP99: 0.3, Throughput: 90},
	}
	assert.Nil(t, shareRows(sc, res), "every replica scraped")
	sc.Fleet[1].Unscraped = true
	assert.Equal(t, [][]string{
		{"policy", "clients", "rate", "r0", "r1", "max/mean", "TTFT p50", "p90", "p99", "tok/s"},
		{"a", "8", "10", "40.0%", "60.0%", "1.20", "0.100s", "0.200s", "0.300s", "90"},
		{"a", "8", "20", "25.0%", "75.0%", "1.50", "0.100s", "0.200s", "3.00s", "200"},
		{"b", "8", "10", "50.0%", "50.0%", "1.00", "0.100s", "0.200s", "0.300s", "100"},
	}, shareRows(sc, res))
	assert.Contains(t, shareNote(sc, res), "telemetry of r1 reaches no client")
}

// A directory -out cannot be made in used to fail only after the first
// scenario had run (minutes, with -scenario all), losing its tables.
func TestOutThatCannotBeWrittenFailsBeforeAnyRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	var stderr bytes.Buffer
	_, err := parse([]string{"-scenario", "embedding", "-out", filepath.Join(file, "out")}, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-out "+filepath.Join(file, "out")+":")
	assert.Contains(t, stderr.String(), "-out ")

	dir := filepath.Join(t.TempDir(), "a", "b")
	c, err := parse([]string{"-scenario", "embedding", "-out", dir}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, dir, c.out)
	assert.DirExists(t, dir)
}

// A newcomer saw columns such as "max/mean" and "GPU busy", and a table of
// one seed, with nothing saying what they are or how far to trust a gap.
// The legend explains every column of the table, and the seeds.
func TestLegendExplainsEveryColumn(t *testing.T) {
	for _, col := range header {
		if col == "p90" || col == "p99" {
			continue // of the column before: "TTFT p50 p90 p99"
		}
		assert.Contains(t, legend, col+":", "column %q", col)
	}
	assert.Contains(t, legend, "-seed")
}

// Embedding and rerank calls stream no tokens: their ITL is not 0 ms,
// there is none.
func TestNoITLIsADash(t *testing.T) {
	r := row(fleetsim.Result{Policy: "p", TTFTP50: 0.02, ITLP50: 0, ITLP99: 0})
	assert.Equal(t, []string{"-", "-"}, r[5:7])
	r = row(fleetsim.Result{Policy: "p", ITLP50: 0.017, ITLP99: 0.2})
	assert.Equal(t, []string{"17ms", "200ms"}, r[5:7])
}

// -list padded names to 14 characters, so the descriptions of
// unauthorized-chat, model-failure-all and four others started further
// right than the rest, one space after the name.
func TestListAlignsTheDescriptions(t *testing.T) {
	var b bytes.Buffer
	writeList(&b)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	require.Len(t, lines, len(fleetsim.Scenarios()))
	col := -1
	for i, sc := range fleetsim.Scenarios() {
		at := strings.Index(lines[i], sc.Description)
		require.Positive(t, at, lines[i])
		if col < 0 {
			col = at
		}
		assert.Equal(t, col, at, "%s: description at column %d", sc.Name, at)
	}
}

// -seeds sets every scenario's seeds, and a run of more than one prints
// each policy's median and range across them at the headline load, with
// how often it had the lowest p90 TTFT (the oracle aside); a single seed
// prints no such table.
func TestSeedsPrintTheSpreadAcrossThem(t *testing.T) {
	c, err := parse([]string{"-scenario", "shared-prefix", "-seeds", "3"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 3, c.scenarios[0].Seeds)

	sc := &fleetsim.Scenario{Headline: 10, RateUnit: "req/s", Policies: []fleetsim.Policy{{Name: "a"}, {Name: "b"}, {Name: "oracle"}}}
	var res []fleetsim.Result
	add := func(policy string, seed uint64, p90, tok float64) {
		res = append(res, fleetsim.Result{Policy: policy, Clients: 1, Seed: seed, Rate: 10, Completed: 1, TTFTP50: p90 / 2, TTFTP90: p90, TTFTP99: 2 * p90, Throughput: tok, CacheHit: 0.5})
	}
	add("a", 4, 0.2, 100)
	add("b", 4, 0.3, 90)
	add("oracle", 4, 0.1, 120)
	add("a", 5, 0.4, 130)
	add("b", 5, 0.1, 80)
	add("oracle", 5, 0.05, 120)
	add("a", 6, 0.3, 110)
	add("b", 6, 0.5, 70)
	add("oracle", 6, 0.05, 120)
	res = append(res, fleetsim.Result{Policy: "a", Clients: 1, Seed: 7, Rate: 5, Completed: 1, TTFTP90: 9}) // not the headline load
	var out bytes.Buffer
	writeSpread(&out, sc, res)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	assert.Equal(t, "across 3 seeds (4-6) at 10 req/s, 1 client(s): median [least..most]", lines[0])
	assert.Equal(t, []string{"a", "110", "[100..130]", "0.150s", "[0.100s..0.200s]", "0.300s", "[0.200s..0.400s]", "0.600s", "[0.400s..0.800s]", "50.0%", "[50.0%..50.0%]", "0", "[0..0]", "2", "of", "3"}, strings.Fields(lines[2]))
	assert.Equal(t, []string{"2", "of", "3"}, strings.Fields(lines[2])[13:])
	assert.Equal(t, []string{"1", "of", "3"}, strings.Fields(lines[3])[13:])
	assert.Equal(t, []string{"0", "of", "3"}, strings.Fields(lines[4])[13:], "the oracle never counts as best")

	var one bytes.Buffer
	writeSpread(&one, sc, res[:3])
	assert.Empty(t, one.String(), "one seed: no spread")
}

// The CSV carries what the text tables show of the failed calls: attempts
// refused as over the context window or answered 401, and calls their
// callers gave up on, by column name.
func TestCSVCarriesTheFailedCallsBreakdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.csv")
	require.NoError(t, writeCSV(path, []fleetsim.Result{{Scenario: "x", Policy: "p", Failed: 9, TooLong: 2, Unauthorized: 3, Abandoned: 4}}))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 2)
	got := map[string]string{}
	for i, h := range rows[0] {
		got[h] = rows[1][i]
	}
	assert.Equal(t, "9", got["failed"])
	assert.Equal(t, "2", got["too_long"])
	assert.Equal(t, "3", got["unauthorized"])
	assert.Equal(t, "4", got["abandoned"])
}
