// Command fleetsim compares load-balancing policies on a simulated GPU
// inference fleet, routing with inferlb's real Balancer in virtual time.
//
//	go run ./benchmarks/cmd/fleetsim -scenario shared-prefix [-quick] [-json] [-out DIR] [-seed N] [-clients N]
//	                                 [-chat-rerender SHARE] [-scrape DURATION] [-estimate-error X] [-declared-output F]
//	                                 [-policies NAME,NAME] [-extra NAME,NAME] [-parallel N] [-seeds N]
//	go run ./benchmarks/cmd/fleetsim -list
//
// It prints a legend of the columns, then a table per scenario (the headline
// offered load in full, then a sweep of throughput and p90 TTFT over every
// offered load), and with -out writes NAME.csv, NAME.md and PNG charts of latency and throughput versus
// offered load. With -json it prints one JSON array of every run instead.
// -chat-rerender sets the share of chat sessions whose client re-renders the
// history it resends (fleetsim.Chat.Rerender; default fleetsim.ChatRerender,
// 0 reproduces the figures from before the knob).
// -policies keeps only the named policies (as the tables name them, e.g.
// "inferlb -affinity"; a name no scenario run has is an error, and with
// -scenario all the scenarios without any of them are skipped);
// -extra adds baselines no scenario's table holds to every scenario run
// (least-conn, a full scan for the fewest calls in flight;
// consistent-hash-bounded, a ring with Envoy's load bound, hash_balance_factor 125: see
// fleetsim.ExtraPolicies), before -policies keeps its names;
// -scrape sets the telemetry scrape interval (at least 10ms; 0, the
// default, keeps each scenario's 1s); -estimate-error and -declared-output
// put what inferlb is told of each call's size off the truth
// (fleetsim.Estimate). -out's directory is made before any run.
// -parallel sets how many runs are simulated at once
// (default GOMAXPROCS), which changes no figure. -clients and -parallel
// must be at least 1, -clients at most 1000; multi-client runs 1 and 8 clients and
// partial-telemetry 8, so -clients with -scenario multi-client or
// partial-telemetry is an error (with -scenario all it applies to the
// other scenarios). A scenario with a replica whose telemetry reaches no
// client (partial-telemetry) also prints each replica's share of the
// calls at every offered load. A scenario with Seeds runs that many seeds from -seed
// on (model-failure, model-failure-all, lora-slots, context-windows: 4):
// its first seed's table, then one by model (model-failure,
// model-failure-all), of adapter slots (lora-slots,
// with one by request class for the first seed) or of context windows
// (context-windows) with a row per policy and seed. -seeds N runs N seeds
// from -seed on in every scenario (at most 50), and any run of more than
// one seed prints, after the first seed's table, each policy's median and
// range across the seeds at the headline load and in how many seeds it had
// the lowest p90 TTFT: whether a gap is more than one seed's luck (on
// stdout only; -out's files are as before). Words after the flags are an error, not ignored.
// The same seed gives the same output, byte for byte.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// minScrape is the shortest -scrape: shorter than any real poller (llm-d's
// endpoint picker refreshes every 50 ms), and every replica is scraped that
// often in virtual time, so 1µs takes a minute for one quick run and 1ns
// never ends.
const minScrape = 10 * time.Millisecond

// maxClients is the most -clients: each client is a Balancer of its own,
// and 10,000 took 1.3 GB for one quick embedding run (runs go -parallel at
// once), so 100,000 ran a machine out of memory with no message.
const maxClients = 1000

// config is the command line, parsed and checked.
type config struct {
	list      bool
	scenarios []*fleetsim.Scenario // shortened, filtered and with the scrape interval applied
	asJSON    bool
	out       string
	seed      uint64
	clients   int
	par       int
}

