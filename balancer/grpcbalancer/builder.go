package grpcbalancer

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/telemetry"
)

// Name is the name the policy is registered under, for service configs:
// {"loadBalancingConfig":[{"inferlb":{}}]}.
const Name = "inferlb"

var logger = grpclog.Component("inferlb")

func init() {
	balancer.Register(&Builder{name: Name})
}

// Builder builds the inferlb policy for a gRPC channel. The one registered
// as Name gives every channel its own Balancer, configured by the service
// config's "balancer" section; NewBuilder makes one that routes with a
// Balancer the caller owns. A Builder is immutable and safe for concurrent use.
type Builder struct {
	name   string
	shared *core.Balancer // nil: each channel gets its own
}

var (
	_ balancer.Builder      = (*Builder)(nil)
	_ balancer.ConfigParser = (*Builder)(nil)
)

// NewBuilder returns a policy named name that routes with b, so a process
// can share one live view of load between its gRPC channels and its HTTP
// traffic (balancer/httpbalancer on the same b). Register it with
// google.golang.org/grpc/balancer.Register before dialing, and select it by
// name in the service config; its config may not carry a "balancer" section
// (b's options are fixed), and its "orca.interval", with "outOfBand" on,
// may be no longer than b.TelemetryMaxAge(). It panics if name is empty or
// b is nil.
//
// Each channel built with it takes its own membership in b (a
// balancer.Membership): the resolver's endpoints and which of them the channel
// has READY, so channels to different fleets, and an HTTP transport on the
// same b, never remove or hide each other's endpoints, while the endpoints
// they have in common (by ID) share one live state. Use WithEndpoint in the
// resolver, or the config's "endpoints" (or "idByHost") with the stock
// resolvers, to give endpoints the IDs the other transport uses; each
// transport still sends to its own address for an ID (this channel to its
// SubConns, an httpbalancer.Transport to the Addr it was given), so a
// replica's gRPC and HTTP ports can differ. Closing the channel closes its
// membership: its endpoints that nothing else lists leave b. A Balancer
// holds up to 63 memberships at once; a channel built past that fails its
// calls, wait-for-ready ones too, with UNAVAILABLE and
// balancer.ErrTooManyMemberships (errors.Is finds it), and its resolver
// updates with that error, until one of them finds a membership free (the
// DNS resolver resolves again, with backoff, after a failed update).
// b must outlive the channels that use it: once b is closed, their calls
// fail at once, wait-for-ready ones too, UNAVAILABLE with the message of
// balancer.ErrClosed.
func NewBuilder(name string, b *core.Balancer) *Builder {
	if name == "" || b == nil {
		panic("inferlb: grpcbalancer.NewBuilder needs a name and a Balancer")
	}
	return &Builder{name: name, shared: b}
}

// Name implements balancer.Builder.
func (bb *Builder) Name() string { return bb.name }

// ParseConfig implements balancer.ConfigParser. See the package
// documentation for the schema and defaults. Unlike grpc-go's own policies
// it rejects unknown fields: a misspelt tunable should fail loudly, not be
// silently ignored.
func (bb *Builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return parseConfig(js, bb.shared)
}

