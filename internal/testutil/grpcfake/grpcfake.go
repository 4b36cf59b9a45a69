// Package grpcfake is a fake grpc-go balancer.ClientConn for driving load
// balancing policies without a network: a test or benchmark builds a policy
// on a ClientConn, pushes resolver state, moves the SubConns the policy
// created through connectivity states, and calls the published picker. It is
// for tests only.
//
// State changes are delivered synchronously on the caller's goroutine, never
// from inside a policy callback (a real channel delivers them through a
// serializer, and policies such as pickfirst hold their lock while they call
// out), so call SetState and ConnectAll from the test goroutine only.
package grpcfake

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	estats "google.golang.org/grpc/experimental/stats"
	"google.golang.org/grpc/resolver"
)

// ClientConn records what a policy asks of its channel.
//
// Concurrency: mu guards every field; methods are safe for concurrent use.
type ClientConn struct {
	// Embedded so policies may call methods added to the interface later;
	// calling one that is not overridden panics, which flags the gap.
	balancer.ClientConn

	mu       sync.Mutex
	subConns []*SubConn
	state    balancer.State
	updates  int
	resolves int
}

// NewClientConn returns an empty ClientConn.
func NewClientConn() *ClientConn { return &ClientConn{} }

// NewSubConn implements balancer.ClientConn.
func (cc *ClientConn) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("grpcfake: NewSubConn with no address")
	}
	sc := &SubConn{cc: cc, addrs: addrs, listener: opts.StateListener, state: connectivity.Idle}
	cc.mu.Lock()
	cc.subConns = append(cc.subConns, sc)
	cc.mu.Unlock()
	return sc, nil
}

// RemoveSubConn implements balancer.ClientConn.
func (cc *ClientConn) RemoveSubConn(sc balancer.SubConn) { sc.Shutdown() }

// UpdateAddresses implements balancer.ClientConn.
func (cc *ClientConn) UpdateAddresses(sc balancer.SubConn, addrs []resolver.Address) {
	//lint:ignore SA1019 the fake implements the deprecated ClientConn method it must have
	sc.UpdateAddresses(addrs)
}

// UpdateState implements balancer.ClientConn: it records the policy's state.
func (cc *ClientConn) UpdateState(s balancer.State) {
	cc.mu.Lock()
	cc.state = s
	cc.updates++
	cc.mu.Unlock()
}

// ResolveNow implements balancer.ClientConn; it counts the calls.
func (cc *ClientConn) ResolveNow(resolver.ResolveNowOptions) {
	cc.mu.Lock()
	cc.resolves++
	cc.mu.Unlock()
}

// Target implements balancer.ClientConn.
func (cc *ClientConn) Target() string { return "fake:///test" }

// MetricsRecorder implements balancer.ClientConn with a recorder that drops everything.
func (cc *ClientConn) MetricsRecorder() estats.MetricsRecorder { return noopRecorder{} }

// State returns the last state the policy published.
func (cc *ClientConn) State() balancer.State {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.state
}

// Updates returns how many times the policy published a state.
func (cc *ClientConn) Updates() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.updates
}

// SubConns returns the SubConns created so far, shut down or not.
func (cc *ClientConn) SubConns() []*SubConn {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return append([]*SubConn(nil), cc.subConns...)
}

// ConnectAll moves every SubConn that was asked to connect, is not shut down
// and is not READY through CONNECTING to READY (reporting a healthy health
// state too when the policy registered a health listener). It returns how
// many it moved; call it until it returns 0 to settle cascades.
func (cc *ClientConn) ConnectAll() int {
	n := 0
	for _, sc := range cc.SubConns() {
		sc.mu.Lock()
		pending := sc.connect && !sc.shutdown && sc.state != connectivity.Ready
		sc.mu.Unlock()
		if !pending {
			continue
		}
		sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
		sc.SetState(balancer.SubConnState{ConnectivityState: connectivity.Ready})
		n++
	}
	return n
}

// SubConn is a fake balancer.SubConn.
//
// Concurrency: cc and addrs are immutable; mu guards the rest.
type SubConn struct {
	balancer.SubConn // see ClientConn

	cc    *ClientConn
	addrs []resolver.Address

	mu       sync.Mutex
	listener func(balancer.SubConnState)
	health   func(balancer.SubConnState)
	state    connectivity.State
	connect  bool
	shutdown bool
}