// parse reads the command line. Every error, and the usage for -h, has been
// printed to stderr when it returns.
func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		c      config
		name   = fs.String("scenario", "shared-prefix", "scenario to run, or \"all\"")
		quick  = fs.Bool("quick", false, "shorter runs at the headline rate only (seconds)")
		only   = fs.String("policies", "", "comma-separated policy names to run (default all)")
		extra  = fs.String("extra", "", "comma-separated baselines to add to every scenario: least-conn, consistent-hash-bounded")
		scrape = fs.Duration("scrape", 0, "telemetry scrape interval instead of the scenario's (1s), at least 10ms, e.g. 15s as a Prometheus-paced poller")
		estErr = fs.Float64("estimate-error", 0, "spread the prompt tokens inferlb is told over [1-x, 1+x] times the truth, fixed per prompt text (0: exact)")
		outFac = fs.Float64("declared-output", 0, "multiply the max_tokens inferlb is told by this (0: as the workload declares, the answer's length)")
		seeds  = fs.Int("seeds", 0, "run this many seeds from -seed on and print each policy's median and range across them (0: the scenario's own, 1 for most)")
		rerend = fs.Float64("chat-rerender", fleetsim.ChatRerender, "share of chat sessions whose client re-renders the history, so a follow-up misses the cached previous answer (0: every answer quoted token for token, as before the flag)")
	)
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON array of results instead of tables")
	fs.StringVar(&c.out, "out", "", "directory for CSV, Markdown and PNG output")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed (same seed, same results)")
	fs.IntVar(&c.clients, "clients", 1, "independent client balancers sharing the fleet (multi-client runs its own counts)")
	fs.BoolVar(&c.list, "list", false, "list scenarios and exit")
	fs.IntVar(&c.par, "parallel", runtime.GOMAXPROCS(0), "runs simulated at once")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	fail := func(format string, a ...any) (config, error) {
		err := fmt.Errorf("fleetsim: "+format, a...)
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q: every setting is a flag, and flags go first (-scenario NAME)", fs.Arg(0))
	}
	if c.list {
		return c, nil
	}
	if c.clients < 1 {
		return fail("-clients %d: must be at least 1", c.clients)
	}
	if c.clients > maxClients {
		return fail("-clients %d: must be at most %d (each client is a Balancer of its own: 10,000 take over 1 GB a run)", c.clients, maxClients)
	}
	if c.par < 1 {
		return fail("-parallel %d: must be at least 1", c.par)
	}
	if *name == "all" {
		c.scenarios = fleetsim.Scenarios()
	} else if sc := fleetsim.Lookup(*name); sc != nil {
		c.scenarios = []*fleetsim.Scenario{sc}
	} else {
		return fail("unknown scenario %q; -list shows them", *name)
	}
	if *scrape != 0 && *scrape < minScrape {
		// Every replica is scraped that often in virtual time, so a
		// nanosecond interval never finishes a run.
		return fail("-scrape %v: must be at least %v (0: the scenario's own)", *scrape, minScrape)
	}
	if !(*estErr >= 0 && *estErr < 1) {
		return fail("-estimate-error %v: must be at least 0 and below 1", *estErr)
	}
	if !(*outFac >= 0 && *outFac <= 1000) {
		return fail("-declared-output %v: must be 0 (as declared) or a factor up to 1000", *outFac)
	}
	if *seeds < 0 || *seeds > maxSeeds {
		return fail("-seeds %d: must be from 1 to %d (0: the scenario's own)", *seeds, maxSeeds)
	}
	if !(*rerend >= 0 && *rerend <= 1) {
		return fail("-chat-rerender %v: must be a share from 0 to 1", *rerend)
	}
	if sc := c.scenarios[0]; len(c.scenarios) == 1 && len(sc.Clients) > 0 && flagSet(fs, "clients") {
		return fail("-clients %d: scenario %s runs %s clients whatever -clients says", c.clients, sc.Name, countList(sc.Clients))
	}
	if *extra != "" {
		var add []fleetsim.Policy
		for n := range strings.SplitSeq(*extra, ",") {
			if n = strings.TrimSpace(n); n == "" {
				continue
			}
			i := slices.IndexFunc(fleetsim.ExtraPolicies(), func(p fleetsim.Policy) bool { return p.Name == n })
			if i < 0 {
				return fail("-extra: no extra baseline %q (least-conn, consistent-hash-bounded)", n)
			}
			add = append(add, fleetsim.ExtraPolicies()[i])
		}
		if len(add) == 0 {
			return fail("-extra %q names no policy", *extra)
		}
		for _, sc := range c.scenarios {
			sc.Policies = slices.Concat(sc.Policies, add)
		}
	}
	var names []string
	if *only != "" {
		for n := range strings.SplitSeq(*only, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return fail("-policies %q names no policy", *only)
		}
	}
	for _, n := range names {
		if slices.ContainsFunc(c.scenarios, func(sc *fleetsim.Scenario) bool { return hasPolicy(sc, n) }) {
			continue
		}
		if len(c.scenarios) > 1 {
			return fail("-policies: no policy %q in any scenario", n)
		}
		sc := c.scenarios[0]
		var have []string
		for _, p := range sc.Policies {
			have = append(have, p.Name)
		}
		return fail("-policies: no policy %q in scenario %s (it has %s)", n, sc.Name, strings.Join(have, ", "))
	}
	var keep []*fleetsim.Scenario
	for _, sc := range c.scenarios {
		if *quick {
			sc = sc.Quick()
		}
		if names != nil {
			// A scenario with none of the named policies is left out
			// rather than run empty.
			if sc.Policies = filter(sc.Policies, names); len(sc.Policies) == 0 {
				continue
			}
		}
		if *scrape > 0 {
			sc.Scrape = *scrape
		}
		if *seeds > 0 {
			sc.Seeds = *seeds
		}
		sc.Estimate = fleetsim.Estimate{PromptError: *estErr, OutputFactor: *outFac}
		if flagSet(fs, "chat-rerender") {
			sc.SetChatRerender(*rerend)
		}
		keep = append(keep, sc)
	}
	c.scenarios = keep
	if c.out != "" {
		// Made now, so a directory that cannot be loses no run: the
		// outputs are written after each scenario has run.
		if err := os.MkdirAll(c.out, 0o755); err != nil {
			if pe := (*iofs.PathError)(nil); errors.As(err, &pe) {
				err = pe.Err // the path may be a parent of -out's
			}
			return fail("-out %s: %v", c.out, err)
		}
	}
	return c, nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// countList writes 1, 8 as "1 and 8".