// Build implements balancer.Builder: endpointsharding over pickfirst
// children (gRFC A61), one child per resolver endpoint, with pickfirst's
// health listener on so a child reports READY only when healthy (when the
// service config asks for health checks: see Structure in the package doc).
func (bb *Builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	lb := &lbBalancer{
		ClientConn: cc,
		shared:     bb.shared,
		addrToID:   map[string]string{},
		subConns:   map[*subConn]struct{}{},
	}
	if bb.shared != nil {
		lb.core.Store(bb.shared)
		lb.mem, lb.memErr = bb.shared.NewMembership()
	}
	lb.child = endpointsharding.NewBalancer(lb, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	return lb
}

// lbBalancer is one channel's policy instance.
//
// Concurrency: gRPC serializes UpdateClientConnState, ResolverError,
// ExitIdle and Close. UpdateState comes from children, also while
// endpointsharding holds its own lock, and NewSubConn from pickfirst
// children inside our calls to child. Lock order: endpointsharding's
// locks, then mu, then the core Balancer's. mu is never held while calling
// into child, because a child may call UpdateState synchronously.
// ClientConn, child and shared are immutable after Build; memErr is
// written by Build and UpdateClientConnState only, which gRPC serializes;
// core is atomic so out-of-band listeners read it without mu; the rest is
// guarded by mu.
type lbBalancer struct {
	balancer.ClientConn // the channel; embedded to intercept UpdateState and NewSubConn

	child  balancer.Balancer // endpointsharding
	shared *core.Balancer    // from NewBuilder; nil when the policy owns its core

	core   atomic.Pointer[core.Balancer]
	memErr error // NewMembership's on a shared core: every call fails with it until one is free

	mu    sync.Mutex
	mem   *core.Membership // the channel's membership in core
	cfg   *lbConfig
	eps   []inferlb.Endpoint // membership last given to mem.Update
	ready map[string]bool    // endpoint IDs whose child is READY
	// conn names, by endpoint ID, the address (namingAddr) of the child
	// that is READY, or that left READY and has not been in
	// TRANSIENT_FAILURE since: its next READY is a reconnect to the same
	// process (SetReconnected), not a recovery that ramps.
	conn     map[string]string
	addrToID map[string]string // address -> endpoint ID, for SubConns
	// connected holds the IDs of the endpoints (of the resolver's last
	// update) that have had a READY SubConn in this channel: the next
	// READY of one is a reconnect (see subConn.onState).
	connected map[string]bool
	subConns  map[*subConn]struct{} // live SubConns, for ORCA OOB
	current   *picker               // the picker last published; nil while none is READY
	wake      *time.Timer           // armed by wakeLater; nil when not armed
	closed    bool

	waking atomic.Bool // a wake is armed or being armed: failing picks skip wakeLater

	// gen counts the membership changes, Close included, and the updates
	// in which an endpoint left or entered READY: a picker built before
	// the last one (gen differs from its own) may see the core refuse
	// every pick, or choose an endpoint it holds no child for, while the
	// next picker is on its way, and queues its calls for it. Written
	// under mu.
	gen atomic.Uint64
}

// UpdateClientConnState implements balancer.Balancer.
func (lb *lbBalancer) UpdateClientConnState(ccs balancer.ClientConnState) error {
	cfg, _ := ccs.BalancerConfig.(*lbConfig)
	if cfg == nil {
		// Selected without a config (or with another policy's): defaults.
		var err error
		if cfg, err = parseConfig(nil, lb.shared); err != nil {
			return err
		}
	}

	if lb.memErr != nil {
		// Another channel may have closed its membership since: take it.
		// Until then each update fails, and the DNS resolver resolves
		// again with backoff, which brings the next try.
		mem, err := lb.shared.NewMembership()
		lb.mu.Lock()
		if lb.closed {
			lb.mu.Unlock()
			if mem != nil {
				mem.Close()
			}
			return nil
		}
		lb.mem, lb.memErr = mem, err
		lb.mu.Unlock()
	}
	if lb.memErr != nil {
		lb.failNoMembership()
		return lb.memErr
	}
	if !hasAddress(ccs.ResolverState.Endpoints) {
		// No endpoints is a resolver error (grpc-go's pick_first and
		// endpointsharding would close every connection; see doc.go):
		// after a DNS answer without records for a moment, or any flap,
		// the channel keeps serving with its endpoints, connections and
		// live state, and gRPC re-resolves on ErrBadResolverState.
		lb.ResolverError(errNoAddresses)
		return balancer.ErrBadResolverState
	}
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return nil
	}
	oobChanged := lb.cfg == nil || lb.cfg.oob != cfg.oob || lb.cfg.oobInterval != cfg.oobInterval
	b := lb.core.Load()
	// An empty "balancer" section is no section: every tunable's zero value
	// is the core's default.
	if lb.shared == nil && (b == nil || lb.cfg.tunables != cfg.tunables) {
		// New tunables need a new Balancer: its options are fixed at New.
		// Live state starts over, which a config push rarely costs much.
		// The old one is closed: nothing routes with it once the next
		// picker is out, and a pick on the current picker that it
		// refuses waits for that picker. Calls it picked end normally.
		if b != nil {
			lb.gen.Add(1) // before Close: a pick it refuses must see it
			b.Close()
		}
		b = core.New(cfg.opts)
		lb.core.Store(b)
		lb.mem, _ = b.NewMembership() // the first of a fresh Balancer's 63
		lb.eps = nil
		lb.ready = nil
		lb.conn = nil
	}
	mem := lb.mem
	lb.cfg = cfg

	// An endpoint whose addresses another one before it already lists
	// (the same set, in any order) is left out, here and for the child:
	// endpointsharding keeps one child per address set, and which of the
	// two it kept would be its random choice, again at every update. With
	// two WithEndpoint IDs for one address, the READY endpoint then
	// changed from one ID to the other on unchanged updates (slow start
	// again, load counts left behind) and out-of-band reports went to the
	// ID not in use. The first listed counts, as the core keeps the first
	// of a repeated ID.
	resolverEps := ccs.ResolverState.Endpoints
	if len(resolverEps) > 1 {
		resolverEps = firstOfEachAddressSet(resolverEps)
	}
	eps := make([]inferlb.Endpoint, 0, len(resolverEps))
	addrToID := make(map[string]string, len(resolverEps))
	for _, ep := range resolverEps {
		e := endpointOf(ep, cfg)
		if e.ID == "" {
			continue
		}
		eps = append(eps, e)
		for _, a := range ep.Addresses {
			addrToID[a.Addr] = e.ID
		}
	}
	lb.addrToID = addrToID
	if len(lb.connected) > 0 {
		current := make(map[string]bool, len(eps))
		for _, e := range eps {
			current[e.ID] = true
		}
		for id := range lb.connected {
			if !current[id] {
				delete(lb.connected, id)
			}
		}
	}
	if lb.eps == nil || !sameEndpoints(lb.eps, eps) {
		// From here until the next picker is published, the current one
		// routes over endpoints whose children have not caught up: new
		// ones not ready yet, and perhaps none of its own left.
		lb.gen.Add(1)
		if err := mem.Update(eps); err != nil {
			logger.Warningf("inferlb: resolver update: %v", err)
		}
		// A Membership starts endpoints ready; a new endpoint here has no
		// connection yet. Mark it not ready before any picker can see it.
		for _, e := range eps {
			if !lb.ready[e.ID] {
				mem.SetReady(e.ID, false)
			}
		}
		lb.eps = eps
	}
	var subs []*subConn
	if oobChanged {
		for s := range lb.subConns {
			subs = append(subs, s)
		}
	}
	lb.mu.Unlock()

	for _, s := range subs {
		s.refresh()
	}
	rs := ccs.ResolverState
	rs.Endpoints = resolverEps
	// The child publishes its aggregated state synchronously at the end of
	// this call, which builds our picker with the new config.
	return lb.child.UpdateClientConnState(balancer.ClientConnState{
		ResolverState: pickfirst.EnableHealthListener(rs),
	})
}

