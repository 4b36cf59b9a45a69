package balancer

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"sync/atomic"

	"github.com/inferlb/inferlb"
)

// maxMemberships is how many memberships one Balancer holds at once, its
// own (Update) included: one readiness bit each in a 64-bit word per endpoint.
const maxMemberships = 64

// ErrTooManyMemberships is returned by NewMembership when the Balancer
// already has 63 open Memberships besides its own.
var ErrTooManyMemberships = errors.New("inferlb: too many open Memberships on one Balancer (63); Close the ones no longer used")

// ErrMembershipClosed is returned by a closed Membership's Update (its Pick
// finds no endpoints: ErrNoEndpoints).
var ErrMembershipClosed = errors.New("inferlb: Membership is closed")

// Membership is one adapter's share of a Balancer: the endpoints it was
// given and which of them it can reach. Adapters that share a Balancer (a
// gRPC channel and an HTTP Transport reaching the same replicas on two
// ports, or two gRPC channels to two fleets) each take a Membership, so each
// routes over its own endpoint set with its own readiness, while all of them
// share the live state (in-flight calls and tokens, latency, errors,
// breakers, telemetry) of the endpoints they have in common, matched by ID.
// One adapter's update never removes another's endpoints, and a replica one
// adapter cannot connect to stays in the others' rotation.
//
// The Balancer's own Update, SetReady, Pick, PickExcept, PickRetry and
// PickAt act on a membership of its own; NewMembership adds more. A membership's groups
// (model subsets, affinity placement, tenant shards) are built from its own
// endpoints, weights and labels. An endpoint's description as a Pick
// reports it (Pick.Endpoint) is the one given last, by whichever membership;
// Pick.OwnEndpoint reports the Balancer's own membership's.
//
// A Membership is safe for concurrent use. Close it when its adapter is
// done: its endpoints that no other membership lists leave the Balancer.
type Membership struct {
	b    *Balancer
	idx  int    // immutable: index in b.memberships
	bit  uint64 // immutable: 1 << idx, its bit in endpoint.readyMask
	snap atomic.Pointer[snapshot]

	// Guarded by b.mu.
	members  []*endpoint
	infos    []*inferlb.Endpoint           // members[i] as this Membership describes it
	listed   map[*endpoint]bool            // members, for SetReady
	loads    map[string]*atomic.Int64      // durable group in-flight counters, by group key
	groupsOf map[*endpoint][]*atomic.Int64 // the counters of the groups each member is in
	poolsOf  map[*endpoint][]*group        // the groups each member counts against MaxEjectedFraction
	closed   bool
	warm     bool // a non-empty Update happened
}

func newMembership(b *Balancer, idx int) *Membership {
	m := &Membership{b: b, idx: idx, bit: 1 << idx, listed: map[*endpoint]bool{}, loads: map[string]*atomic.Int64{}}
	m.snap.Store(&snapshot{all: newGroup(nil, nil, new(atomic.Int64), m.bit)})
	return m
}

// NewMembership adds a membership to the Balancer, empty until its first
// Update. It returns ErrTooManyMemberships when 63 are open already, and
// ErrClosed when the Balancer is closed.
func (b *Balancer) NewMembership() (*Membership, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	for i := 1; i < maxMemberships; i++ {
		if b.memberships[i] == nil {
			m := newMembership(b, i)
			b.memberships[i] = m
			return m, nil
		}
	}
	return nil, ErrTooManyMemberships
}

// Balancer returns the Balancer the Membership belongs to.
func (m *Membership) Balancer() *Balancer { return m.b }

// Pick is Balancer.Pick over the Membership's endpoints that are ready in it.
func (m *Membership) Pick(req *inferlb.Request) (Pick, error) {
	return m.b.pick(m, req, "")
}

// PickExcept is Balancer.PickExcept over the Membership's endpoints that are
// ready in it.
func (m *Membership) PickExcept(req *inferlb.Request, exclude string) (Pick, error) {
	return m.b.pick(m, req, exclude)
}

// PickFailover picks for the retry of a call that failed on the endpoint
// whose ID is failed: another endpoint when one can serve req (not one
// remembered not to serve req's model, or too small for its tokens: that
// would only fetch that answer), else the failed one itself, when nothing
// else is left and retrying where it failed beats failing the call. Like
// PickExcept it does not count the call's affinity key as seen again.
func (m *Membership) PickFailover(req *inferlb.Request, failed string) (Pick, error) {
	p, err := m.b.pickWith(m, req, failed, false, pickRefused)
	if err != nil && failed != "" {
		p, err = m.b.pickWith(m, req, "", false, 0)
	}
	return p, err
}