func countList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func hasPolicy(sc *fleetsim.Scenario, name string) bool {
	return slices.ContainsFunc(sc.Policies, func(p fleetsim.Policy) bool { return p.Name == name })
}

func main() {
	c, err := parse(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	if c.list {
		writeList(os.Stdout)
		return
	}
	if !c.asJSON {
		fmt.Print(legend, "\n")
	}
	var all []fleetsim.Result
	for _, sc := range c.scenarios {
		start := time.Now()
		res := runScenario(sc, c.seed, c.clients, c.par)
		all = append(all, res...)
		if !c.asJSON {
			printScenario(os.Stdout, sc, res)
			fmt.Fprintf(os.Stderr, "fleetsim: %s: %d runs in %v\n", sc.Name, len(res), time.Since(start).Round(100*time.Millisecond))
		}
		if c.out != "" {
			if err := writeOutputs(c.out, sc, res); err != nil {
				fmt.Fprintln(os.Stderr, "fleetsim:", err)
				os.Exit(1)
			}
		}
	}
	if c.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
	}
}

// writeList prints each scenario's name and description, the descriptions
// in one column however long the names.
func writeList(w io.Writer) {
	width := 0
	for _, sc := range fleetsim.Scenarios() {
		width = max(width, len(sc.Name))
	}
	for _, sc := range fleetsim.Scenarios() {
		fmt.Fprintf(w, "%-*s  %s\n", width, sc.Name, sc.Description)
	}
}