// firstOfEachAddressSet returns eps without each endpoint whose set of
// addresses an earlier one has (endpointsharding's key for its children).
// It returns eps itself when nothing repeats.
func firstOfEachAddressSet(eps []resolver.Endpoint) []resolver.Endpoint {
	seen := resolver.NewEndpointMap[struct{}]()
	var kept []resolver.Endpoint
	for i, ep := range eps {
		if _, dup := seen.Get(ep); dup {
			if kept == nil {
				kept = append(make([]resolver.Endpoint, 0, len(eps)-1), eps[:i]...)
			}
			continue
		}
		seen.Set(ep, struct{}{})
		if kept != nil {
			kept = append(kept, ep)
		}
	}
	if kept == nil {
		return eps
	}
	return kept
}

// errNoAddresses is the resolver error an update without endpoints is
// taken for (grpc-go's pick_first words it so too).
var errNoAddresses = errors.New("produced zero addresses")

// hasAddress reports whether any of eps has an address.
func hasAddress(eps []resolver.Endpoint) bool {
	for _, ep := range eps {
		if len(ep.Addresses) > 0 {
			return true
		}
	}
	return false
}

// failNoMembership fails every call, wait-for-ready ones too, with memErr:
// a status error, or wait-for-ready calls would wait until their deadline
// for a picker that never comes. Called only by methods gRPC serializes.
func (lb *lbBalancer) failNoMembership() {
	lb.ClientConn.UpdateState(balancer.State{
		ConnectivityState: connectivity.TransientFailure,
		Picker:            base.NewErrPicker(statusError{codes.Unavailable, lb.memErr}),
	})
}

