package modelserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// Target is one model server to scrape.
type Target struct {
	EndpointID string // the endpoint ID the balancer knows the server by
	URL        string // its metrics URL, e.g. http://10.0.0.5:8000/metrics
}

// Static returns a Targets function for a fixed list.
func Static(targets ...Target) func() []Target {
	return func() []Target { return targets }
}

// DefaultParallelism bounds concurrent scrapes per Collect.
const DefaultParallelism = 8

// Source scrapes each target's /metrics and parses it with ParseMetrics. It
// suits fleets small enough for every client to scrape every server; past
// that, query a Prometheus server once instead (package promapi).
//
// The zero Source has no targets. Fields must not change while Collect runs.
type Source struct {
	// Targets lists what to scrape; it is called once per Collect so the
	// list can follow membership. A URL listed twice (however spelled: case,
	// default port) is fetched once per round, and each of its targets gets
	// the sample. The list it returns must not be changed
	// afterwards: on a change, build a new one. A target removed while a
	// round runs is still scraped in that round, and its endpoint's sample
	// is returned with the rest (a Balancer drops those of endpoints that
	// have left and counts them as DroppedUnknown); the next round no longer
	// scrapes it.
	Targets func() []Target
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
// configuration again; a bad target it meets then fails alone, as its
// scrape would.
func (s *Source) Validate() error {
	if err := s.validateConfig(); err != nil {
		return err
	}
	if s.Targets == nil {
		return nil
	}
	for i, t := range s.Targets() {
		if t.EndpointID == "" {
			return fmt.Errorf("modelserver: target %d (%q): EndpointID is empty", i, promtext.Redacted(t.URL))
		}
		if err := promtext.CheckURL(t.URL); err != nil {
			return fmt.Errorf("modelserver: target %d (%q): %w", i, t.EndpointID, err)
		}
	}
	return nil
}

func (s *Source) validateConfig() error {
	return promtext.CheckLimits("modelserver", s.Parallelism, s.MaxBodyBytes)
}

// Collect scrapes every target concurrently and returns one observation per
// target that answered with a usable exposition (partial ones included, and
// counted in the error, so the Poller counts the round as partial).
// Sample times are left zero for the Poller to stamp, except where every
// sample read carries a timestamp (a federation endpoint, a caching
// sidecar): then the oldest of them (the Poller reads one ahead of its
// clock as now). A time older than a Store's maximum age makes the
// sample stale, so it is ignored. If some targets fail or are read in
// part the error wraps telemetry.ErrPartial, names the endpoints of up to
// three of each (`2 of 16 targets failed ("a", "b"), 0 partial`) and gives
// the first failure's error; if all fail it does not wrap ErrPartial. A body served as OpenMetrics (Content-Type
// application/openmetrics-text) without the "# EOF" line that ends every
// OpenMetrics exposition was cut short, perhaps at a line boundary where
// nothing else shows it: its target fails, and none of it is read, since
// the lines lost may be any metric's (a queue read as empty). Under another
// Content-Type a body is read as it came: the text format has no end marker.
// A body that is a web page (HTML or XML: a login page behind a redirect,
// a proxy's own page) fails its target with an error that says so, naming
// the URL, the Content-Type and where a redirect led.
func (s *Source) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	if err := s.validateConfig(); err != nil {
		return nil, err
	}
	if s.Targets == nil {
		return nil, nil
	}
	targets := s.Targets()
	par := s.Parallelism
	if par <= 0 {
		par = DefaultParallelism
	}
	type result struct {
		obs telemetry.Observation
		ok  bool
		err error
	}
	// A URL listed more than once (two spellings of one server, or
	// endpoints that share one server's metrics) is fetched once a round;
	// each target gets its own observation of it.
	firstOf := make([]int, len(targets)) // index of the first target with the same URL
	byKey := make(map[string]int, len(targets))
	for i, t := range targets {
		if t.EndpointID == "" {
			firstOf[i] = -1 // not scraped: its sample would name no endpoint
			continue
		}
		k := promtext.URLKey(t.URL)
		if j, ok := byKey[k]; ok {
			firstOf[i] = j
			continue
		}
		byKey[k] = i
		firstOf[i] = i
	}
	type scraped struct {
		sample telemetry.Sample
		err    error
	}
	fetched := make([]scraped, len(targets))
	var unique []int // the targets to fetch: the first of each URL
	for i := range targets {
		if firstOf[i] == i {
			unique = append(unique, i)
		}
	}
	// Per-target failures are results, not errors that cancel the others.
	promtext.Each(ctx, len(unique), par, func(ctx context.Context, j int) {
		i := unique[j]
		sample, err := s.scrape(ctx, targets[i])
		fetched[i] = scraped{sample, err}
	})
	results := make([]result, len(targets))
	for i, t := range targets {
		if firstOf[i] < 0 {
			results[i] = result{err: fmt.Errorf("target %d (%q): EndpointID is empty", i, promtext.Redacted(t.URL))}
			continue
		}
		f := fetched[firstOf[i]]
		err := f.err
		if err != nil {
			// The round's error starts with both prefixes already.
			err = fmt.Errorf("endpoint %q: %w", t.EndpointID, promtext.Trimmed(err, telemetry.ErrPartial.Error()+": ", "modelserver: "))
		}
		ok := err == nil || errors.Is(err, telemetry.ErrPartial)
		results[i] = result{obs: telemetry.Observation{EndpointID: t.EndpointID, Sample: f.sample}, ok: ok, err: err}
	}
	var obs []telemetry.Observation
	var firstFailed, firstPartial error
	var failed, partial promtext.Names
	for i, r := range results {
		switch {
		case r.ok && r.err == nil:
			obs = append(obs, r.obs)
		case r.ok: // usable, with lines or values skipped
			obs = append(obs, r.obs)
			partial.Add(targets[i].EndpointID)
			if firstPartial == nil {
				firstPartial = r.err
			}
		default:
			name := targets[i].EndpointID
			if name == "" { // a target that names no endpoint: its URL
				name = promtext.Redacted(targets[i].URL)
			}
			failed.Add(name)
			if firstFailed == nil {
				firstFailed = r.err
			}
		}
	}
	first := firstFailed // a failure says more than a partial
	if first == nil {
		first = firstPartial
	}
	switch {
	case first == nil:
		return obs, nil
	case len(obs) == 0:
		return nil, fmt.Errorf("modelserver: all %d targets failed; first: %w", len(targets), first)
	}
	return obs, fmt.Errorf("%w: modelserver: %d of %d targets failed%s, %d partial%s; first: %w",
		telemetry.ErrPartial, failed.Len(), len(targets), failed.Bracketed(), partial.Len(), partial.Bracketed(), first)
}

func (s *Source) scrape(ctx context.Context, t Target) (telemetry.Sample, error) {
	body, err := promtext.Fetch(ctx, s.Client, t.URL, s.MaxBodyBytes)
	if err != nil {
		return telemetry.Sample{}, fmt.Errorf("modelserver: scrape: %w", err)
	}
	res, err := parseBytes(body)
	return res.Sample, err
}