// filter keeps the policies named, in the scenario's order.
func filter(ps []fleetsim.Policy, names []string) []fleetsim.Policy {
	var out []fleetsim.Policy
	for _, p := range ps {
		if slices.Contains(names, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

// runScenario simulates every (clients, rate, policy) of sc on par
// goroutines; each run is independent and deterministic, and results are
// returned in a fixed order whatever the scheduling.
func runScenario(sc *fleetsim.Scenario, seed uint64, clients, par int) []fleetsim.Result {
	cl := sc.Clients
	if len(cl) == 0 {
		cl = []int{clients}
	}
	type task struct {
		i    int
		pol  fleetsim.Policy
		conf fleetsim.RunConfig
	}
	var tasks []task
	for _, c := range cl {
		for k := range uint64(max(sc.Seeds, 1)) {
			for _, rate := range sc.Rates {
				for _, p := range sc.Policies {
					tasks = append(tasks, task{len(tasks), p, fleetsim.RunConfig{
						Rate: rate, Clients: c, Seed: seed + k,
						Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape, Estimate: sc.Estimate,
					}})
				}
			}
		}
	}
	res := make([]fleetsim.Result, len(tasks))
	ch := make(chan task)
	var wg sync.WaitGroup
	for range max(par, 1) {
		wg.Go(func() {
			for t := range ch {
				res[t.i] = fleetsim.Run(sc, t.pol, t.conf)
			}
		})
	}
	for _, t := range tasks {
		ch <- t
	}
	close(ch)
	wg.Wait()
	return res
}

func printScenario(w io.Writer, sc *fleetsim.Scenario, all []fleetsim.Result) {
	fmt.Fprintf(w, "== %s: %s\n", sc.Name, sc.Description)
	res := firstSeed(all)
	for _, c := range clientCounts(res) {
		head := pick(res, func(r fleetsim.Result) bool { return r.Rate == sc.Headline && r.Clients == c })
		if len(head) == 0 {
			continue
		}
		fmt.Fprintf(w, "\noffered load %g %s, %d client(s), seed %d\n", sc.Headline, sc.RateUnit, c, head[0].Seed)
		writeTable(w, head)
	}
	writeSpread(w, sc, all)
	if rows := byModelRows(sc, all); rows != nil {
		fmt.Fprintf(w, "\nby model at %g %s (%s)\n", sc.Headline, sc.RateUnit, byModelNote(sc, all))
		writeAligned(w, rows)
	}
	if rows := loraRows(sc, all); rows != nil {
		fmt.Fprintf(w, "\nadapter slots at %g %s (%s)\n", sc.Headline, sc.RateUnit, loraNote(all))
		writeAligned(w, rows)
		fmt.Fprintf(w, "\nby class at %g %s, seed %d (adapters by popularity, and the base model)\n", sc.Headline, sc.RateUnit, res[0].Seed)
		writeAligned(w, loraClassRows(sc, res))
	}
	if rows := windowRows(sc, all); rows != nil {
		fmt.Fprintf(w, "\ncontext windows at %g %s (%s)\n", sc.Headline, sc.RateUnit, windowNote(all))
		writeAligned(w, rows)
	}
	if rows := shareRows(sc, res); rows != nil {
		fmt.Fprintf(w, "\nload share by replica (%s)\n", shareNote(sc, res))
		writeAligned(w, rows)
	}
	if len(sc.Rates) > 1 {
		fmt.Fprintf(w, "\nsweep: output tokens/s | p90 TTFT (s) by offered load (%s)\n", sc.RateUnit)
		writeSweep(w, sc, res)
	}
	fmt.Fprintln(w)
}

// firstSeed keeps the results of the first seed run: the tables, sweeps
// and charts are of one seed, and only the table by model shows them all.
func firstSeed(res []fleetsim.Result) []fleetsim.Result {
	if len(res) == 0 {
		return nil
	}
	return pick(res, func(r fleetsim.Result) bool { return r.Seed == res[0].Seed })
}

// failing returns the models a scenario makes fail (ModelFail) and the
// replicas they fail on, in order.
func failing(sc *fleetsim.Scenario) (models []string, replicas []int) {
	for _, ev := range sc.Events {
		if ev.Kind != fleetsim.ModelFail {
			continue
		}
		if !slices.Contains(models, ev.Model) {
			models = append(models, ev.Model)
		}
		if !slices.Contains(replicas, ev.Replica) {
			replicas = append(replicas, ev.Replica)
		}
	}
	slices.Sort(replicas)
	return models, replicas
}

// byModelRows is the table by model of a scenario that makes a model fail
// (nil for the others): per policy and seed at the headline rate, the
// healthy models' tokens, failed calls and p99 TTFT, the share of their
// attempts sent to the replicas where the model fails (unless it fails on
// every replica), the failing model's failed calls, and the inferlb
// balancers' counts.
func byModelRows(sc *fleetsim.Scenario, res []fleetsim.Result) [][]string {
	models, replicas := failing(sc)
	if len(models) == 0 {
		return nil
	}
	some := len(replicas) < len(sc.Fleet)
	names := make([]string, len(replicas))
	for i, r := range replicas {
		names[i] = fmt.Sprintf("r%d", r)
	}
	hdr := []string{"healthy tok/s", "healthy failed", "healthy TTFT p99"}
	if some {
		hdr = append(hdr, "healthy on "+strings.Join(names, "+"))
	}
	hdr = append(hdr, strings.Join(models, ", ")+" failed", "trips", "ejections", "capped", "model failures", "model-failing events")
	return seedRows(sc, res, hdr, func(r fleetsim.Result) bool { return r.Healthy != nil }, func(r fleetsim.Result) []string {
		h := r.Healthy
		row := []string{fmt.Sprintf("%.0f", h.Throughput), fmt.Sprint(h.Failed), secs(h.TTFTP99)}
		if some {
			on, all := 0, 0
			for i, n := range h.Attempts {
				all += n
				if slices.Contains(replicas, i) {
					on += n
				}
			}
			row = append(row, fmt.Sprintf("%d (%.1f%%)", on, 100*float64(on)/float64(max(all, 1))))
		}
		row = append(row, fmt.Sprint(r.Broken.Failed))
		if b := r.Balancer; b != nil {
			return append(row, fmt.Sprint(b.Trips), fmt.Sprint(b.Ejections), fmt.Sprint(b.Capped), fmt.Sprint(b.ModelFailures), fmt.Sprint(b.ModelFailing))
		}
		return append(row, "-", "-", "-", "-", "-")
	})
}

// seedRows is a table with a row for each policy, client count and seed
// at sc's headline rate, in that order: "policy", "clients" (when res has
// more than one count), "seed" and hdr, then cells of each result that
// keep accepts.
func seedRows(sc *fleetsim.Scenario, res []fleetsim.Result, hdr []string, keep func(fleetsim.Result) bool, cells func(fleetsim.Result) []string) [][]string {
	counts := clientCounts(res)
	lead := func(policy, clients, seed string) []string {
		if len(counts) > 1 {
			return []string{policy, clients, seed}
		}
		return []string{policy, seed}
	}
	rows := [][]string{append(lead("policy", "clients", "seed"), hdr...)}
	for _, c := range counts {
		for _, p := range sc.Policies {
			for _, r := range res {
				if r.Policy != p.Name || r.Clients != c || r.Rate != sc.Headline || !keep(r) {
					continue
				}
				rows = append(rows, append(lead(r.Policy, fmt.Sprint(r.Clients), fmt.Sprint(r.Seed)), cells(r)...))
			}
		}
	}
	return rows
}

// seedSpan names the seeds of res: "seed 3", or "seeds 1-4" from the
// lowest to the highest.
func seedSpan(res []fleetsim.Result) string {
	first, last := res[0].Seed, res[0].Seed
	for _, r := range res {
		first, last = min(first, r.Seed), max(last, r.Seed)
	}
	if last > first {
		return fmt.Sprintf("seeds %d-%d", first, last)
	}
	return fmt.Sprintf("seed %d", first)
}

// byModelNote says what the table by model counts.
func byModelNote(sc *fleetsim.Scenario, res []fleetsim.Result) string {
	models, replicas := failing(sc)
	span := seedSpan(res)
	if counts := clientCounts(res); len(counts) == 1 {
		span = fmt.Sprintf("%d client(s), %s", counts[0], span)
	}
	note := fmt.Sprintf("%s; healthy: the calls for models other than %s", span, strings.Join(models, ", "))
	if len(replicas) < len(sc.Fleet) {
		note += "; healthy on: their attempts sent to the replicas where it fails, of all theirs"
	}
	return note + "; trips to model-failing events: the inferlb balancers' counts over the run (EndpointStats, events)"
}

func clientCounts(res []fleetsim.Result) []int {
	var out []int
	for _, r := range res {
		if len(out) == 0 || out[len(out)-1] != r.Clients {
			out = append(out, r.Clients)
		}
	}
	return out
}

func pick(res []fleetsim.Result, f func(fleetsim.Result) bool) []fleetsim.Result {
	var out []fleetsim.Result
	for _, r := range res {
		if f(r) {
			out = append(out, r)
		}
	}
	return out
}

// legend is printed above the tables: what each column of the table
// measures (over the calls that arrived in the measured window), and how
// far one seed goes.
const legend = `columns, over the calls arriving in the measured window (better: more tok/s and cache hit, less latency and failed):
  policy: the router; "inferlb -X": inferlb with X off; "inferlb <word>", "<baseline> +conn", "+ranks": one setting changed (benchmarks/README.md)
  tok/s: output tokens a second (input tokens for embedding and rerank calls), less those of failed attempts
  TTFT p50: time to first token, then its p90 and p99; calls that failed are left out, unfinished ones count
  ITL p50: time between tokens of a stream, then its p99 ("-": the calls stream none)
  E2E p50: time from arrival to the last token, then its p99
  cache hit: prompt tokens found in the replicas' prefix caches, of all prompt tokens admitted
  GPU busy: the replicas' mean share of the window spent in engine steps
  max/mean: calls the busiest replica accepted over the mean (1.00: spread evenly)
  failed: calls whose caller got an error after any retry
each table is of one seed (-seed, default 1): run -seeds 3 (medians and ranges across seeds) before reading a gap of a few percent
`

var header = []string{"policy", "tok/s", "TTFT p50", "p90", "p99", "ITL p50", "p99", "E2E p50", "p99", "cache hit", "GPU busy", "max/mean", "failed"}

// notServedColumn reports whether a table of res has a "not served"
// column: only where some replica answered it does not serve a call's
// model, so the other scenarios' tables keep their shape.
func notServedColumn(res []fleetsim.Result) bool {
	return slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.NotServed > 0 })
}

// tooLongColumn reports whether a table of res has a "refused" column:
// only where some replica refused a call as longer than its context
// window.
func tooLongColumn(res []fleetsim.Result) bool {
	return slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.TooLong > 0 })
}