// ResolverError implements balancer.Balancer. With endpoints from an
// earlier update the children keep serving and the error is theirs to weigh
// (an update without endpoints comes here too, so they stay); with none,
// the channel fails calls with the resolver's error, which says
// more than endpointsharding's "no children to pick from". A channel
// without a membership keeps failing them with that reason, which the
// resolver's error would hide.
func (lb *lbBalancer) ResolverError(err error) {
	if lb.memErr != nil {
		lb.failNoMembership()
		return
	}
	lb.mu.Lock()
	empty, closed := len(lb.eps) == 0, lb.closed
	lb.mu.Unlock()
	if closed {
		return
	}
	if !empty {
		lb.child.ResolverError(err)
		return
	}
	lb.ClientConn.UpdateState(balancer.State{
		ConnectivityState: connectivity.TransientFailure,
		Picker:            base.NewErrPicker(fmt.Errorf("inferlb: name resolver error: %w", err)),
	})
}

// UpdateSubConnState implements balancer.Balancer; SubConns created through
// us use StateListener, so gRPC never calls it.
func (lb *lbBalancer) UpdateSubConnState(sc balancer.SubConn, st balancer.SubConnState) {
	logger.Errorf("inferlb: UpdateSubConnState(%v, %+v) called unexpectedly", sc, st)
}

// ExitIdle implements balancer.Balancer. gRPC calls it on every
// ClientConn.Connect, idle or not. Before any endpoint, or without a
// membership, there is no child to wake, and endpointsharding would
// publish its picker over none ("no children to pick from") in place of
// the one that fails calls with the reason (the resolver's error, or
// failNoMembership's status error, which ends wait-for-ready calls too).
func (lb *lbBalancer) ExitIdle() {
	if lb.memErr != nil {
		return
	}
	lb.mu.Lock()
	empty := len(lb.eps) == 0
	lb.mu.Unlock()
	if empty {
		return
	}
	lb.child.ExitIdle()
}

// Close implements balancer.Balancer. It closes the channel's membership
// in the core; a shared core keeps every other membership's endpoints and
// stays open (it is NewBuilder's caller's), a core the policy made is
// closed (balancer.Balancer.Close).
func (lb *lbBalancer) Close() {
	lb.mu.Lock()
	lb.closed = true
	// A pick still running on our last picker (gRPC's graceful switch
	// publishes the next policy's picker, then closes this one) finds the
	// membership closed: it waits for the next picker, which is there,
	// rather than failing its call.
	lb.gen.Add(1)
	if lb.mem != nil {
		lb.mem.Close()
	}
	if b := lb.core.Load(); b != nil && lb.shared == nil {
		b.Close() // the policy made it: nothing else routes with it
	}
	subs := make([]*subConn, 0, len(lb.subConns))
	for s := range lb.subConns {
		subs = append(subs, s)
	}
	lb.subConns = map[*subConn]struct{}{}
	if lb.wake != nil {
		lb.wake.Stop()
		lb.wake = nil
	}
	lb.current = nil
	lb.mu.Unlock()
	for _, s := range subs {
		s.close()
	}
	lb.child.Close()
}

// Bounds of the wait before a picker that found nothing to pick among its
// READY children is published again (see wakeLater).
const (
	minWake = 10 * time.Millisecond
	maxWake = time.Second
)

// wakeLater publishes the current picker again when the endpoints the core
// excluded may be back. A Pick that finds READY children but nothing the
// core may pick (every one cooling down, ejected or tripped, with panic
// routing off; or a half-open breaker's probes all out) fails the call, and
// gRPC holds wait-for-ready calls until the next picker. Exclusions end
// with time, not with a connectivity change, so without this nothing would
// publish one and those calls would wait until their deadline. The wait is
// until the earliest exclusion ends, within [minWake, maxWake]; one timer
// per channel at a time.
func (lb *lbBalancer) wakeLater(b *core.Balancer) {
	if !lb.waking.CompareAndSwap(false, true) {
		return // armed already: the failing picks of a burst pay one atomic
	}
	d := maxWake
	now := b.Now()
	for _, st := range b.Stats() { // once per wake, on the failure path
		if !st.ExcludedUntil.IsZero() {
			d = min(d, st.ExcludedUntil.Sub(now))
		}
	}
	d = max(d, minWake)
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return // waking stays set: a closed policy never wakes
	}
	lb.wake = time.AfterFunc(d, lb.republish)
}

// republish sends the current picker to gRPC again (a copy: a new picker
// value), which wakes the calls waiting for one. A picker published since
// the timer was armed is the current one, so nothing older comes back.
func (lb *lbBalancer) republish() {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.wake = nil
	lb.waking.Store(false) // a pick failing on the new picker arms the next wake
	if lb.closed || lb.current == nil {
		return
	}
	p := *lb.current
	lb.current = &p
	lb.ClientConn.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: &p})
}

