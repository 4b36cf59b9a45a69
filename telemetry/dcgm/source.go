package dcgm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Target is one dcgm-exporter to scrape.
type Target struct {
	URL string // its metrics URL, e.g. http://10.0.1.7:9400/metrics
	// Map assigns the GPUs this exporter reports to the endpoint IDs the
	// balancer knows them by; nil means Source.Map.
	Map Mapping
}

// Static returns a Targets function for a fixed list.
func Static(targets ...Target) func() []Target {
	return func() []Target { return targets }
}

// DefaultParallelism bounds concurrent scrapes per Collect.
const DefaultParallelism = 8

// Source scrapes dcgm-exporters (one per GPU node) and publishes, through
// each target's Mapping, one sample per endpoint with its worst GPU's
// figures.
//
// The zero Source has no targets. Fields must not change while Collect
// runs: to follow nodes joining and leaving (one dcgm-exporter DaemonSet pod
// per node), set Targets to a function that returns the current list, and
// give each target the Map of the endpoints on its node.
type Source struct {
	// Targets lists what to scrape; it is called once per Collect so the
	// list can follow membership. The list it returns must not be changed
	// afterwards: on a change, build a new one. A target removed while a
	// round runs is still scraped in that round, and its endpoints' samples
	// are returned with the rest (a Balancer drops those of endpoints that
	// have left and counts them as DroppedUnknown); the next round no longer
	// scrapes it.
	Targets func() []Target
	// URLs are exporters' metrics URLs scraped after Targets' list, each as
	// a Target with a nil Map (so through Map). It is a fixed list: it must
	// not change while Collect runs, so a list that follows membership
	// belongs in Targets.
	//
	// An exporter listed more than once (in Targets and URLs, or spelled
	// two ways: scheme and host case, a default port, an empty path, a
	// fragment) is scraped once per round, and its GPUs go through each
	// Mapping it was listed with.
	URLs []string
	// Map assigns GPUs to endpoint IDs for targets without a Map of their
	// own (and for URLs); required if there is such a target.
	Map Mapping
	// Client does the requests; nil means http.DefaultClient. Collect's
	// context bounds each round, so the client needs no timeout of its own.
	Client *http.Client
	// MaxBodyBytes bounds a response body; 0 means 16 MiB.
	MaxBodyBytes int64
	// Parallelism bounds concurrent scrapes; 0 means DefaultParallelism.
	// Under a deadline on Collect's context, a scrape with Parallelism or
	// more targets still queued behind it gets at most half the time left,
	// so scrapes that hang (a node gone down) cannot hold every slot until
	// the round is over and fail the targets queued behind them.
	Parallelism int
}

var (
	_ telemetry.Source    = (*Source)(nil)
	_ telemetry.Validator = (*Source)(nil)
)

// Validate checks the configuration and the targets Targets returns now
// (telemetry.Validator): NewPoller calls it. Every Collect checks the
// configuration again; a bad URL it meets then fails alone, as its scrape
// would, and a target without a Mapping fails the round.
func (s *Source) Validate() error {
	if err := s.validateConfig(); err != nil {
		return err
	}
	for i, u := range s.URLs {
		if err := promtext.CheckURL(u); err != nil {
			return fmt.Errorf("dcgm: Source.URLs[%d]: %w", i, err)
		}
	}
	if s.Targets == nil {
		return nil
	}
	for i, t := range s.Targets() {
		if err := promtext.CheckURL(t.URL); err != nil {
			return fmt.Errorf("dcgm: target %d: %w", i, err)
		}
		if t.Map == nil && s.Map == nil {
			return fmt.Errorf("dcgm: Source.Map is nil and target %d (%q) has no Map: no way to map its GPUs to endpoints", i, promtext.Redacted(t.URL))
		}
	}
	return nil
}

func (s *Source) validateConfig() error {
	if err := promtext.CheckLimits("dcgm", s.Parallelism, s.MaxBodyBytes); err != nil {
		return err
	}
	switch {
	case len(s.URLs) > 0 && s.Map == nil:
		return errors.New("dcgm: Source.Map is nil and Source.URLs lists exporters: no way to map their GPUs to endpoints")
	}
	for i, u := range s.URLs {
		if strings.TrimSpace(u) == "" {
			return fmt.Errorf("dcgm: Source.URLs[%d] is empty", i)
		}
	}
	return nil
}

