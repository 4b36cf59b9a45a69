// Command fleetsim compares load-balancing policies on a simulated GPU
// inference fleet, routing with inferlb's real Balancer in virtual time.
//
//	go run ./benchmarks/cmd/fleetsim -scenario shared-prefix [-quick] [-json] [-out DIR] [-seed N] [-clients N]
//	                                 [-policies NAME,NAME] [-parallel N]
//	go run ./benchmarks/cmd/fleetsim -list
//
// It prints a table per scenario (the headline offered load in full, then a
// sweep of throughput and p90 TTFT over every offered load), and with -out
// writes NAME.csv, NAME.md and PNG charts of latency and throughput versus
// offered load. With -json it prints one JSON array of every run instead.
// -policies keeps only the named policies (as the tables name them, e.g.
// "inferlb -affinity"); -parallel sets how many runs are simulated at once
// (default GOMAXPROCS), which changes no figure.
// The same seed gives the same output, byte for byte.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

func main() {
	var (
		name    = flag.String("scenario", "shared-prefix", "scenario to run, or \"all\"")
		quick   = flag.Bool("quick", false, "shorter runs at the headline rate only (seconds)")
		asJSON  = flag.Bool("json", false, "print one JSON array of results instead of tables")
		out     = flag.String("out", "", "directory for CSV, Markdown and PNG output")
		seed    = flag.Uint64("seed", 1, "random seed (same seed, same results)")
		clients = flag.Int("clients", 1, "independent client balancers sharing the fleet")
		only    = flag.String("policies", "", "comma-separated policy names to run (default all)")
		list    = flag.Bool("list", false, "list scenarios and exit")
		par     = flag.Int("parallel", runtime.GOMAXPROCS(0), "runs simulated at once")
		scrape  = flag.Duration("scrape", 0, "telemetry scrape interval instead of the scenario's (1s), e.g. 15s as a Prometheus-paced poller")
	)
	flag.Parse()
	if *list {
		for _, sc := range fleetsim.Scenarios() {
			fmt.Printf("%-14s %s\n", sc.Name, sc.Description)
		}
		return
	}
	var scs []*fleetsim.Scenario
	if *name == "all" {
		scs = fleetsim.Scenarios()
	} else if sc := fleetsim.Lookup(*name); sc != nil {
		scs = []*fleetsim.Scenario{sc}
	} else {
		fmt.Fprintf(os.Stderr, "fleetsim: unknown scenario %q; -list shows them\n", *name)
		os.Exit(2)
	}
	var all []fleetsim.Result
	for _, sc := range scs {
		if *quick {
			sc = sc.Quick()
		}
		if *only != "" {
			sc.Policies = filter(sc.Policies, strings.Split(*only, ","))
		}
		if *scrape < 0 {
			fmt.Fprintf(os.Stderr, "fleetsim: -scrape %v: must not be negative\n", *scrape)
			os.Exit(2)
		} else if *scrape > 0 {
			sc.Scrape = *scrape
		}
		start := time.Now()
		res := runScenario(sc, *seed, *clients, *par)
		all = append(all, res...)
		if !*asJSON {
			printScenario(os.Stdout, sc, res)
			fmt.Fprintf(os.Stderr, "fleetsim: %s: %d runs in %v\n", sc.Name, len(res), time.Since(start).Round(100*time.Millisecond))
		}
		if *out != "" {
			if err := writeOutputs(*out, sc, res); err != nil {
				fmt.Fprintln(os.Stderr, "fleetsim:", err)
				os.Exit(1)
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
	}
}

func filter(ps []fleetsim.Policy, names []string) []fleetsim.Policy {
	var out []fleetsim.Policy
	for _, p := range ps {
		for _, n := range names {
			if strings.TrimSpace(n) == p.Name {
				out = append(out, p)
			}
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
		for _, rate := range sc.Rates {
			for _, p := range sc.Policies {
				tasks = append(tasks, task{len(tasks), p, fleetsim.RunConfig{
					Rate: rate, Clients: c, Seed: seed,
					Warmup: sc.Warmup, Duration: sc.Duration, Drain: sc.Drain, Scrape: sc.Scrape,
				}})
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

func printScenario(w io.Writer, sc *fleetsim.Scenario, res []fleetsim.Result) {
	fmt.Fprintf(w, "== %s: %s\n", sc.Name, sc.Description)
	for _, c := range clientCounts(res) {
		head := pick(res, func(r fleetsim.Result) bool { return r.Rate == sc.Headline && r.Clients == c })
		if len(head) == 0 {
			continue
		}
		fmt.Fprintf(w, "\noffered load %g %s, %d client(s), seed %d\n", sc.Headline, sc.RateUnit, c, head[0].Seed)
		writeTable(w, head)
	}
	if len(sc.Rates) > 1 {
		fmt.Fprintf(w, "\nsweep: output tokens/s | p90 TTFT (s) by offered load (%s)\n", sc.RateUnit)
		writeSweep(w, sc, res)
	}
	fmt.Fprintln(w)
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

var header = []string{"policy", "tok/s", "TTFT p50", "p90", "p99", "ITL p50", "p99", "E2E p50", "p99", "cache hit", "GPU busy", "max/mean", "failed"}

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
	if s != s {
		return "-"
	}
	return fmt.Sprintf("%.0fms", 1000*s)
}

func writeTable(w io.Writer, res []fleetsim.Result) {
	rows := [][]string{header}
	for _, r := range res {
		rows = append(rows, row(r))
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
	return writeCharts(dir, sc, res)
}

func writeMarkdown(path string, sc *fleetsim.Scenario, res []fleetsim.Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", sc.Description)
	for _, c := range clientCounts(res) {
		head := pick(res, func(r fleetsim.Result) bool { return r.Rate == sc.Headline && r.Clients == c })
		if len(head) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nOffered load %g %s, %d client(s), seed %d:\n\n", sc.Headline, sc.RateUnit, c, head[0].Seed)
		fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
		for _, r := range head {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row(r), " | "))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