// NewSubConn intercepts pickfirst children's SubConns to follow their
// connectivity for out-of-band ORCA reports.
func (lb *lbBalancer) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	if len(addrs) == 0 {
		//lint:ignore SA1019 the ClientConn's method, which a wrapping ClientConn passes on
		return lb.ClientConn.NewSubConn(addrs, opts)
	}
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return nil, errors.New("inferlb: balancer closed")
	}
	s := &subConn{lb: lb, addr: addrs[0].Addr}
	lb.mu.Unlock()

	next := opts.StateListener
	opts.StateListener = func(st balancer.SubConnState) {
		s.onState(st)
		if next != nil {
			next(st)
		}
	}
	//lint:ignore SA1019 the ClientConn's method, which a wrapping ClientConn passes on
	sc, err := lb.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		return nil, err
	}
	s.sc = sc
	lb.mu.Lock()
	if !lb.closed {
		lb.subConns[s] = struct{}{}
	}
	lb.mu.Unlock()
	return sc, nil
}

// idOf returns the ID of the endpoint that has addr in the resolver's
// last update, or "".
func (lb *lbBalancer) idOf(addr string) string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.addrToID[addr]
}

// reconnected notes that a SubConn to addr went READY, and when its
// endpoint had been connected in this channel before, expires the load
// fields observed before now (see subConn.onState).
func (lb *lbBalancer) reconnected(addr string) {
	lb.mu.Lock()
	id := lb.addrToID[addr]
	again := id != "" && lb.connected[id]
	if id != "" && !lb.closed {
		if lb.connected == nil {
			lb.connected = map[string]bool{}
		}
		lb.connected[id] = true
	}
	lb.mu.Unlock()
	if again {
		if b := lb.core.Load(); b != nil {
			b.Telemetry().Expire(id, telemetry.ProcessLoad, b.Now())
		}
	}
}

func (lb *lbBalancer) forget(s *subConn) {
	lb.mu.Lock()
	delete(lb.subConns, s)
	lb.mu.Unlock()
}

func (lb *lbBalancer) oobConfig() (bool, time.Duration) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.cfg == nil || lb.closed {
		return false, 0
	}
	return lb.cfg.oob, lb.cfg.oobInterval
}

