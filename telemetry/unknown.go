package telemetry

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// KnownSink is a Sink that keeps samples only for the endpoints it knows,
// and says which those are. A balancer.Balancer is one: it knows its
// endpoints by Endpoint.Key (the ID, else the Addr exactly as given, scheme
// included) and drops samples for any other ID (StoreStats.DroppedUnknown).
// A Poller publishing into a KnownSink asks Known of each sample's ID after
// Publish, and reports a round's unknown IDs through PollerOptions.OnError
// (UnknownEndpointsError). A Sink that wraps a Balancer by embedding it (to
// see what is published) is one too, and its own Publish is still the one
// called.
//
// A KnownSink that also has a Closed() bool method reporting true (a
// Balancer after Close) drops every sample; the Poller then says the Sink
// is closed (UnknownEndpointsError.SinkClosed) instead of naming the IDs
// as misnamed.
type KnownSink interface {
	Sink
	// Known reports whether the Sink keeps samples for endpointID. A
	// Poller calls it for every sample it publishes: it must not allocate
	// or block.
	Known(endpointID string) bool
	// KnownIDs returns up to n of the endpoint IDs the Sink knows, in a
	// stable order, for an error message. It is called only after a round
	// with unknown IDs, and may allocate and lock.
	KnownIDs(n int) []string
}

// ErrUnknownEndpoint is what errors.Is matches in the error a Poller reports
// (an *UnknownEndpointsError) when its Sink dropped samples because it knows
// no endpoint by their ID: the Source names its targets otherwise than the
// Balancer names its endpoints (host:port against "http://host:port"), or
// an endpoint left while its scrape was in flight.
var ErrUnknownEndpoint = errors.New("telemetry: samples for unknown endpoint IDs")

// maxNamedIDs bounds how many unknown and known IDs an
// UnknownEndpointsError names: enough to see the mismatch, no more for a
// fleet of thousands.
const maxNamedIDs = 3

// UnknownEndpointsError is reported through PollerOptions.OnError when a
// round's samples were dropped by a KnownSink (a balancer.Balancer) as
// being for endpoint IDs it does not know. It does not fail the round: the
// Source answered, and the samples for known IDs were published.
// errors.Is(err, ErrUnknownEndpoint) matches it.
type UnknownEndpointsError struct {
	// Dropped counts the round's samples dropped as unknown, of Published
	// handed to the Sink.
	Dropped, Published int
	// IDs are the first distinct unknown IDs of the round (at most 3), in
	// the Source's order.
	IDs []string
	// Known are some IDs the Sink knows (at most 3; none when it knows
	// none), as KnownIDs returned them.
	Known []string
	// SinkClosed is set when the Sink reports itself closed (a
	// balancer.Balancer after Close, which knows no endpoint any more):
	// the Poller outlived what it publishes into, and the IDs are not
	// misnamed.
	SinkClosed bool

	moreIDs, moreKnown bool // there were more than IDs and Known name
}

// Error names the unknown IDs, a few known ones, and the fix.
func (e *UnknownEndpointsError) Error() string {
	if e.SinkClosed {
		return fmt.Sprintf("telemetry: %d of %d samples dropped: the Sink is closed; stop the Poller (end Run's context and wait for it to return) before closing the Balancer it publishes into", e.Dropped, e.Published)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "telemetry: %d of %d samples dropped: the Sink knows no endpoint ", e.Dropped, e.Published)
	quoteList(&b, e.IDs, e.moreIDs)
	if len(e.Known) == 0 {
		b.WriteString(" (it knows none)")
	} else {
		b.WriteString(" (it knows ")
		quoteList(&b, e.Known, e.moreKnown)
		b.WriteString(")")
	}
	b.WriteString("; name each target by its endpoint's Endpoint.Key: the Endpoint.ID, else the Addr exactly as given, scheme included")
	return b.String()
}

// Is reports whether target is ErrUnknownEndpoint.
func (e *UnknownEndpointsError) Is(target error) bool { return target == ErrUnknownEndpoint }

func quoteList(b *strings.Builder, ids []string, more bool) {
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(id))
	}
	if more {
		b.WriteString(", ...")
	}
}
