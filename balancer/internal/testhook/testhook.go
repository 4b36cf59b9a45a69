// Package testhook lets the tests of the balancer's adapters (grpcbalancer,
// httpbalancer) wait for what a Balancer does on another goroutine without
// polling it: grpc-go ends a call, and so calls its Pick's Done, on a
// goroutine of its own when the call's context ends. It is internal, so
// nothing outside the balancer's packages can reach it, and nothing in
// production sets it.
package testhook

import "context"

// SetOnDone, set by package balancer, installs f on b (a
// *balancer.Balancer) to be called at the end of every Pick.Done that has
// an effect, with the endpoint's ID, once the endpoint's counts (in
// flight, successes, ...) include the call's end; nil removes it. f runs
// on Done's goroutine, after Done's own work and holding none of the
// Balancer's locks (so it may read Stats); it must not block.
var SetOnDone func(b any, f func(endpointID string))

// Await calls cond, and again after each Done on b (a *balancer.Balancer),
// until it reports true, and returns nil; or ctx's error once ctx ends
// first. Only a Done wakes it, so cond must turn true by a Done (a call
// leaving flight, say). It holds b's hook while it waits: one Await (or
// SetOnDone) per Balancer at a time.
func Await(ctx context.Context, b any, cond func() bool) error {
	// A Done after the hook is in place wakes the loop; one before it is
	// in what cond reads next. The buffer of one keeps a wake-up that
	// comes between cond and the wait.
	wake := make(chan struct{}, 1)
	SetOnDone(b, func(string) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	defer SetOnDone(b, nil)
	for !cond() {
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