// PickRetry is Balancer.PickRetry over the Membership's endpoints that are
// ready in it; the retry budget is the Balancer's.
func (m *Membership) PickRetry(req *inferlb.Request, failed string) (Pick, error) {
	return m.b.pickWith(m, req, failed, false, pickBudget|pickRefused)
}

// PickNotServedRetry is Balancer.PickNotServedRetry over the Membership's
// endpoints that are ready in it; the retry budget is the Balancer's.
func (m *Membership) PickNotServedRetry(req *inferlb.Request, failed string) (Pick, error) {
	return m.b.pickWith(m, req, failed, false, pickBudget|pickRefused|pickHop)
}

// PickAt is Balancer.PickAt over the Membership's endpoints that are ready
// in it.
func (m *Membership) PickAt(req *inferlb.Request, serial uint64) (Pick, error) {
	return m.b.pickAt(m, req, serial)
}

// Update replaces the membership's endpoint set, as Balancer.Update does the
// Balancer's own: state is matched by Key, shared with every other
// membership listing the same ID, and kept for endpoints that stay in any.
// An endpoint new to the Membership starts ready in it. Bad entries are
// skipped and reported in the error; the rest is applied. On a closed
// Membership it returns ErrMembershipClosed, on one of a closed Balancer
// ErrClosed, and changes nothing.
func (m *Membership) Update(endpoints []inferlb.Endpoint) error {
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if m.closed {
		return ErrMembershipClosed
	}
	nowNs := nonZero(b.cfg.clock.Now().UnixNano())

	// New endpoints ramp up through slow start when they join a pool that
	// is serving: this membership's after its first endpoints, or, on its
	// first Update, endpoints another membership already serves. A
	// membership whose first Update names only new endpoints (a second
	// service joining a shared Balancer, a channel waking from idle) starts
	// them all at full weight: ramping all of them together would only
	// slow its first calls.
	ramp := m.warm
	for _, ep := range endpoints {
		if _, ok := b.eps[ep.Key()]; ok && !ramp {
			ramp = true
		}
	}
	var errs []error
	seen := make(map[string]int, len(endpoints)) // ID -> index of its first entry
	members := make([]*endpoint, 0, len(endpoints))
	infos := make([]*inferlb.Endpoint, 0, len(endpoints))
	for i, ep := range endpoints {
		id := ep.Key()
		if id == "" {
			errs = append(errs, fmt.Errorf("inferlb: endpoint %d: ID and Addr are both empty; skipped", i))
			continue
		}
		if first, dup := seen[id]; dup {
			errs = append(errs, fmt.Errorf("inferlb: endpoint %d: duplicate ID %q (endpoint %d's); skipped", i, id, first))
			continue
		}
		seen[id] = i
		if w, problem := CheckWeight(ep.Weight); problem != "" {
			errs = append(errs, fmt.Errorf("inferlb: endpoint %q: %s; using %v", id, problem, w))
			ep.Weight = w
		}
		e, ok := b.eps[id]
		if !ok {
			e = newEndpoint(b, id, b.cfg.store.Hold(id))
			b.nextSerial++
			e.serial = b.nextSerial
			e.breaker = b.newBreaker(e)
			if ramp {
				e.rampFrom.Store(nowNs)
			} else {
				e.joined = nowNs // its first scrape may be phased in (see firstReadingDue)
			}
			b.eps[id] = e // reconcile keeps it: it is a member below
		}
		ep.Labels = maps.Clone(ep.Labels)
		info := &ep
		e.info.Store(info)
		if m == b.def {
			e.ownInfo.Store(info)
		}
		members = append(members, e)
		infos = append(infos, info)
	}
	listed := make(map[*endpoint]bool, len(members))
	for _, e := range members {
		listed[e] = true
		if !m.listed[e] {
			e.readyMask.Or(m.bit) // new here: ready until told otherwise
		}
	}
	removed := m.members
	m.members, m.infos, m.listed = members, infos, listed
	snap := b.build(m)
	// Published only once reconcile has pointed every member at its group
	// counters: a pick on the new snapshot counts its call on them, and an
	// endpoint new to the Balancer has none before.
	b.reconcile()
	m.snap.Store(snap)
	// Only now are the members that left marked not ready here: picks
	// still on the old snapshot (those that loaded it before the Store)
	// may take one, as they would have a moment before. Marked before the
	// new snapshot was out, every pick in between (building it and
	// reconcile take a while: the affinity ring, the group counters) found
	// the old snapshot's members gone and failed with ErrNoEndpoints when
	// the update replaced them all, a blue/green switch.
	for _, e := range removed {
		if !listed[e] {
			e.readyMask.And(^m.bit)
		}
	}
	b.epoch.Add(1)
	if len(members) > 0 {
		m.warm = true
	}
	return errors.Join(errs...)
}