// unauthorizedColumn reports whether a table of res has a "401s" column:
// only where some replica answered 401 (ReplicaSpec.Unauthorized).
func unauthorizedColumn(res []fleetsim.Result) bool {
	return slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.Unauthorized > 0 })
}

// tenantColumns reports whether a table of res has the "tenant refused"
// columns: only where some replica refuses a tenant's calls
// (ReplicaSpec.RefusesTenants).
func tenantColumns(res []fleetsim.Result) bool {
	return slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.Tenants != nil })
}

// headerFor is the table header for res.
func headerFor(res []fleetsim.Result) []string {
	out := header
	if notServedColumn(res) {
		out = append(slices.Clone(out), "not served")
	}
	if tooLongColumn(res) {
		out = append(slices.Clone(out), "refused")
	}
	if unauthorizedColumn(res) {
		out = append(slices.Clone(out), "401s")
	}
	if tenantColumns(res) {
		out = append(slices.Clone(out), "refused tenant failed", "others on refuser")
	}
	return out
}

// rowFor is r's table row among res.
func rowFor(res []fleetsim.Result, r fleetsim.Result) []string {
	out := row(r)
	if notServedColumn(res) {
		out = append(out, fmt.Sprintf("%d", r.NotServed))
	}
	if tooLongColumn(res) {
		out = append(out, fmt.Sprintf("%d", r.TooLong))
	}
	if unauthorizedColumn(res) {
		out = append(out, fmt.Sprintf("%d (%.1f%%)", r.Unauthorized, 100*float64(r.Unauthorized)/float64(max(r.Requests, 1))))
	}
	if tenantColumns(res) {
		t := r.Tenants
		if t == nil {
			t = &fleetsim.TenantResult{}
		}
		sent := 0
		for _, n := range t.OthersAttempts {
			sent += n
		}
		out = append(out, fmt.Sprintf("%d of %d", t.RefusedFailed, t.Refused),
			fmt.Sprintf("%d (%.1f%%)", t.OthersOnRefuser, 100*float64(t.OthersOnRefuser)/float64(max(sent, 1))))
	}
	return out
}

