package dcgm

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"golang.org/x/sync/errgroup"

	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/internal/promtext"
)

// DefaultParallelism bounds concurrent scrapes per Collect.
const DefaultParallelism = 8

// Source scrapes dcgm-exporters (one per GPU node) and publishes, through
// Map, one sample per endpoint with its worst GPU's figures.
//
// Fields must not change while Collect runs.
type Source struct {
	// URLs are the exporters' metrics URLs, e.g. http://node-1:9400/metrics.
	URLs []string
	// Map assigns GPUs to endpoint IDs; required.
	Map Mapping
	// Client does the requests; nil means http.DefaultClient. Collect's
	// context bounds each round.
	Client *http.Client
	// MaxBodyBytes bounds a response body; 0 means 16 MiB.
	MaxBodyBytes int64
	// Parallelism bounds concurrent scrapes; 0 means DefaultParallelism.
	Parallelism int
}

var _ telemetry.Source = (*Source)(nil)

// Collect scrapes every URL, parses each exposition, and aggregates all GPUs
// through Map, so an endpoint whose GPUs span nodes still takes its worst
// one. If some exporters fail (or return partial expositions) the error wraps
// telemetry.ErrPartial; if all fail it does not.
func (s *Source) Collect(ctx context.Context) ([]telemetry.Observation, error) {
	if s.Map == nil {
		return nil, errors.New("dcgm: Source.Map is nil: no way to map GPUs to endpoints")
	}
	par := s.Parallelism
	if par <= 0 {
		par = DefaultParallelism
	}
	type result struct {
		gpus []GPU
		err  error
	}
	results := make([]result, len(s.URLs))
	// Per-target failures are results, not errors that cancel the others,
	// so every function returns nil; the group only bounds concurrency.
	var g errgroup.Group
	g.SetLimit(par)
	for i, url := range s.URLs {
		g.Go(func() error {
			body, err := promtext.Fetch(ctx, s.Client, url, s.MaxBodyBytes)
			if err != nil {
				results[i].err = fmt.Errorf("dcgm: scrape: %w", err)
				return nil
			}
			gpus, err := parseBytes(body)
			if err != nil {
				err = fmt.Errorf("%s: %w", url, err)
			}
			results[i] = result{gpus: gpus, err: err}
			return nil
		})
	}
	_ = g.Wait()
	var all []GPU
	var first error
	failed, partial := 0, 0
	for _, r := range results {
		all = append(all, r.gpus...)
		switch {
		case r.err == nil:
			continue
		case len(r.gpus) > 0:
			partial++
		default:
			failed++
		}
		if first == nil {
			first = r.err
		}
	}
	obs := Aggregate(all, s.Map)
	switch {
	case first == nil:
		return obs, nil
	case len(all) == 0:
		return nil, fmt.Errorf("dcgm: all %d exporters failed; first: %w", len(s.URLs), first)
	}
	return obs, fmt.Errorf("%w: dcgm: %d of %d exporters failed, %d partial; first: %w", telemetry.ErrPartial, failed, len(s.URLs), partial, first)
}