// Collect scrapes every target, parses each exposition, and aggregates all
// GPUs through their targets' Mappings, so an endpoint whose GPUs span nodes
// (and so targets: list it in each one's Map) still takes its worst one; in
// a round where one of those exporters fails, it reads its GPUs on the
// others (the error says which failed).
// Sample times are left zero for the Poller to stamp, except where every
// value read for an endpoint's GPUs carries a timestamp (a federation
// endpoint, a caching sidecar): then the oldest of them (the Poller reads
// one ahead of its clock as now). A time older than a Store's maximum age
// makes the sample stale, so it is ignored. If some exporters fail
// (or return partial expositions) the error wraps telemetry.ErrPartial and
// names the URLs of up to three of each (`1 of 4 exporters failed
// ("http://10.0.0.7:9400/metrics"), 0 partial`) before the first failure's
// error; if all fail it does not wrap ErrPartial. A body served as OpenMetrics (a proxy in front of
// an exporter may answer it) without the "# EOF" line that ends every
// OpenMetrics exposition was cut short, perhaps at a line boundary where
// nothing else shows it: its exporter fails, and none of it is read, since
// the lines lost may be any GPU's. Under another Content-Type a body is
// read as it came: the text format has no end marker. A body that is a web
// page (HTML or XML: a login page behind a redirect, a proxy's own page)
// fails its exporter with an error that says so, naming the URL, the
// Content-Type and where a redirect led. A target without a
// Mapping (its own Map and Map both nil) is a configuration error, returned
// before any scrape.
func (s *Source) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	if err := s.validateConfig(); err != nil {
		return nil, err
	}
	var targets []Target
	if s.Targets != nil {
		targets = s.Targets()
	}
	if len(s.URLs) > 0 {
		// A new list, never an append to the one Targets returned, which
		// is the caller's (Static's is shared by every round).
		both := make([]Target, 0, len(targets)+len(s.URLs))
		both = append(both, targets...)
		for _, url := range s.URLs {
			both = append(both, Target{URL: url})
		}
		targets = both
	}
	// One scrape per exporter, with every Mapping it is listed with.
	type exporter struct {
		url    string
		maps   []Mapping
		shared bool // maps holds s.Map
	}
	var exporters []exporter
	at := make(map[string]int, len(targets))
	for _, t := range targets {
		m := t.Map
		if m == nil && s.Map == nil {
			return nil, fmt.Errorf("dcgm: Source.Map is nil and target %q has no Map: no way to map GPUs to endpoints", promtext.Redacted(t.URL))
		}
		k := promtext.URLKey(t.URL)
		i, ok := at[k]
		if !ok {
			i = len(exporters)
			at[k] = i
			exporters = append(exporters, exporter{url: t.URL})
		}
		e := &exporters[i]
		switch {
		case m != nil:
			e.maps = append(e.maps, m)
		case !e.shared:
			e.maps, e.shared = append(e.maps, s.Map), true
		}
	}
	par := s.Parallelism
	if par <= 0 {
		par = DefaultParallelism
	}
	type result struct {
		gpus []GPU
		err  error
	}
	results := make([]result, len(exporters))
	// Per-target failures are results, not errors that cancel the others.
	promtext.Each(ctx, len(exporters), par, func(ctx context.Context, i int) {
		e := exporters[i]
		body, err := promtext.Fetch(ctx, s.Client, e.url, s.MaxBodyBytes)
		// The round's error starts with "dcgm: " (and "telemetry: partial
		// result: " when some exporters answered): an exporter's does not
		// repeat them.
		if err != nil {
			results[i].err = fmt.Errorf("scrape: %w", err)
			return
		}
		gpus, err := parseBytes(body)
		if err != nil {
			err = fmt.Errorf("%s: %w", promtext.Redacted(e.url), promtext.Trimmed(err, telemetry.ErrPartial.Error()+": ", "dcgm: "))
		}
		results[i] = result{gpus: gpus, err: err}
	})
	var all []GPU
	var mapOf []Mapping // mapOf[j] maps all[j]: its target's Mapping
	var first error
	var failed, partial promtext.Names
	gpus := 0
	for i, r := range results {
		gpus += len(r.gpus)
		for _, m := range exporters[i].maps {
			// Through each Mapping: the worst-GPU fold makes a GPU seen
			// twice by one endpoint count once.
			all = append(all, r.gpus...)
			for range r.gpus {
				mapOf = append(mapOf, m)
			}
		}
		switch {
		case r.err == nil:
			continue
		case len(r.gpus) > 0:
			partial.Add(promtext.Redacted(exporters[i].url))
		default:
			failed.Add(promtext.Redacted(exporters[i].url))
		}
		if first == nil {
			first = r.err
		}
	}
	obs := aggregate(all, func(j int) Mapping { return mapOf[j] })
	switch {
	case first == nil:
		return obs, nil
	case gpus == 0:
		return nil, fmt.Errorf("dcgm: all %d exporters failed; first: %w", len(exporters), first)
	}
	return obs, fmt.Errorf("%w: dcgm: %d of %d exporters failed%s, %d partial%s; first: %w",
		telemetry.ErrPartial, failed.Len(), len(exporters), failed.Bracketed(), partial.Len(), partial.Bracketed(), first)
}