// SetReady marks the endpoint id ready or not in this Membership, as
// Balancer.SetReady does in the Balancer's own membership; other
// memberships keep their own view. An endpoint that no membership could
// use and turns ready in one ramps up through slow start. It reports
// whether id is one of the Membership's endpoints.
func (m *Membership) SetReady(id string, ready bool) bool {
	ok := m.setReady(id, ready, true)
	if ok {
		m.b.changed(id)
	}
	return ok
}

// SetReconnected marks the endpoint id ready again in this Membership
// after it lost its connection and got a new one without an outage (gRPC:
// the server closed the connection gracefully, as its MaxConnectionAge
// does, and the reconnect did not fail). It is SetReady(id, true) without
// slow start: the replica is the same warm process, and servers that
// rotate connections more often than SlowStartWindow would otherwise never
// leave it. A ramp under way goes on.
func (m *Membership) SetReconnected(id string) bool {
	ok := m.setReady(id, true, false)
	if ok {
		m.b.changed(id)
	}
	return ok
}

// setReady is SetReady; ramp false leaves slow start as it is.
func (m *Membership) setReady(id string, ready, ramp bool) bool {
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.eps[id]
	if !ok || !m.listed[e] {
		return false
	}
	var old uint64
	if ready {
		old = e.readyMask.Or(m.bit)
	} else {
		old = e.readyMask.And(^m.bit)
	}
	if (old&m.bit != 0) == ready {
		return true
	}
	if !ready && e.pickCount() > 0 {
		// It served calls while ready from the start (Update makes
		// endpoints ready): when it comes back, that is a recovery.
		e.wasReady.Store(true)
	}
	if ready && old == 0 && (e.wasReady.Swap(true) || e.rampFrom.Load() != 0) && ramp {
		// Ready again after an outage (or for the first time after joining
		// a warm balancer): ramp up from now, as Envoy does for hosts that
		// turn healthy. A first connect at startup does not ramp, nor does
		// a replica that another membership has been using all along.
		// A ramp set to start later (an outlier ejection's, at its end)
		// stays: started at the reconnect, it ran out while the endpoint
		// was still held out, and the endpoint came back at full weight.
		// (0 is none, not a time: see afterStepBack.)
		now := nonZero(b.cfg.clock.Now().UnixNano())
		if from := e.rampFrom.Load(); from == 0 || from <= now {
			e.rampFrom.Store(now)
		}
	}
	b.epoch.Add(1)
	return true
}

// Close ends the Membership: its endpoints that no other
// membership lists leave the Balancer (calls in flight to them still end
// normally), and its slot is free for another NewMembership. Close is
// idempotent. The Balancer's own membership has no Close.
func (m *Membership) Close() {
	b := m.b
	if m == b.def {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	for _, e := range m.members {
		e.readyMask.And(^m.bit)
	}
	m.members, m.infos, m.listed, m.groupsOf, m.poolsOf = nil, nil, nil, nil, nil
	m.snap.Store(&snapshot{all: newGroup(nil, nil, new(atomic.Int64), m.bit)})
	b.memberships[m.idx] = nil
	b.reconcile()
	b.epoch.Add(1)
}

// CheckWeight returns the weight Update uses for an Endpoint.Weight of w,
// and, when that is not w, what is wrong with w ("" when nothing is):
// one that is negative, NaN or infinite is read as 1, one above MaxWeight
// as MaxWeight (weights are relative; sums of huge ones overflow to +Inf,
// which would make every member's share 0). Adapters that check their
// endpoint lists before they reach Update name the entry with it.
func CheckWeight(w float64) (float64, string) {
	switch {
	case w < 0 || math.IsNaN(w) || math.IsInf(w, 0):
		return 1, fmt.Sprintf("Weight %v is not a finite non-negative number", w)
	case w > MaxWeight:
		return MaxWeight, fmt.Sprintf("Weight %v is above MaxWeight (%v)", w, float64(MaxWeight))
	}
	return w, ""
}
