// Package testhook lets the tests of the balancer's adapters (grpcbalancer,
// httpbalancer) wait for what a Balancer does on another goroutine without
// polling it: grpc-go ends a call, and so calls its Pick's Done, on a
// goroutine of its own when the call's context ends, and reports a
// connection READY, or an out-of-band load report, on goroutines of its
// own too. And the balancer's own tests count the work a pick does where
// a clock would only time it on a shared, noisy machine (SetTenantLooks,
// SetFitCounts).
// It is internal, so nothing outside the balancer's packages can reach
// it, and nothing in production sets it.
package testhook

import (
	"context"
	"sync/atomic"
)

// SetOnDone, set by package balancer, installs f on b (a
// *balancer.Balancer) to be called at the end of every Pick.Done that has
// an effect, with the endpoint's ID, once the endpoint's counts (in
// flight, successes, ...) include the call's end; nil removes it. f runs
// on Done's goroutine, after Done's own work and holding none of the
// Balancer's locks (so it may read Stats); it must not block.
var SetOnDone func(b any, f func(endpointID string))

// SetOnChange, set by package balancer, installs f on b (a
// *balancer.Balancer) to be called after every SetReady or SetReconnected
// of one of its endpoints, by any of its Memberships, changed or not, and
// after every Publish, with the endpoint's ID, once Stats and the
// telemetry Store show the change; nil removes it. grpcbalancer marks an
// endpoint ready, and publishes its out-of-band ORCA reports, on gRPC's
// goroutines. f holds none of the Balancer's locks; it must not block.
var SetOnChange func(b any, f func(endpointID string))

// SetTenantLooks, set by package balancer, makes b (a *balancer.Balancer)
// add to n each look its memory of the tenants' refusals
// (tenantrefusal.go) takes at a member of a group or at a slot of marked
// pairs, on a pick or a Done: the work that grows with the pool when a
// tenant's pick looks at each member, counted so that a test can bound it
// per pick without timing it. Call it once, before b's first call that
// names a tenant and ends in a client error: the memory, allocated then,
// takes n from b, and it panics once the memory is allocated.
var SetTenantLooks func(b any, n *atomic.Int64)

// FitCounts counts the fit views (the group's load without the members a
// filtered keyed pick passes over) that b's picks read, and those of them
// that found no cached view for their filter and summed the group's
// members anew, at a cost that grows with the group.
type FitCounts struct {
	Reads, Sums atomic.Int64
}

// SetFitCounts, set by package balancer, makes b (a *balancer.Balancer)
// count in n each fit view its picks read, and each one summed anew, so
// that a benchmark or test can tell the cache's hits from its misses
// without timing them; nil stops it. Set it before b's picks that read
// fit views.
var SetFitCounts func(b any, n *FitCounts)

// Await calls cond, and again after each Done, SetReady, SetReconnected
// or Publish on b (a *balancer.Balancer), until it reports true, and
// returns nil; or ctx's error once ctx ends first. Only those wake it, so
// cond must turn true by one of them (a call leaving flight, an endpoint
// turning ready, a load report arriving). It holds b's hooks while it
// waits: one Await (or SetOnDone, SetOnChange) per Balancer at a time.
func Await(ctx context.Context, b any, cond func() bool) error {
	// A Done or change after the hooks are in place wakes the loop; one
	// before them is in what cond reads next. The buffer of one keeps a
	// wake-up that comes between cond and the wait.
	wake := make(chan struct{}, 1)
	notify := func(string) {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	SetOnDone(b, notify)
	defer SetOnDone(b, nil)
	SetOnChange(b, notify)
	defer SetOnChange(b, nil)
	for !cond() {
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
