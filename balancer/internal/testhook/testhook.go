// Package testhook lets the tests of the balancer's adapters (grpcbalancer,
// httpbalancer) wait for what a Balancer does on another goroutine without
// polling it: grpc-go ends a call, and so calls its Pick's Done, on a
// goroutine of its own when the call's context ends. It is internal, so
// nothing outside the balancer's packages can reach it, and nothing in
// production sets it.
package testhook

// SetOnDone, set by package balancer, installs f on b (a
// *balancer.Balancer) to be called at the end of every Pick.Done that has
// an effect, with the endpoint's ID, once the endpoint's counts (in
// flight, successes, ...) include the call's end; nil removes it. f runs
// on Done's goroutine, after Done's own work and holding none of the
// Balancer's locks (so it may read Stats); it must not block.
var SetOnDone func(b any, f func(endpointID string))