// UpdateState intercepts endpointsharding's aggregated state. It marks
// each endpoint ready or not in the core, then publishes a picker: our P2C
// picker over the READY children when there is one, else endpointsharding's
// own, which queues calls while children connect, wakes IDLE children and
// fails calls with the last connection error in TRANSIENT_FAILURE. A view
// that still holds children of removed endpoints (see stale below) never
// fails a call for what it lacks: its picker queues them for the next.
func (lb *lbBalancer) UpdateState(st balancer.State) {
	children := endpointsharding.ChildStatesFromPicker(st.Picker)

	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return
	}
	b, mem := lb.core.Load(), lb.mem
	ready := make(map[string]bool, len(children))
	pickers := make(map[string]balancer.Picker, len(children))
	type child struct {
		addr string
		st   connectivity.State
	}
	byID := make(map[string]child, len(children))
	// A child of an endpoint the resolver has since removed means this is
	// endpointsharding's view from before our last UpdateClientConnState:
	// a child reporting from a goroutine of its own (pickfirst's CONNECTING
	// from endpointsharding's go exitIdle) after we took the update and
	// before endpointsharding inhibited its children's reports. Its own
	// view follows at the end of that update (its reports are serialized
	// under its lock), so the picker built from this one queues the calls
	// it cannot serve, and never routes over the removed children.
	current := make(map[string]bool, len(lb.eps))
	for _, e := range lb.eps {
		current[e.ID] = true
	}
	stale := false
	for _, c := range children {
		id := endpointID(c.Endpoint, lb.cfg)
		if id != "" && !current[id] {
			stale = true
			continue
		}
		if c.State.ConnectivityState == connectivity.Ready {
			ready[id] = true
			pickers[id] = c.State.Picker
		}
		if _, ok := byID[id]; !ok || c.State.ConnectivityState == connectivity.Ready {
			byID[id] = child{namingAddr(c.Endpoint.Addresses), c.State.ConnectivityState}
		}
	}
	// SetReady before the picker is published, so the core never offers an
	// endpoint this channel cannot use. Every endpoint is set, changed or
	// not: it is cheap.
	//
	// A child that was READY goes IDLE when its connection closes, and
	// endpointsharding has it reconnect at once. When the server closed it
	// gracefully (MaxConnectionAge, which servers set so that clients
	// spread over new replicas), the reconnect succeeds and the endpoint
	// is the same warm process: it is back without slow start, or servers
	// rotating connections more often than SlowStartWindow would never
	// leave it. A child that went through TRANSIENT_FAILURE (the reconnect
	// failed, or a health check said NOT_SERVING) recovers, and ramps.
	//
	// An endpoint that leaves READY is one the pickers published so far
	// hold a child for: a pick on one of them that the core now refuses
	// (nothing else READY, or the rest excluded) must queue for the picker
	// this publishes, as gRPC re-picks when a picker returns a SubConn no
	// longer READY. An endpoint that enters READY is one they hold none
	// for, and the core offers it from SetReady on, before this picker is
	// out: a pick on an older one that the core gives it must queue for
	// this one too, not go elsewhere (an affinity key's owner that just
	// connected, or a fleet's only healthy endpoint, would lose the call
	// to whatever else is READY). gen moves first, so such a pick sees it.
	for _, e := range lb.eps {
		if lb.ready[e.ID] != ready[e.ID] {
			lb.gen.Add(1)
			break
		}
	}
	conn := make(map[string]string, len(lb.eps))
	if mem != nil {
		for _, e := range lb.eps {
			c, listed := byID[e.ID]
			prev, had := lb.conn[e.ID]
			switch {
			case ready[e.ID]:
				if had && prev == c.addr && !lb.ready[e.ID] {
					mem.SetReconnected(e.ID)
				} else {
					mem.SetReady(e.ID, true)
				}
				conn[e.ID] = c.addr
			default:
				mem.SetReady(e.ID, false)
				if had && listed && prev == c.addr && c.st != connectivity.TransientFailure {
					conn[e.ID] = prev
				}
			}
		}
	}
	lb.ready = ready
	lb.conn = conn

	if stale && len(pickers) == 0 && mem != nil {
		// endpointsharding's picker would route over removed children, or
		// fail calls with their errors: wait for its view of the new ones.
		lb.current = nil
		lb.ClientConn.UpdateState(balancer.State{
			ConnectivityState: connectivity.Connecting,
			Picker:            base.NewErrPicker(balancer.ErrNoSubConnAvailable),
		})
		return
	}
	if len(pickers) == 0 || mem == nil || lb.cfg == nil {
		lb.current = nil
		lb.ClientConn.UpdateState(balancer.State{
			ConnectivityState: st.ConnectivityState,
			Picker:            &notReadyPicker{next: st.Picker, shared: lb.shared},
		})
		return
	}
	lb.current = &picker{lb: lb, mem: mem, cfg: lb.cfg, children: newChildTable(b, pickers), excluded: excludedError(len(pickers)), gen: lb.gen.Load(), stale: stale}
	lb.ClientConn.UpdateState(balancer.State{
		ConnectivityState: connectivity.Ready,
		Picker:            lb.current,
	})
}

// notReadyPicker delegates to endpointsharding's picker while no endpoint
// is READY, and prefixes its errors so users see which policy failed the
// call. gRPC's own signals pass through untouched: ErrNoSubConnAvailable
// (queue the call) and status errors (end it with that status). It is
// immutable and safe for concurrent use.
type notReadyPicker struct {
	next   balancer.Picker
	shared *core.Balancer // NewBuilder's; nil when the policy owns its core
}

func (p *notReadyPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	retriedStates(info) // a retry's pick settles the held attempt here too
	if p.shared != nil && p.shared.Closed() {
		// A NewBuilder Balancer its owner closed gives no endpoint
		// again: a call, wait-for-ready too, fails now, as it does
		// through the READY picker, not at its deadline. (A core the
		// policy owns is closed only by the policy, as it replaces it
		// with a new one: calls wait for that one's picker.)
		return balancer.PickResult{}, errBalancerClosed
	}
	res, err := p.next.Pick(info)
	if err == nil || err == balancer.ErrNoSubConnAvailable {
		return res, err
	}
	if _, ok := status.FromError(err); ok {
		return res, err
	}
	return res, fmt.Errorf("inferlb: no endpoint is ready: %w", err)
}

// statusError is err as a gRPC status error with code: gRPC ends the call
// with it at once, even a wait-for-ready one, and errors.Is still finds err.
type statusError struct {
	code codes.Code
	err  error
}

func (e statusError) Error() string              { return e.err.Error() }
func (e statusError) Unwrap() error              { return e.err }
func (e statusError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }
