package main

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/inferlb/inferlb/benchmarks/fleetsim"
)

func writeCSV(path string, res []fleetsim.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	// Adapter-slot columns only where a replica limits its adapters, so
	// the other scenarios' files keep their shape.
	lora := slices.ContainsFunc(res, func(r fleetsim.Result) bool { return r.LoRA != nil })
	hdr := []string{"scenario", "policy", "rate", "clients", "seed", "requests", "completed", "failed", "unfinished", "retries",
		"throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
		"e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "cache_hit_rate", "gpu_busy", "max_mean_load", "preemptions", "not_served",
		"healthy_requests", "healthy_failed", "healthy_throughput_tok_s", "healthy_ttft_p99_s",
		"broken_requests", "broken_failed", "broken_throughput_tok_s",
		"trips", "ejections", "capped", "endpoint_failures", "model_failures", "model_failing_events",
		"too_long", "unauthorized", "abandoned"}
	if lora {
		hdr = append(hdr, "adapter_calls", "slot_waited", "slot_wait_mean_s", "slot_wait_p99_s", "slot_wait_total_s", "adapter_loads")
	}
	_ = w.Write(hdr)
	g := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	for _, r := range res {
		row := []string{r.Scenario, r.Policy, g(r.Rate), strconv.Itoa(r.Clients), strconv.FormatUint(r.Seed, 10),
			strconv.Itoa(r.Requests), strconv.Itoa(r.Completed), strconv.Itoa(r.Failed), strconv.Itoa(r.Unfinished), strconv.Itoa(r.Retries),
			g(r.Throughput), g(r.TTFTP50), g(r.TTFTP90), g(r.TTFTP99), g(r.ITLP50), g(r.ITLP99),
			g(r.E2EP50), g(r.E2EP90), g(r.E2EP99), g(r.CacheHit), g(r.GPUBusy), g(r.MaxMean), strconv.Itoa(r.Preemptions),
			strconv.Itoa(r.NotServed)}
		// Empty where the run has no split by model or no inferlb balancer.
		if h, b := r.Healthy, r.Broken; h != nil && b != nil {
			row = append(row, strconv.Itoa(h.Requests), strconv.Itoa(h.Failed), g(h.Throughput), g(h.TTFTP99),
				strconv.Itoa(b.Requests), strconv.Itoa(b.Failed), g(b.Throughput))
		} else {
			row = append(row, "", "", "", "", "", "", "")
		}
		if b := r.Balancer; b != nil {
			u := func(n uint64) string { return strconv.FormatUint(n, 10) }
			row = append(row, u(b.Trips), u(b.Ejections), u(b.Capped), u(b.Failures), u(b.ModelFailures), u(b.ModelFailing))
		} else {
			row = append(row, "", "", "", "", "", "")
		}
		// What the text tables show of the failed calls: attempts refused
		// as over the context window or answered 401, calls given up on.
		row = append(row, strconv.Itoa(r.TooLong), strconv.Itoa(r.Unauthorized), strconv.Itoa(r.Abandoned))
		if l := r.LoRA; lora && l != nil {
			loads := make([]string, len(l.Loads))
			for i, n := range l.Loads {
				loads[i] = strconv.Itoa(n)
			}
			row = append(row, strconv.Itoa(l.AdapterCalls), strconv.Itoa(l.SlotWaited), g(l.SlotWaitMean), g(l.SlotWaitP99),
				g(l.SlotWaitTotal), strings.Join(loads, " "))
		} else if lora {
			row = append(row, "", "", "", "", "", "")
		}
		_ = w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeCharts draws p90 TTFT and throughput against offered load, one line
// per policy, for scenarios that sweep more than one load.
func writeCharts(dir string, sc *fleetsim.Scenario, res []fleetsim.Result) error {
	if len(sc.Rates) < 2 {
		return nil
	}
	for _, c := range clientCounts(res) {
		suffix := ""
		if len(clientCounts(res)) > 1 {
			suffix = fmt.Sprintf("-%dclients", c)
		}
		charts := []struct {
			file, title, y string
			log            bool
			val            func(fleetsim.Result) float64
		}{
			{"ttft-p90", "p90 time to first token", "seconds (log)", true, func(r fleetsim.Result) float64 { return r.TTFTP90 }},
			{"throughput", "output throughput", "tokens/s", false, func(r fleetsim.Result) float64 { return r.Throughput }},
		}
		for _, ch := range charts {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s: %s", sc.Name, ch.title)
			p.X.Label.Text = "offered load (" + sc.RateUnit + ")"
			p.Y.Label.Text = ch.y
			if ch.log {
				p.Y.Scale = plot.LogScale{}
				p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			}
			p.Legend.Top = true
			p.Legend.Left = true
			p.Add(plotter.NewGrid())
			for k, pol := range sc.Policies {
				var pts plotter.XYs
				for _, r := range res {
					if r.Policy == pol.Name && r.Clients == c {
						v := ch.val(r)
						if math.IsNaN(v) || (ch.log && v <= 0) {
							continue
						}
						if ch.log {
							v = max(v, 1e-3)
						}
						pts = append(pts, plotter.XY{X: r.Rate, Y: v})
					}
				}
				if len(pts) == 0 {
					continue
				}
				l, s, err := plotter.NewLinePoints(pts)
				if err != nil {
					return err
				}
				l.Color = plotutil.Color(k)
				l.Dashes = plotutil.Dashes(k / 7)
				l.Width = vg.Points(1.5)
				s.Color = l.Color
				s.Shape = plotutil.Shape(k)
				if pol.Name == "inferlb" {
					l.Width = vg.Points(3)
					l.Color = color.Black
					s.Color = l.Color
					s.Shape = draw.CircleGlyph{}
				}
				p.Add(l, s)
				p.Legend.Add(pol.Name, l, s)
			}
			path := filepath.Join(dir, fmt.Sprintf("%s-%s%s.png", sc.Name, ch.file, suffix))
			if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
				return err
			}
		}
	}
	return nil
}