// windowed reports whether some replica of sc has a context window.
func windowed(sc *fleetsim.Scenario) bool {
	return slices.ContainsFunc(sc.Fleet, func(r fleetsim.ReplicaSpec) bool { return r.Server.MaxModelLen > 0 })
}

// windowRows is the table of a scenario whose replicas have context
// windows (nil for the others): per policy and seed at the headline rate,
// the calls whose caller got an error, the refusals met, latency (of the
// calls answered) and throughput.
func windowRows(sc *fleetsim.Scenario, res []fleetsim.Result) [][]string {
	if !windowed(sc) {
		return nil
	}
	hdr := []string{"calls", "failed", "refused", "TTFT p50", "p99", "E2E p50", "p99", "heavy E2E p99", "tok/s"}
	return seedRows(sc, res, hdr, func(fleetsim.Result) bool { return true }, func(r fleetsim.Result) []string {
		heavy := "-"
		if v, ok := r.ClassE2EP99["heavy"]; ok {
			heavy = secs(v)
		}
		return []string{fmt.Sprint(r.Requests),
			fmt.Sprintf("%d (%.1f%%)", r.Failed, 100*float64(r.Failed)/float64(max(r.Requests, 1))), fmt.Sprint(r.TooLong),
			secs(r.TTFTP50), secs(r.TTFTP99), secs(r.E2EP50), secs(r.E2EP99), heavy, fmt.Sprintf("%.0f", r.Throughput)}
	})
}

// windowNote says what the context-window table counts.
func windowNote(res []fleetsim.Result) string {
	return seedSpan(res) + "; failed: calls whose caller got an error, of all calls; refused: attempts a replica refused as longer than its window;" +
		" latencies of the calls answered; heavy: the long calls"
}

func row(r fleetsim.Result) []string {
	return []string{
		r.Policy,
		fmt.Sprintf("%.0f", r.Throughput),
		secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99),
		ms(r.ITLP50), ms(r.ITLP99),
		secs(r.E2EP50), secs(r.E2EP99),
		fmt.Sprintf("%.1f%%", 100*r.CacheHit),
		fmt.Sprintf("%.0f%%", 100*r.GPUBusy),
		fmt.Sprintf("%.2f", r.MaxMean),
		fmt.Sprintf("%d", r.Failed),
	}
}

func secs(s float64) string {
	switch {
	case s != s:
		return "-"
	case s < 1:
		return fmt.Sprintf("%.3fs", s)
	case s < 100:
		return fmt.Sprintf("%.2fs", s)
	}
	return fmt.Sprintf("%.0fs", s)
}

func ms(s float64) string {
	if s != s || s == 0 { // 0: no token gaps (pooling calls), never a measured ITL
		return "-"
	}
	return fmt.Sprintf("%.0fms", 1000*s)
}

func writeTable(w io.Writer, res []fleetsim.Result) {
	rows := [][]string{headerFor(res)}
	for _, r := range res {
		rows = append(rows, rowFor(res, r))
	}
	writeAligned(w, rows)
}

func writeSweep(w io.Writer, sc *fleetsim.Scenario, res []fleetsim.Result) {
	for _, c := range clientCounts(res) {
		hdr := []string{"policy"}
		for _, rate := range sc.Rates {
			hdr = append(hdr, fmt.Sprintf("%g", rate))
		}
		rows := [][]string{hdr}
		for _, p := range sc.Policies {
			line := []string{p.Name}
			for _, rate := range sc.Rates {
				cell := "-"
				for _, r := range res {
					if r.Policy == p.Name && r.Rate == rate && r.Clients == c {
						cell = fmt.Sprintf("%.0f | %s", r.Throughput, secs(r.TTFTP90))
					}
				}
				line = append(line, cell)
			}
			rows = append(rows, line)
		}
		writeAligned(w, rows)
	}
}

func writeAligned(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], c)
			} else {
				fmt.Fprintf(&b, "  %*s", width[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

func writeOutputs(dir string, sc *fleetsim.Scenario, res []fleetsim.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, sc.Name+".csv"), res); err != nil {
		return err
	}
	if err := writeMarkdown(filepath.Join(dir, sc.Name+".md"), sc, res); err != nil {
		return err
	}
	return writeCharts(dir, sc, firstSeed(res))
}

// loraRows is the table of a scenario whose replicas limit their LoRA
// adapters (nil for the others): per policy and seed at the headline
// rate, latency, the calls that waited for an adapter slot and for how
// long, the adapter loads per replica, and throughput.
func loraRows(sc *fleetsim.Scenario, res []fleetsim.Result) [][]string {
	if !slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.LoRA != nil }) {
		return nil
	}
	hdr := []string{"tok/s", "TTFT p50", "p99", "E2E p50", "p99", "slot-waited calls", "slot wait mean", "p99", "loads/replica", "max"}
	return seedRows(sc, res, hdr, func(r fleetsim.Result) bool { return r.LoRA != nil }, func(r fleetsim.Result) []string {
		l := r.LoRA
		return []string{fmt.Sprintf("%.0f", r.Throughput),
			secs(r.TTFTP50), secs(r.TTFTP99), secs(r.E2EP50), secs(r.E2EP99),
			fmt.Sprintf("%d (%.1f%%)", l.SlotWaited, 100*float64(l.SlotWaited)/float64(max(l.AdapterCalls, 1))),
			secs(l.SlotWaitMean), secs(l.SlotWaitP99),
			fmt.Sprintf("%.0f", float64(l.TotalLoads())/float64(max(len(l.Loads), 1))), fmt.Sprint(slices.Max(append([]int{0}, l.Loads...)))}
	})
}

// loraNote says what the adapter-slot table counts.
func loraNote(res []fleetsim.Result) string {
	return seedSpan(res) + "; slot-waited: adapter calls a scheduler skipped for want of an adapter slot, of all adapter calls;" +
		" slot wait over every adapter call; loads: adapters loaded into a GPU slot in the window"
}

// loraClassRows splits res (one seed) at the headline rate by request class.
func loraClassRows(sc *fleetsim.Scenario, res []fleetsim.Result) [][]string {
	rows := [][]string{{"policy", "class", "calls", "TTFT p50", "p99", "E2E p50", "p99", "slot wait mean"}}
	for _, p := range sc.Policies {
		for _, r := range res {
			if r.Policy != p.Name || r.Rate != sc.Headline || r.LoRA == nil {
				continue
			}
			for _, c := range r.LoRA.Classes {
				rows = append(rows, []string{r.Policy, c.Class, fmt.Sprint(c.Calls), secs(c.TTFTP50), secs(c.TTFTP99),
					secs(c.E2EP50), secs(c.E2EP99), secs(c.SlotWaitMean)})
			}
		}
	}
	return rows
}

func writeMarkdown(path string, sc *fleetsim.Scenario, all []fleetsim.Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", sc.Description)
	res := firstSeed(all)
	for _, c := range clientCounts(res) {
		head := pick(res, func(r fleetsim.Result) bool { return r.Rate == sc.Headline && r.Clients == c })
		if len(head) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nOffered load %g %s, %d client(s), seed %d:\n\n", sc.Headline, sc.RateUnit, c, head[0].Seed)
		hdr := headerFor(head)
		fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
		for _, r := range head {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(rowFor(head, r), " | "))
		}
	}
	if rows := byModelRows(sc, all); rows != nil {
		fmt.Fprintf(&b, "\nBy model at %g %s (%s):\n\n", sc.Headline, sc.RateUnit, byModelNote(sc, all))
		fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(rows[0], " | "), strings.Repeat("---|", len(rows[0])))
		for _, r := range rows[1:] {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
		}
	}
	if rows := loraRows(sc, all); rows != nil {
		fmt.Fprintf(&b, "\nAdapter slots at %g %s (%s):\n\n", sc.Headline, sc.RateUnit, loraNote(all))
		mdTable(&b, rows)
		fmt.Fprintf(&b, "\nBy class at %g %s, seed %d (adapters by popularity, and the base model):\n\n", sc.Headline, sc.RateUnit, res[0].Seed)
		mdTable(&b, loraClassRows(sc, res))
	}
	if rows := windowRows(sc, all); rows != nil {
		fmt.Fprintf(&b, "\nContext windows at %g %s (%s):\n\n", sc.Headline, sc.RateUnit, windowNote(all))
		mdTable(&b, rows)
	}
	if rows := shareRows(sc, res); rows != nil {
		fmt.Fprintf(&b, "\nLoad share by replica (%s):\n\n", shareNote(sc, res))
		mdTable(&b, rows)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// mdTable writes rows as a Markdown table, the first row its header.
func mdTable(b *strings.Builder, rows [][]string) {
	fmt.Fprintf(b, "| %s |\n|%s\n", strings.Join(rows[0], " | "), strings.Repeat("---|", len(rows[0])))
	for _, r := range rows[1:] {
		fmt.Fprintf(b, "| %s |\n", strings.Join(r, " | "))
	}
}

// unscraped returns the replicas of sc whose telemetry reaches no client.
func unscraped(sc *fleetsim.Scenario) []int {
	var out []int
	for i, r := range sc.Fleet {
		if r.Unscraped {
			out = append(out, i)
		}
	}
	return out
}

// shareRows is the table of a scenario with a replica whose telemetry
// reaches no client (nil for the others): per policy and offered load
// (one seed), each replica's share of the calls and TTFT, with which a
// herd onto the replica shows.
func shareRows(sc *fleetsim.Scenario, res []fleetsim.Result) [][]string {
	if len(unscraped(sc)) == 0 {
		return nil
	}
	hdr := []string{"policy", "clients", "rate"}
	for i := range sc.Fleet {
		hdr = append(hdr, fmt.Sprintf("r%d", i))
	}
	hdr = append(hdr, "max/mean", "TTFT p50", "p90", "p99", "tok/s")
	rows := [][]string{hdr}
	for _, c := range clientCounts(res) {
		for _, p := range sc.Policies {
			for _, rate := range sc.Rates {
				for _, r := range res {
					if r.Policy != p.Name || r.Rate != rate || r.Clients != c || len(r.Share) != len(sc.Fleet) {
						continue
					}
					line := []string{r.Policy, fmt.Sprint(r.Clients), fmt.Sprintf("%g", r.Rate)}
					for _, x := range r.Share {
						line = append(line, fmt.Sprintf("%.1f%%", 100*x))
					}
					rows = append(rows, append(line, fmt.Sprintf("%.2f", r.MaxMean),
						secs(r.TTFTP50), secs(r.TTFTP90), secs(r.TTFTP99), fmt.Sprintf("%.0f", r.Throughput)))
				}
			}
		}
	}
	return rows
}

// shareNote says what the load-share table counts.
func shareNote(sc *fleetsim.Scenario, res []fleetsim.Result) string {
	var names []string
	for _, i := range unscraped(sc) {
		names = append(names, fmt.Sprintf("r%d", i))
	}
	return fmt.Sprintf("seed %d; calls each replica accepted in the window, of all; telemetry of %s reaches no client",
		res[0].Seed, strings.Join(names, ", "))
}
