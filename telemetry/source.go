package telemetry

import (
	"context"
	"errors"
)

// ErrPartial marks a result that holds only part of its input: a parser
// skipped what it could not read and returned the rest. Callers test it with
// errors.Is and may keep the partial result, since telemetry is advisory and
// a half-read exposition still says more than none.
var ErrPartial = errors.New("telemetry: partial result")

// Observation is one Sample attributed to one endpoint.
type Observation struct {
	EndpointID string
	Sample     Sample
}

// Source produces samples for the endpoints it knows about. Collect does one
// round of I/O (a scrape, a query) and returns what it observed; it must
// honour ctx's deadline. A Source may return observations together with an
// error wrapping ErrPartial. Sources stamp Sample.Time with the observation
// time; a Poller fills in its own clock's time for samples left at zero.
//
// A Source is called by one goroutine at a time (a Poller never overlaps
// rounds), so implementations need no locking of their own for that.
//
// A Source that is also a Validator (the dcgm, modelserver and promapi
// sources are) has its configuration checked by NewPoller, so a mistake
// fails when the Poller is built, naming the field, instead of at every
// round once it runs.
type Source interface {
	Collect(ctx context.Context) ([]Observation, error)
}

// Validator is implemented by a Source whose configuration can be checked
// before any I/O. Validate returns an error naming the field at fault.
type Validator interface {
	Validate() error
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context) ([]Observation, error)

// Collect calls f.
func (f SourceFunc) Collect(ctx context.Context) ([]Observation, error) { return f(ctx) }

var _ Source = SourceFunc(nil)