// Addr returns the SubConn's first address.
func (sc *SubConn) Addr() string { return sc.addrs[0].Addr }

// IsReady reports whether the SubConn's last state was READY.
func (sc *SubConn) IsReady() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.state == connectivity.Ready && !sc.shutdown
}

// IsShutdown reports whether the policy shut the SubConn down.
func (sc *SubConn) IsShutdown() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.shutdown
}

// String names the SubConn by its address.
func (sc *SubConn) String() string { return "fake-subconn(" + sc.Addr() + ")" }

// UpdateAddresses implements balancer.SubConn.
func (sc *SubConn) UpdateAddresses(addrs []resolver.Address) {
	sc.mu.Lock()
	sc.addrs = addrs
	sc.mu.Unlock()
}

// Connect implements balancer.SubConn: it records the request; ConnectAll
// or SetState completes it.
func (sc *SubConn) Connect() {
	sc.mu.Lock()
	sc.connect = true
	sc.mu.Unlock()
}

// Shutdown implements balancer.SubConn. It only records the shutdown: a
// real channel reports SHUTDOWN later, from its serializer, and policies
// call Shutdown with their lock held, so reporting it here would deadlock.
func (sc *SubConn) Shutdown() {
	sc.mu.Lock()
	sc.shutdown = true
	sc.mu.Unlock()
}

// RegisterHealthListener implements balancer.SubConn. The listener hears
// READY right after the connectivity update that registered it.
func (sc *SubConn) RegisterHealthListener(f func(balancer.SubConnState)) {
	sc.mu.Lock()
	sc.health = f
	sc.mu.Unlock()
}

// GetOrBuildProducer implements balancer.SubConn. Producers (ORCA
// out-of-band reports, health checks) need a real connection; the fake has none.
func (sc *SubConn) GetOrBuildProducer(balancer.ProducerBuilder) (balancer.Producer, func()) {
	panic("grpcfake: producers are not supported")
}

// SetState delivers a connectivity update to the policy. For READY, a
// health listener registered while handling it then hears READY too, as
// gRPC's generic health producer reports when no health check is configured.
func (sc *SubConn) SetState(s balancer.SubConnState) {
	sc.mu.Lock()
	if sc.shutdown {
		sc.mu.Unlock()
		return
	}
	sc.state = s.ConnectivityState
	sc.health = nil // a listener is registered anew on each READY
	sc.mu.Unlock()
	sc.deliver(s)
	if s.ConnectivityState != connectivity.Ready {
		return
	}
	sc.mu.Lock()
	h := sc.health
	sc.mu.Unlock()
	if h != nil {
		h(balancer.SubConnState{ConnectivityState: connectivity.Ready})
	}
}

func (sc *SubConn) deliver(s balancer.SubConnState) {
	sc.mu.Lock()
	l := sc.listener
	sc.mu.Unlock()
	if l != nil {
		l(s)
	}
}

// noopRecorder drops every metric.
type noopRecorder struct {
	estats.MetricsRecorder // see ClientConn
}

func (noopRecorder) RecordInt64Count(*estats.Int64CountHandle, int64, ...string)             {}
func (noopRecorder) RecordFloat64Count(*estats.Float64CountHandle, float64, ...string)       {}
func (noopRecorder) RecordInt64Histo(*estats.Int64HistoHandle, int64, ...string)             {}
func (noopRecorder) RecordFloat64Histo(*estats.Float64HistoHandle, float64, ...string)       {}
func (noopRecorder) RecordInt64Gauge(*estats.Int64GaugeHandle, int64, ...string)             {}
func (noopRecorder) RecordInt64UpDownCount(*estats.Int64UpDownCountHandle, int64, ...string) {}
func (noopRecorder) RegisterAsyncReporter(estats.AsyncMetricReporter, ...estats.AsyncMetric) func() {
	return func() {}
}

// DropShutdown forgets the SubConns the policy has shut down, so that a
// churn test's fake does not itself hold every SubConn ever made (and,
// through their listeners, the policy state they reach). It returns how
// many it dropped.
func (cc *ClientConn) DropShutdown() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	live := cc.subConns[:0]
	for _, sc := range cc.subConns {
		if !sc.IsShutdown() {
			live = append(live, sc)
		}
	}
	n := len(cc.subConns) - len(live)
	clear(cc.subConns[len(live):])
	cc.subConns = live
	return n
}
