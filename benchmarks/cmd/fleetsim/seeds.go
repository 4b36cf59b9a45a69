package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

// maxSeeds is the most -seeds: each seed is one more run of every policy
// at every offered load.
const maxSeeds = 50

// writeSpread prints, when res holds more than one seed, each policy's
// figures at the headline load across the seeds: the median and, in
// brackets, the least and the most, then in how many seeds the policy had
// the lowest p90 TTFT of the table (the oracle aside). One seed's table cannot say whether a
// gap between two policies is more than the seed's luck; this can.
func writeSpread(w io.Writer, sc *fleetsim.Scenario, res []fleetsim.Result) {
	for _, c := range clientCounts(res) {
		head := pick(res, func(r fleetsim.Result) bool { return r.Rate == sc.Headline && r.Clients == c })
		var seeds []uint64
		for _, r := range head {
			if !slices.Contains(seeds, r.Seed) {
				seeds = append(seeds, r.Seed)
			}
		}
		if len(seeds) < 2 {
			continue
		}
		// The policy with the lowest p90 TTFT in each seed (the first
		// listed on a tie), the oracle aside: it sees what no client can.
		best := map[string]int{}
		for _, s := range seeds {
			var win *fleetsim.Result
			for i, r := range head {
				if r.Seed == s && r.Completed > 0 && r.Policy != "oracle" && (win == nil || r.TTFTP90 < win.TTFTP90) {
					win = &head[i]
				}
			}
			if win != nil {
				best[win.Policy]++
			}
		}
		fmt.Fprintf(w, "\nacross %d seeds (%d-%d) at %g %s, %d client(s): median [least..most]\n",
			len(seeds), slices.Min(seeds), slices.Max(seeds), sc.Headline, sc.RateUnit, c)
		rows := [][]string{{"policy", "tok/s", "TTFT p50", "p90", "p99", "cache hit", "failed", "best p90 (no oracle)"}}
		for _, p := range sc.Policies {
			runs := pick(head, func(r fleetsim.Result) bool { return r.Policy == p.Name })
			if len(runs) == 0 {
				continue
			}
			stat := func(f func(fleetsim.Result) float64, format func(float64) string) string {
				v := make([]float64, len(runs))
				for i, r := range runs {
					v[i] = f(r)
				}
				slices.Sort(v)
				return fmt.Sprintf("%s [%s..%s]", format(median(v)), format(v[0]), format(v[len(v)-1]))
			}
			tok := func(x float64) string { return fmt.Sprintf("%.0f", x) }
			pct := func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
			rows = append(rows, []string{p.Name,
				stat(func(r fleetsim.Result) float64 { return r.Throughput }, tok),
				stat(func(r fleetsim.Result) float64 { return r.TTFTP50 }, secs),
				stat(func(r fleetsim.Result) float64 { return r.TTFTP90 }, secs),
				stat(func(r fleetsim.Result) float64 { return r.TTFTP99 }, secs),
				stat(func(r fleetsim.Result) float64 { return r.CacheHit }, pct),
				stat(func(r fleetsim.Result) float64 { return float64(r.Failed) }, tok),
				fmt.Sprintf("%d of %d", best[p.Name], len(seeds)),
			})
		}
		writeAligned(w, rows)
	}
}

// median of sorted v (not empty): the mean of the middle two for an even
// count.
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
