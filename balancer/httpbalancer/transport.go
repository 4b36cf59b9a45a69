package httpbalancer

import (
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/idna"

	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
)

// Transport is an http.RoundTripper that sends each request to an endpoint
// picked by a Balancer. It is safe for concurrent use; RoundTrip takes no
// lock. With Discovery, a goroutine re-resolves until Close.
type Transport struct {
	// Concurrency: cfg, b and ownB are immutable after NewTransport. mu
	// guards static and discovered and serializes the Balancer updates
	// made from them, so Update and the discovery loop cannot interleave
	// two halves of a set. Resends and failovers are atomic counters.

	cfg  *config
	b    *balancer.Balancer
	ownB bool // b was made by NewTransport (no Options.Balancer): Close closes it

	mu         sync.Mutex
	static     []inferlb.Endpoint // guarded by mu: from Options.Endpoints and Update
	discovered []inferlb.Endpoint // guarded by mu: from the last good resolution

	addrs addrCache // lock-free; see addrCache

	// mem is the Transport's own membership in a shared Balancer (one from
	// Options.Balancer, with Endpoints or Discovery); nil when it routes
	// over the Balancer's own membership (Balancer.Update). Another adapter
	// on the Balancer may describe the same endpoint IDs with its own Addr
	// (a gRPC channel reaching the same replicas on their gRPC port), so
	// with a mem, own holds the addresses this Transport was given, by
	// endpoint ID, for RoundTrip to send to. Replaced whole.
	mem     *balancer.Membership
	own     atomic.Pointer[map[string]string]
	lastOwn []inferlb.Endpoint // guarded by mu: the set own was last built from
	applied []inferlb.Endpoint // guarded by mu: the set last given to the Balancer (Endpoints)
	// count is len(static)+len(discovered) as of the last apply, for
	// RoundTrip to read without mu (see endpointCount).
	count atomic.Int64

	stopDiscovery context.CancelFunc // nil without Discovery
	discoveryDone chan struct{}
	closeOnce     sync.Once
	closed        atomic.Bool // Close was called: for the error of a call after it

	// For Stats, each added to only on the path it counts.
	resends, failovers atomic.Uint64
}

// TransportStats counts what a Transport did to a call beyond sending it
// once to the endpoint picked for it. The Balancer counts the rest (per
// endpoint in Stats; retry budget answers, every adapter's on a shared
// Balancer, in RetryStats). Export them with metrics.NewTransportCollector.
type TransportStats struct {
	// Resends counts calls sent again to the same endpoint because
	// net/http had put them on a keep-alive connection the server had
	// just closed while idle ("server closed idle connection"; see
	// Failover in the package doc), the Results with Resent set. Any
	// steady rate says a Base closes idle connections later than the
	// servers do (its IdleConnTimeout is above their keep-alive timeout).
	Resends uint64
	// Failovers counts calls retried on another endpoint after failing
	// before any response, or after the endpoint answered that it does
	// not serve the call's model or that the call is longer than its
	// context window (see Failover in the package doc): the Results with
	// FailedOver set.
	Failovers uint64
}

// Stats returns the Transport's counts. It takes no lock.
func (t *Transport) Stats() TransportStats {
	return TransportStats{Resends: t.resends.Load(), Failovers: t.failovers.Load()}
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport for o. It fails on invalid Options or
// Endpoints, an out-of-range Weight (which Update would correct and apply)
// included, with one line per bad entry that names it by its index
// ("Options.Endpoints[1]") and says what is wrong; with Discovery it resolves the name once before returning (a
// failure there is reported to Discovery.OnError, not returned, so a fleet
// that is briefly unresolvable at start does not stop the caller) and keeps
// resolving until Close.
//
// Options with nothing to route to (no Endpoints, no Discovery, no
// Balancer) are not refused: a Transport may start empty and get its
// endpoints from Update later (a config watcher's first answer, say). Until
// it has some, each call fails at once, before anything is sent, with an
// error that wraps balancer.ErrNoEndpoints (errors.Is finds it) and says to
// give endpoints through Options.Endpoints, Options.Discovery or Update.
func NewTransport(o Options) (*Transport, error) {
	cfg, err := o.resolve()
	if err != nil {
		return nil, err
	}
	b := o.Balancer
	if b == nil {
		b = balancer.New(o.BalancerOptions)
	}
	cfg.bind(b)
	t := &Transport{cfg: cfg, b: b, ownB: o.Balancer == nil}
	// Endpoints given empty (not nil) is a set of the Transport's own that
	// Update fills later: a membership too, not the shared Balancer's own
	// set, which another Transport's Update would overwrite.
	if o.Balancer != nil && (o.Endpoints != nil || o.Discovery != nil) {
		if t.mem, err = b.NewMembership(); err != nil {
			return nil, rewrap("inferlb: httpbalancer.Options.Balancer: a Transport with Endpoints or Discovery takes a Membership of it", err)
		}
	}
	if len(o.Endpoints) > 0 {
		// Checked before anything is applied: a bad entry fails the
		// whole call, so its error says what is wrong with each, by
		// its index in Options.Endpoints, and not what Update would do
		// about it (skip it, correct it), since nothing was made.
		keep, problems := checkEndpoints(o.Endpoints)
		var errs []error
		for _, p := range problems {
			errs = append(errs, p.options)
		}
		if len(errs) == 0 {
			t.mu.Lock()
			if err := t.applyLocked(keep, nil); err != nil {
				errs = append(errs, fmt.Errorf("inferlb: NewTransport: Options.Endpoints: %w", err))
			}
			t.mu.Unlock()
		}
		if len(errs) > 0 {
			// applyLocked may have applied the endpoints: let go of
			// them, or their telemetry slots would be held for good.
			if t.mem != nil {
				t.mem.Close()
			}
			if t.ownB {
				b.Close()
			}
			return nil, errors.Join(errs...)
		}
	}
	if o.Discovery != nil {
		t.startDiscovery(*o.Discovery)
	}
	return t, nil
}

// Balancer returns the Balancer the Transport routes with, for Stats and
// RetryStats, or to share it with another adapter.
func (t *Transport) Balancer() *balancer.Balancer { return t.b }

// Update replaces the static endpoint set (Options.Endpoints); endpoints
// found by Discovery are kept. Endpoints whose Addr is not "host:port" or
// "http(s)://host[:port]" (see Options.Endpoints), or that repeat an
// earlier entry's ID or server (its Addr spelled another way), are skipped
// and reported in the error; a Weight that is negative or not finite is
// read as 1, and one above balancer.MaxWeight as MaxWeight, as the
// Balancer reads them, and reported too. Each problem names the entry by
// its index in endpoints. The rest is applied. An endpoint new to a set
// that already serves ramps up to its weight over the Balancer's
// SlowStartWindow (balancer.Options; 30 s by default), from a tenth of it
// (SlowStartMinWeight): an endpoint added here draws few calls at first,
// by design, not for a fault.
// An endpoint left out leaves the Balancer with its state
// (balancer.Balancer.Update); the Transport keeps no table of it, but, on a
// shared Balancer, its address until the next Update or discovered set,
// for calls picked just before this one: pods replaced on every rollout
// leave it holding the current set and the last one at most.
// After Close (or on a closed Balancer or Membership) it returns
// balancer.ErrClosed or balancer.ErrMembershipClosed and changes nothing: Endpoints still lists
// the set from before. That holds too for a Transport that routes over a
// shared Balancer's own set (Options.Balancer with Endpoints nil and no
// Discovery), whose Close leaves that Balancer open: its Update then
// returns an error wrapping balancer.ErrClosed that says the Transport is
// closed, and the shared set stays as it was.
func (t *Transport) Update(endpoints []inferlb.Endpoint) error {
	keep, problems := checkEndpoints(endpoints)
	errs := make([]error, 0, len(problems)+1)
	for _, p := range problems {
		errs = append(errs, p.update)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mem == nil && !t.ownB && t.closed.Load() {
		// Routing over a shared Balancer's own set, Close closed
		// nothing: without this check the closed Transport still
		// replaced the set every adapter of that Balancer routes over.
		return fmt.Errorf("%w: the Transport is closed (the shared Balancer is not; its endpoints are unchanged)", balancer.ErrClosed)
	}
	errs = append(errs, t.applyLocked(keep, t.discovered))
	return errors.Join(errs...)
}

// entryProblem is what is wrong with one entry of an endpoint list, said
// two ways: as Update reports it, naming the entry by its index in the
// list ("endpoint 2") and saying what it did about it ("skipped", "using
// 1"), and as NewTransport does, which made nothing and so did nothing
// about it, naming the field ("Options.Endpoints[2]").
type entryProblem struct {
	update, options error
}

// checkEndpoints reads endpoints as Update and NewTransport take them: the
// entries to apply (Labels copied, an out-of-range Weight corrected) and
// the problems of the others, each by its index in endpoints.
func checkEndpoints(endpoints []inferlb.Endpoint) (keep []inferlb.Endpoint, problems []entryProblem) {
	keep = make([]inferlb.Endpoint, 0, len(endpoints))
	ids := make(map[string]int, len(endpoints))     // Key -> index in endpoints of the entry kept
	servers := make(map[string]int, len(endpoints)) // serverKey -> index in endpoints of the entry kept
	// bad records entry i's problem, the text after the entry's name,
	// and what Update does about it.
	bad := func(i int, problem, action string) {
		key := endpoints[i].Key()
		problems = append(problems, entryProblem{
			update:  fmt.Errorf("inferlb: endpoint %d (%q): %s; %s", i, key, problem, action),
			options: fmt.Errorf("inferlb: NewTransport: Options.Endpoints[%d] (%q): %s", i, key, problem),
		})
	}
	for i, ep := range endpoints {
		scheme, host, ok := splitAddr(ep.Addr)
		if !ok || !validHostPort(scheme, host) {
			bad(i, fmt.Sprintf("Addr %q is not host:port or http(s)://host[:port]%s", ep.Addr, addrHint(ep.Addr)), "skipped")
			continue
		}
		// A later duplicate of an ID is skipped here, as the Balancer
		// would skip it, so that the error gives its index in endpoints:
		// the Balancer's would count in the set it is given, without
		// the entries skipped above, and name another entry (one kept).
		if j, dup := ids[ep.Key()]; dup {
			empty := ""
			if ep.ID == "" {
				empty = "; an empty ID is the Addr"
			}
			problems = append(problems, entryProblem{
				update:  fmt.Errorf("inferlb: endpoint %d: duplicate ID %q (endpoint %d's); skipped", i, ep.Key(), j),
				options: fmt.Errorf("inferlb: NewTransport: Options.Endpoints[%d]: duplicate ID %q (Options.Endpoints[%d]'s%s)", i, ep.Key(), j, empty),
			})
			continue
		}
		// One server spelled two ways ("10.0.0.5:8000" and
		// "http://10.0.0.5:8000/", or under two IDs) would be two
		// endpoints: twice the share of calls, its load split between
		// two states that each see half of it.
		server := serverKey(scheme, host)
		if j, dup := servers[server]; dup {
			other := endpoints[j]
			problems = append(problems, entryProblem{
				update: fmt.Errorf("inferlb: endpoint %d (%q): Addr %q names the server of endpoint %d (%q, Addr %q), as both are %s: list each server once; skipped",
					i, ep.Key(), ep.Addr, j, other.Key(), other.Addr, server),
				options: fmt.Errorf("inferlb: NewTransport: Options.Endpoints[%d] (%q): Addr %q names the server of Options.Endpoints[%d] (%q, Addr %q), as both are %s: list each server once",
					i, ep.Key(), ep.Addr, j, other.Key(), other.Addr, server),
			})
			continue
		}
		// Corrected here as the Balancer would correct it, so that the
		// error gives its index in endpoints: the Balancer's names the
		// entry by ID alone.
		if w, problem := balancer.CheckWeight(ep.Weight); problem != "" {
			bad(i, problem, fmt.Sprintf("using %v", w))
			ep.Weight = w
		}
		ids[ep.Key()] = i
		servers[server] = i
		// Kept, and applied again with each set Discovery finds, on
		// its goroutine: a copy, as the Balancer takes one, so that the
		// caller may reuse its map once Update has returned.
		ep.Labels = maps.Clone(ep.Labels)
		keep = append(keep, ep)
	}
	return keep, problems
}

// Endpoints returns the endpoints this Transport gave its Balancer:
// Options.Endpoints or the last Update's, then those Discovery found (a
// static endpoint wins over a discovered one with its ID or its server; an
// ID listed twice appears once, as first listed). On a shared Balancer the Transport also
// routes over endpoints other adapters gave it, which are not listed here
// (Balancer.Stats lists every endpoint the Balancer routes over).
// Telemetry sources follow them with it, so that scrape targets keep up with
// Discovery:
//
//	src := &modelserver.Source{Targets: func() []modelserver.Target {
//		var ts []modelserver.Target
//		for _, e := range t.Endpoints() {
//			base := strings.TrimSuffix(e.Addr, "/") // "https://h:8443/" is an Addr too
//			if !strings.Contains(base, "://") {
//				base = "http://" + base
//			}
//			ts = append(ts, modelserver.Target{EndpointID: e.Key(), URL: base + "/metrics"})
//		}
//		return ts
//	}}
//
// The slice is the caller's, labels included.
func (t *Transport) Endpoints() []inferlb.Endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	eps := slices.Clone(t.applied)
	for i := range eps {
		// The Transport applies these maps again (every discovered
		// endpoint shares one): a caller's write must not reach them.
		eps[i].Labels = maps.Clone(eps[i].Labels)
	}
	return eps
}

// endpointCount is how many endpoints the Transport has given its
// Balancer (static and discovered, before duplicates are dropped). It
// takes no lock: RoundTrip asks it on every 400, 404, 413 and 422, and mu
// is held while an Update or a discovered set is applied to the Balancer.
func (t *Transport) endpointCount() int { return int(t.count.Load()) }

// applyLocked makes static and discovered the Transport's sets and gives
// the Balancer their union; a discovered
// endpoint with the ID or the server of a static one is dropped (the
// static one wins).
// Of static endpoints sharing an ID the first is applied, as the Balancer
// applies it (Update reports and drops the others): Endpoints and, on a shared
// Balancer, the addresses calls are sent to (own) follow it. A closed
// Balancer or Membership changes nothing, and neither does applyLocked:
// Endpoints would otherwise list endpoints the Balancer does not have.
func (t *Transport) applyLocked(static, discovered []inferlb.Endpoint) (err error) {
	prevStatic, prevDiscovered, prevCount := t.static, t.discovered, t.count.Load()
	prevOwn, prevLastOwn, prevApplied := t.own.Load(), t.lastOwn, t.applied
	defer func() {
		if errors.Is(err, balancer.ErrClosed) || errors.Is(err, balancer.ErrMembershipClosed) {
			t.static, t.discovered, t.applied, t.lastOwn = prevStatic, prevDiscovered, prevApplied, prevLastOwn
			t.count.Store(prevCount)
			t.own.Store(prevOwn)
		}
	}()
	t.static, t.discovered = static, discovered
	t.count.Store(int64(len(t.static) + len(t.discovered)))
	all := make([]inferlb.Endpoint, 0, len(t.static)+len(t.discovered))
	all = append(all, t.static...)
	var servers map[string]bool // the static endpoints' servers (serverKey)
	if len(t.discovered) > 0 {
		servers = make(map[string]bool, len(t.static))
		for _, s := range t.static {
			servers[addrServer(s.Addr)] = true
		}
	}
	for _, d := range t.discovered {
		// Listed statically under another spelling ("http://10.0.0.5:8000"
		// for the 10.0.0.5:8000 found) or another ID, the server would
		// be two endpoints, with two shares of the calls.
		dup := servers[addrServer(d.Addr)]
		for i := 0; !dup && i < len(t.static); i++ {
			dup = t.static[i].Key() == d.Key()
		}
		if !dup {
			all = append(all, d)
		}
	}
	own := make(map[string]string, len(all)+len(t.lastOwn))
	applied := make([]inferlb.Endpoint, 0, len(all))
	for _, e := range all {
		if _, dup := own[e.Key()]; !dup {
			own[e.Key()] = e.Addr
			applied = append(applied, e)
		}
	}
	t.applied = applied
	if t.mem == nil {
		return t.b.Update(all)
	}
	// A call picked just before this update may reach outgoing after it:
	// an endpoint leaving now keeps its address until the next update, so
	// that call is not sent to another adapter's address for the ID.
	for _, e := range t.lastOwn {
		if _, ok := own[e.Key()]; !ok {
			own[e.Key()] = e.Addr
		}
	}
	t.lastOwn = applied
	t.own.Store(&own)
	return t.mem.Update(all)
}

// Close stops discovery and waits for its goroutine, and closes the idle
// connections of the default Base (see Options.Base). A Transport with its
// own Balancer (no Options.Balancer) closes it (balancer.Balancer.Close):
// its endpoints give back their slots in the telemetry Store, and later
// calls, and Update, fail with balancer.ErrClosed. One with its own
// membership in a shared Balancer (Options.Balancer with Endpoints or
// Discovery) closes that membership, so its endpoints that no other
// adapter lists leave the Balancer, and fails later calls with
// balancer.ErrNoEndpoints (saying the Transport is closed); a Balancer given in Options.Balancer is the
// caller's, and stays open. Calls in flight end normally. Close is
// idempotent.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		if t.stopDiscovery != nil {
			t.stopDiscovery()
			<-t.discoveryDone
		}
		if t.mem != nil || t.ownB {
			t.mu.Lock()
			if t.mem != nil {
				t.mem.Close()
			}
			if t.ownB {
				t.b.Close()
			}
			t.mu.Unlock()
		}
		if t.cfg.ownBase {
			t.CloseIdleConnections()
		}
	})
	return nil
}

// CloseIdleConnections closes the Base transport's idle connections, if it
// has that method; http.Client.CloseIdleConnections reaches it through here.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.cfg.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// splitAddr splits an endpoint Addr into scheme ("" when absent) and host.
// It does not allocate: it runs on every request.
func splitAddr(addr string) (scheme, host string, ok bool) {
	host = addr
	if i := strings.Index(addr, "://"); i >= 0 {
		scheme, host = addr[:i], addr[i+3:]
		if !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https") {
			return "", "", false
		}
	}
	host = strings.TrimSuffix(host, "/")
	if host == "" || strings.ContainsAny(host, "/?#@ \t\r\n") {
		return "", "", false
	}
	return scheme, host, true
}

// addrHint says, for the mistakes a new user makes, why splitAddr or
// validHostPort refused addr: a base URL's path (an OpenAI client's
// "http://10.0.0.5:8000/v1"), a missing port, another scheme. It is ""
// when no short reason fits. Wording of an error only.
func addrHint(addr string) string {
	host := addr
	if !strings.Contains(addr, "://") {
		// "http//h:1" is a typo, not a host "http" with a path.
		for _, p := range []string{"https:/", "http:/", "https//", "http//"} {
			if len(addr) > len(p) && strings.EqualFold(addr[:len(p)], p) {
				fixed := addr[:len(p)-2] + "://" + strings.TrimLeft(addr[len(p):], "/")
				return fmt.Sprintf(" (a scheme ends in \"://\": %q)", fixed)
			}
		}
	}
	if i := strings.Index(addr, "://"); i >= 0 {
		scheme := addr[:i]
		if !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https") {
			return fmt.Sprintf(" (scheme %q is neither http nor https)", scheme)
		}
		host = addr[i+3:]
	}
	if i := strings.IndexByte(host, '/'); i >= 0 && strings.TrimRight(host[i:], "/") != "" {
		return fmt.Sprintf(" (%q: an endpoint names a server only; each call keeps its request URL's path, so a base path such as /v1 goes in the client's base URL)", host[i:])
	}
	if _, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
			return fmt.Sprintf(" (port %d is not in 1-65535)", n)
		}
	}
	if addr == host && host != "" && !strings.ContainsAny(host, ":/?#@ \t\r\n[") {
		return fmt.Sprintf(" (no port: give one, %q, or a scheme for its default, %q)", host+":<port>", "http://"+host)
	}
	return ""
}

// serverKey returns the server that an Addr which splitAddr and
// validHostPort accept (as scheme and host) names: "host:port" with the
// host in lower case, a name outside ASCII as the IDNA name net/http dials
// ("bücher.example" is "xn--bcher-kva.example"), an IP address in its
// canonical form (an IPv4-mapped IPv6 one as IPv4), a DNS name without its
// trailing dot, and the port as a number, the scheme's own when the Addr
// has none. The scheme is left out: one port serves one protocol, so two
// Addrs that differ only there name one server, listed once too often. A
// name is not resolved: "localhost" may dial ::1, where a server other
// than 127.0.0.1's may listen.
func serverKey(scheme, host string) string {
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		h, port = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), "80"
		if strings.EqualFold(scheme, "https") {
			port = "443"
		}
	} else if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n) // "08000" is 8000
	}
	if !isASCII(h) {
		// What net/http dials (its idnaASCII): two spellings of one
		// name, one of them Punycode, were two servers.
		if a, err := idna.Lookup.ToASCII(h); err == nil {
			h = a
		}
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		h = ip.Unmap().String()
	} else {
		h = strings.TrimSuffix(strings.ToLower(h), ".")
	}
	return net.JoinHostPort(h, port)
}

// isASCII reports whether s is all ASCII.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// addrServer is serverKey of an Addr that Update or Discovery accepted.
func addrServer(addr string) string {
	scheme, host, _ := splitAddr(addr)
	return serverKey(scheme, host)
}

// validHostPort reports whether host (of an Addr with scheme, "" if none)
// names a host and has a port in 1-65535, or none and a scheme to take the
// default port from: a bare "10.0.0.5" is a forgotten port (calls would
// dial port 80), "10.0.0.5:800O" a typo that fails only at dial time, and
// ":8000" (HOST+":8000" with HOST unset) a forgotten host, which net/http
// dials on this machine.
func validHostPort(scheme, host string) bool {
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		// No port: fine with a scheme, unless the host is an IPv6
		// address without brackets (its colons look like one), or
		// nothing in brackets.
		if strings.HasPrefix(host, "[") {
			return scheme != "" && len(host) > 2 && strings.HasSuffix(host, "]")
		}
		return scheme != "" && !strings.Contains(host, ":")
	}
	n, err := strconv.Atoi(port)
	return h != "" && err == nil && n >= 1 && n <= 65535 && port[0] != '+'
}

// addrCache remembers how recent endpoint Addrs split, in slots chosen by
// the address of the string's bytes: an endpoint's Addr is one string for as
// long as it is in the set, so a hit costs a pointer compare where splitAddr
// scans the string three times. A miss (a new set, two Addrs sharing a slot)
// only costs the scan again. Slots hold valid Addrs only.
//
// Concurrency: each slot is an atomic pointer to an immutable entry.
type addrCache [16]atomic.Pointer[splitHost]

type splitHost struct{ addr, scheme, host string } // scheme is lower case

func (c *addrCache) split(addr string) (scheme, host string, ok bool) {
	slot := &c[uintptr(unsafe.Pointer(unsafe.StringData(addr)))>>4%uintptr(len(c))]
	if p := slot.Load(); p != nil && p.addr == addr {
		return p.scheme, p.host, true
	}
	scheme, host, ok = splitAddr(addr)
	if ok {
		scheme = strings.ToLower(scheme)
		slot.Store(&splitHost{addr: addr, scheme: scheme, host: host})
	}
	return scheme, host, ok
}

var errNilURL = errors.New("inferlb: httpbalancer: request has a nil URL")

// errNilResponse fails an attempt whose Base broke the RoundTripper
// contract with neither a response nor an error: reading the missing
// response would panic with the pick never reported, leaving the endpoint
// one call busier for good.
var errNilResponse = errors.New("inferlb: httpbalancer: Base returned a nil response and a nil error")

// RoundTrip implements http.RoundTripper. It inspects the request, picks an
// endpoint, rewrites a shallow copy of the request to it and sends that
// through Base. The caller's request is never modified, and its body is
// closed on every path. A call that fails before any response arrives is
// retried once on another endpoint when its body can be replayed, the
// context is live, another endpoint can take it and the Balancer's retry
// budget allows; one whose connection the server closed while idle,
// before sending, is first sent again to the same endpoint (see Failover
// in the package doc). Failing on an endpoint, it returns an
// *EndpointError. The response's Request is the request actually sent:
// its URL names the endpoint.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL == nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, errNilURL
	}
	ctx := r.Context()
	plan := t.planPeek(r)
	c, buf := newCall(plan.size)
	c.t = t
	c.out = *r     // the first attempt's request; its context is the call's
	var rb reqBody // on the stack: only this call's attempts use it
	if err := t.readBody(ctx, r, &rb, plan, buf); err != nil {
		return nil, err
	}
	inspected := r
	if t.cfg.reopen && rb.peeked && !rb.complete && !rb.inPlace && r.GetBody != nil {
		// Larger than the peek and replayable: inspect a fresh copy,
		// which the inspector may read past the peek (see reopen).
		if fresh := rb.reopen(r.GetBody); fresh != nil {
			c.out.Body = fresh // c.out is a copy of r until outgoing sets it up
			inspected = &c.out
		}
	}
	t.cfg.inspector.Inspect(inspected, rb.head, rb.complete, &c.info)
	rb.release()
	if v := r.Header[t.cfg.sessionHeader]; len(v) > 0 && v[0] != "" {
		// Scoped by the body's cache_salt, as Inspect scoped the body's keys.
		c.info.AffinityKey, c.info.Session = c.info.sessionKey(t.cfg.keyer, v[0]), true
	}
	if v := r.Header[t.cfg.tenantHeader]; len(v) > 0 && c.info.Tenant == "" {
		c.info.Tenant = v[0]
	}

	body := rb.first()
	if ctx.Err() != nil {
		closeBody(body)
		// The cause the caller gave (context.WithCancelCause), as
		// net/http's Transport returns it: else context.Err's.
		return nil, context.Cause(ctx)
	}
	var err error
	switch {
	case c.info.pin != 0 && t.mem == nil:
		// A follow-up to where its stored response is (see ResponseMemory).
		c.pick, err = t.b.PickAt(&c.info.Request, uint64(c.info.pin))
	case c.info.pin != 0:
		c.pick, err = t.mem.PickAt(&c.info.Request, uint64(c.info.pin))
	case t.mem == nil:
		c.pick, err = t.b.Pick(&c.info.Request)
	default:
		c.pick, err = t.mem.Pick(&c.info.Request)
	}
	if err != nil {
		closeBody(body)
		if errors.Is(err, balancer.ErrNoEndpoints) && t.mem != nil && t.closed.Load() {
			// Its membership is closed: the fleet is fine, the
			// Transport is not to be used (a Transport with its own
			// Balancer gets balancer.ErrClosed).
			return nil, fmt.Errorf("%w: the Transport is closed (Close ended its membership in the shared Balancer)", err)
		}
		// Only a Transport that feeds its Balancer's set itself can say it
		// has none: one over a shared Balancer's own set (Options.Balancer
		// alone) routes over endpoints someone else gave it.
		if errors.Is(err, balancer.ErrNoEndpoints) && (t.ownB || t.mem != nil) && t.endpointCount() == 0 {
			return nil, fmt.Errorf("%w: this Transport has none (Options.Endpoints empty, emptied by Update, or none found by Discovery yet): give it some with Options.Endpoints, Options.Discovery or Update", err)
		}
		switch {
		case errors.Is(err, balancer.ErrModelNotListed):
			// A model no endpoint lists (a typo, an embedding sent
			// through the LLM Transport): say which, as the gRPC policy
			// does, and that waiting will not mend it.
			err = fmt.Errorf("%w: %s (check the name against the endpoints' model labels)", err, quoteModel(c.info.Model))
		case c.info.Model != "" && errors.Is(err, balancer.ErrNoEndpoints) && !errors.Is(err, balancer.ErrTenantShardDown):
			err = fmt.Errorf("%w for model %s: each endpoint that may serve it is out of rotation (breaker open, cooling down or ejected)", err, quoteModel(c.info.Model))
		}
		return nil, err
	}
	// first: the call's first request, which lives in c (see outgoing);
	// resent: the call was sent again after a connection closed while
	// idle; failedOver: it went on to another endpoint. Each happens at
	// most once.
	first, resent, failedOver := true, false, false
	hops := 0 // attempts that met an endpoint without the call's model
	for ; ; first = false {
		c.start = c.pick.PickedAt().UnixNano() // the transport's clock is the Balancer's
		out, err := c.outgoing(r, body, rb.gb, first)
		if err != nil {
			closeBody(body)
			c.fail(errUnusableAddr, false)
			return nil, err
		}
		resp, err := c.send(out) // closes out.Body
		if err == nil {
			if resp != nil {
				if code := resp.StatusCode; code >= 400 && code < 500 {
					var next retryAttempt
					ok := false
					switch code {
					case http.StatusNotFound:
						// Perhaps the endpoint does not serve the model
						// (see notServed): then the call goes elsewhere.
						// Without a model, a 404 is some other answer (a
						// route the server lacks).
						if c.info.Model != "" {
							next, ok = c.notServed(resp, hops < t.notServedHops(), &rb)
						}
					case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge:
						// Perhaps the call is longer than the endpoint's
						// context window and another takes it (window.go;
						// TGI refuses it with 422, TEI up to v1.8 with
						// 413), with a model or without one (TEI's
						// native routes name none).
						next, ok = c.tooLong(resp, hops < t.notServedHops(), &rb)
					}
					if ok {
						c.pick, body = next.pick, next.body
						hops++
						t.failovers.Add(1)
						c.ends.And(^uint32(endResent))
						continue
					}
				}
				return c.respond(resp)
			}
			err = errNilResponse // a broken Base; http.Client fails it too
			// Nor may it have closed the body, which may be the
			// caller's own: RoundTrip promises to (see send).
			closeBody(body)
		} else if resp != nil && resp.Body != nil {
			// A broken Base returned a response and an error: the error
			// counts (as http.Client has it), and the response's body,
			// which no one else will see, is closed so that its
			// connection is not leaked.
			_ = resp.Body.Close()
		}
		if s, ok := body.rc.(*stitched); ok && s.failed.Load() {
			// The caller's body broke, not the endpoint: nothing to
			// blame, nothing to retry.
			c.fail(errBodyFailed, false)
			return nil, err
		}
		if legacyCanceled(r) {
			// The caller gave up through Request.Cancel, as it may
			// through the context: no endpoint is to blame, and a
			// retry would be given up on too.
			c.fail(legacyCause(r), false)
			return nil, err
		}
		if malformed(out) || rb.wrongLength(body, out.ContentLength) {
			// Base refused the request itself (net/http checks the method,
			// header fields and body length before and while it writes
			// them): every endpoint would, so none is to blame and a
			// retry is no use.
			c.fail(errMalformed, false)
			return nil, err
		}
		blame := err // what the attempt's Outcome says
		if serverClosedIdle(err) {
			// The server closed the connection while it was idle, before
			// the request was put on it (see serverClosedIdle): the
			// endpoint never saw the call and is not to blame. The call
			// goes to it again, once, under the same pick, which is
			// still open: Done is called once, for the attempt that
			// ends the call, and the Balancer sees one call, as it does
			// when net/http resends a GET itself. The endpoint is as
			// healthy as before and, with an affinity key, holds the
			// prompt's KV cache; net/http dropped the closed connection
			// and takes another or dials. This spends no retry budget:
			// the budget bounds the load that retries add to a fleet
			// under overload or failure, and this one adds none (the
			// server got the request once) and says nothing of
			// either, only that a keep-alive timeout (uvicorn's 5 s)
			// met the call. Costs nothing unless Base failed.
			if !resent && ctx.Err() == nil {
				if again, ok := c.resend(&rb); ok {
					resent, body = true, again
					c.ends.Or(endResent)
					t.resends.Add(1)
					continue
				}
			}
			blame = errIdleConnClosed
		}
		next, ok := c.retry(!failedOver, &rb, blame)
		if !ok {
			c.fail(blame, false)
			// What went wrong, not that nothing was left to retry on,
			// and where (see EndpointError).
			if ctx.Err() != nil {
				return nil, err // the caller's doing
			}
			return nil, &EndpointError{Endpoint: c.pick.ID(), Err: err}
		}
		c.failOver(blame, &next)
		c.pick, body = next.pick, next.body
		failedOver = true
		t.failovers.Add(1)
		c.ends.And(^uint32(endResent)) // the resend was the failed attempt's
	}
}

// errUnusableAddr is the Outcome.Err of an attempt whose endpoint's Addr
// this Transport cannot send to: with a shared Balancer routed over its own
// endpoints, another adapter may have set an address of its kind (a gRPC
// channel's unix socket). It wraps context.Canceled, which the balancer
// reads as saying nothing about the endpoint: a configuration error here
// must not trip the breaker through which the other adapter reaches the
// endpoint fine. The call fails with an error naming the Addr.
var errUnusableAddr = fmt.Errorf("inferlb: httpbalancer: the endpoint's Addr is not one HTTP can use: %w", context.Canceled)

// errLegacyCanceled is the Outcome.Err of an attempt whose caller closed
// the request's Cancel channel: deprecated, but http.Client still sets it
// for a RoundTripper it does not know (this one) when Client.Timeout is
// set, and net/http's Transport still honours it, failing the call with
// "net/http: request canceled". It wraps context.Canceled, which the
// balancer reads as saying nothing about the endpoint.
var errLegacyCanceled = fmt.Errorf("inferlb: httpbalancer: the caller canceled the request (Request.Cancel): %w", context.Canceled)

// legacyCause is the Outcome.Err of an attempt that r's Cancel channel
// ended: the caller's doing (errLegacyCanceled), unless r's context's
// deadline has passed. http.Client.Timeout sets both and ends them at one
// moment by two timers: when Cancel's won, an endpoint that hung until the
// client's timeout was not blamed, where a context deadline blames it. The
// deadline is the wall clock's, so it is read against the wall clock.
func legacyCause(r *http.Request) error {
	if dl, ok := r.Context().Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return errLegacyCanceled
}

// legacyCanceled reports whether r's Cancel channel is closed.
func legacyCanceled(r *http.Request) bool {
	//lint:ignore SA1019 honoured as net/http honours it
	cancel := r.Cancel
	if cancel == nil {
		return false
	}
	select {
	case <-cancel:
		return true
	default:
		return false
	}
}

// errIdleConnClosed is the Outcome.Err of an attempt that failed on a
// connection the server had closed while idle (see serverClosedIdle) and
// was not sent again: the body could not be replayed, the context ended,
// or it had been sent again already and met another such connection. It
// wraps context.Canceled, which the balancer reads as saying nothing about
// the endpoint: the server never saw the request. Counted as failures,
// these races of every keep-alive timeout tripped the breakers of healthy
// endpoints and moved calls off the endpoint that held their prompts.
var errIdleConnClosed = fmt.Errorf("inferlb: httpbalancer: the server closed the idle connection before the request was sent: %w", context.Canceled)

// netHTTPServerClosedIdle is the text of net/http's errServerClosedIdle.
const netHTTPServerClosedIdle = "http: server closed idle connection"

// serverClosedIdle reports whether err, an error from Base, is net/http's
// errServerClosedIdle, or wraps it: the server closed a keep-alive
// connection that net/http had taken from its idle pool, before net/http
// registered the request on it, so no byte of the request reached the
// server. (net/http's read loop closes the connection with that error
// only when it sees the server's EOF, or a 408 sent to an idle
// connection, while no response is expected, under the lock that a
// request takes to register itself; the request, registered afterwards,
// then writes to a connection closed already.) net/http resends it by
// itself only for idempotent requests (GET, HEAD, OPTIONS, TRACE, or an
// Idempotency-Key header), so a POST comes back with it.
//
// The error is unexported (golang/go#19943 asked in vain for it to be),
// and a linkname to it is refused by the linker since Go 1.23, so it is
// matched by its exact text, on err and on each error err wraps; a
// middleware's wrapper with %w is seen through. TestServerClosedIdle holds
// the text to the real error, made by net/http on loopback: a Go release
// that changes it fails that test instead of silently counting the races
// as failures again.
//
// It is not any failure of a reused connection. A server that read the
// request and then closed (crashed, restarted, hung up) gives io.EOF, or
// net/http's "transport connection broken": bytes were written, and the
// server may have acted on them, so those count against the endpoint as
// before. A write to the connection that fails with nothing written, or a
// reset seen while it was idle, net/http resends itself when GetBody is set
// (as outgoing sets it for every replayable body). HTTP/2 has no such error
// to catch: its transport resends by itself, for any method, a request on
// a connection that became unusable before the stream was opened, or that
// a graceful shutdown's GOAWAY or a REFUSED_STREAM says the server did not
// process; a stream lost with its connection may have been processed.
func serverClosedIdle(err error) bool {
	for err != nil {
		if err.Error() == netHTTPServerClosedIdle {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if serverClosedIdle(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// resend returns the body for sending a call again to the same endpoint,
// after a connection closed while idle. A panic in the caller's code here
// (GetBody) finishes the pick on the way out, blaming no endpoint.
func (c *call) resend(rb *reqBody) (bodyReader, bool) {
	returned := false
	defer func() {
		if !returned {
			c.fail(errIdleConnClosed, false)
		}
	}()
	body, ok := rb.again()
	returned = true
	return body, ok
}

// retryAttempt is a failover's pick and body.
type retryAttempt struct {
	pick balancer.Pick
	body bodyReader
}

// retry sets up the failover of an attempt that failed before any
// response, when the call may still fail over (it has not yet), its body
// can be sent again, the context is live and the retry budget allows. The
// body comes first and then the pick, which
// spends the budget only when another endpoint can take the call: a
// failover with nowhere to go retries nothing. The retry never lands on
// the endpoint that just failed; with an affinity key it goes to the next
// endpoint in the key's order, the one its spills already warm.
//
// The failed attempt (its error is err) is reported once the retry is
// set up; a panic in the caller's code here (GetBody, a Scorer) reports it
// on the way out, so that its pick is finished all the same.
func (c *call) retry(may bool, rb *reqBody, err error) (retryAttempt, bool) {
	t := c.t
	if !may || !t.cfg.failover || c.out.Context().Err() != nil || !rb.replayable() {
		return retryAttempt{}, false
	}
	returned := false
	defer func() {
		if !returned {
			c.fail(err, false)
		}
	}()
	next, ok := c.retryPick(rb, err == errNotServed)
	returned = true
	return next, ok
}

// failOver reports the failed attempt of a call that goes on to next.
// Should Options.OnResult panic there, next's pick, made already, is
// finished on the way out (as canceled: it was never sent) and its body
// closed, so that no endpoint is left one call busier.
func (c *call) failOver(err error, next *retryAttempt) {
	reported := false
	defer func() {
		if !reported {
			next.pick.Done(inferlb.Outcome{Err: errNotSent})
			closeBody(next.body)
		}
	}()
	c.fail(err, true)
	reported = true
}

// errNotSent is the Outcome.Err of a failover's pick whose attempt was
// never sent (see failOver); it wraps context.Canceled, blaming no one.
var errNotSent = fmt.Errorf("inferlb: httpbalancer: the retry was not sent: %w", context.Canceled)

// retryPick picks the retry of the call; hop says the attempt's endpoint
// answered it does not serve the call's model (PickNotServedRetry).
func (c *call) retryPick(rb *reqBody, hop bool) (retryAttempt, bool) {
	t := c.t
	body, ok := rb.again()
	if !ok {
		return retryAttempt{}, false
	}
	var next retryAttempt
	var err error
	switch {
	case hop && t.mem == nil:
		next.pick, err = t.b.PickNotServedRetry(&c.info.Request, c.pick.ID())
	case hop:
		next.pick, err = t.mem.PickNotServedRetry(&c.info.Request, c.pick.ID())
	case t.mem == nil:
		next.pick, err = t.b.PickRetry(&c.info.Request, c.pick.ID())
	default:
		next.pick, err = t.mem.PickRetry(&c.info.Request, c.pick.ID())
	}
	if err != nil {
		closeBody(body)
		return retryAttempt{}, false
	}
	next.body = body
	return next, true
}

// errBasePanicked is the Outcome.Err of an attempt whose Base panicked (or
// called runtime.Goexit, as a test's mock does on a failed assertion). It
// wraps context.Canceled, which the balancer reads as saying nothing about
// the endpoint: the panic is the caller's code, and a middleware that
// panics on some requests must not trip the breakers of healthy endpoints
// one after another.
var errBasePanicked = fmt.Errorf("inferlb: httpbalancer: Base panicked: %w", context.Canceled)

// send is one attempt's Base.RoundTrip. A Base that panics panics through
// RoundTrip as it came (not recovered, so the trace is the Base's); the
// deferred report finishes the pick on the way out, which would otherwise
// keep the endpoint one call busier for good, and the call is not retried.
// The defer is in this small function, not in RoundTrip's loop, so that it
// is open-coded: free on the normal path.
func (c *call) send(out *http.Request) (*http.Response, error) {
	returned := false
	defer func() {
		if !returned {
			c.fail(errBasePanicked, false)
			// The Base broke off without a word on the body it was
			// given, which may be the caller's own: close it, as
			// RoundTrip promises (a second Close of a body Base did
			// close is left to the body, as net/http's own resends do).
			if out.Body != nil {
				_ = out.Body.Close()
			}
		}
	}()
	resp, err := c.t.cfg.base.RoundTrip(out)
	returned = true
	return resp, err
}

// outgoing builds the request for one attempt: a shallow copy of r whose URL
// points at the picked endpoint. The URL is copied, never edited in place;
// the header map is shared unless a header must be added. The first
// attempt's request lives in the call (one allocation fewer per call); a
// retry gets a fresh one, since Base may still hold the failed one.
func (c *call) outgoing(r *http.Request, body bodyReader, getBody func() (io.ReadCloser, error), first bool) (*http.Request, error) {
	t, p := c.t, &c.pick
	var ep inferlb.Endpoint
	if t.mem == nil {
		// Picked from the Balancer's own set: its address for the
		// endpoint, not one another membership of a shared Balancer
		// gave the same ID since (a gRPC port).
		var ok bool
		if ep, ok = p.OwnEndpoint(); !ok {
			ep = p.Endpoint() // not reached: the own set's picks are of its endpoints
		}
	} else {
		ep = p.Endpoint()
	}
	addr := ep.Addr
	if own := t.own.Load(); own != nil {
		// A shared Balancer: this Transport's address for the endpoint,
		// whichever adapter set the Balancer's last.
		if a, ok := (*own)[p.ID()]; ok {
			addr = a
		}
	}
	scheme, host, ok := t.addrs.split(addr)
	if !ok {
		// Only through a shared Balancer's own endpoints (Update skips
		// such Addrs): whoever else gave them set it.
		return nil, fmt.Errorf("inferlb: endpoint %q: Addr %q is not host:port or http(s)://host[:port] (a Transport sharing a Balancer with another adapter needs Endpoints of its own, with HTTP addresses)", ep.Key(), addr)
	}
	out, u := &c.out, &c.outURL // out is a copy of r already
	if !first {
		out, u = new(http.Request), new(url.URL)
		*out = *r
	}
	*u = *r.URL
	u.Host = host
	if strings.HasPrefix(u.Opaque, "//") {
		// "//host/path", net/http's way to send a path as escaped: it
		// goes in the request line in absolute form, authority and all,
		// and a server takes that authority over the Host header. It
		// names the endpoint too, not the logical host.
		rest := u.Opaque[2:]
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			rest = rest[i:]
		} else {
			rest = ""
		}
		u.Opaque = "//" + host + rest
	}
	switch {
	case scheme != "":
		u.Scheme = scheme
	case u.Scheme == "":
		u.Scheme = "http"
	}
	out.URL = u
	// The logical host ("llm.internal") names no server; send the endpoint's
	// own address unless the caller set an explicit, different Host.
	if r.Host == "" || r.Host == r.URL.Host {
		out.Host = ""
	}
	out.Body, out.ContentLength, out.GetBody = body.rc, body.length, getBody
	switch {
	case t.cfg.loadReports:
		h := r.Header.Clone()
		if h == nil {
			h = make(http.Header, 1)
		}
		h[loadFormatHeader] = []string{"text"}
		out.Header = h
	case r.Header == nil:
		// http.Client fills in a nil Header; net/http's Transport refuses
		// one, which a direct RoundTrip call may pass.
		out.Header = make(http.Header)
	}
	return out, nil
}

// errMalformed is the Outcome.Err of an attempt that failed on a request
// net/http will not send: a method or header field name that is not a
// token, a header value with control characters (a gateway copying a
// client's input into a header), and the like (see malformed). It wraps
// context.Canceled, which the balancer reads as saying nothing about the
// endpoint: counted as failures, such requests tripped the breaker of each
// endpoint they were sent and failed over to in turn, so a client could
// take a healthy fleet out of rotation.
var errMalformed = fmt.Errorf("inferlb: the request is one net/http does not send (its method, a header or trailer field, its URL or scheme, a body not of its ContentLength, a header HTTP/2 forbids): %w", context.Canceled)

// malformed reports whether r is a request net/http's Transport refuses to
// send, by the checks it makes (with httpguts) before and while it writes
// one: a scheme other than http and https, a method or header or trailer
// field that is not valid, a control character in the request URI, and
// over HTTP/2 the fields it forbids (http2Refused). (A nil
// Header never reaches Base: see outgoing.) It runs only after Base
// failed, never on a call that succeeds.
func malformed(r *http.Request) bool {
	if r.URL.Scheme != "http" && r.URL.Scheme != "https" {
		return true
	}
	if r.Method != "" && !httpguts.ValidHeaderFieldName(r.Method) { // a method is a token too
		return true
	}
	if badFields(r.Header) || badFields(r.Trailer) {
		return true
	}
	if strings.ContainsFunc(r.URL.RequestURI(), func(c rune) bool { return c < ' ' || c == 0x7f }) {
		return true
	}
	return http2Refused(r)
}

// http2Refused reports whether net/http would refuse r over HTTP/2, which
// it negotiates for https unless the request needs HTTP/1.1 (a websocket
// upgrade). HTTP/2 forbids connection-specific header fields (RFC 9113
// 8.2.2): an Upgrade (curl --http2 sends "Upgrade: h2c" on a cleartext
// URL, and a gateway copying a client's headers passes it on), a
// Connection other than close or keep-alive, a Transfer-Encoding other
// than chunked; and net/http's HTTP/2 client also refuses a Host header
// that is not valid (HTTP/1.1 leaves it out) and trailer fields that only
// the framing may set. These are the checks of net/http's
// internal/httpcommon, in the same order of fields.
func http2Refused(r *http.Request) bool {
	h := r.Header
	if r.URL.Scheme != "https" || http1Only(h) {
		return false
	}
	if vv := h["Upgrade"]; len(vv) > 0 && vv[0] != "" && vv[0] != "chunked" {
		return true
	}
	if vv := h["Transfer-Encoding"]; len(vv) > 1 || len(vv) == 1 && vv[0] != "" && vv[0] != "chunked" {
		return true
	}
	if vv := h["Connection"]; len(vv) > 1 || len(vv) == 1 && vv[0] != "" && !strings.EqualFold(vv[0], "close") && !strings.EqualFold(vv[0], "keep-alive") {
		return true
	}
	host := r.Host
	if host == "" {
		host = r.URL.Host
	}
	if host, err := httpguts.PunycodeHostPort(host); err != nil || !httpguts.ValidHostHeader(host) {
		return true
	}
	for k := range r.Trailer {
		switch textproto.CanonicalMIMEHeaderKey(k) {
		case "Transfer-Encoding", "Trailer", "Content-Length":
			return true
		}
	}
	return false
}

// http1Only reports whether net/http sends a request with header h over
// HTTP/1.1 even where HTTP/2 is negotiated: a websocket upgrade.
func http1Only(h http.Header) bool {
	var conn, up string
	if vv := h["Connection"]; len(vv) > 0 {
		conn = vv[0]
	}
	if vv := h["Upgrade"]; len(vv) > 0 {
		up = vv[0]
	}
	return httpguts.HeaderValuesContainsToken([]string{conn}, "upgrade") && strings.EqualFold(up, "websocket")
}

// badFields reports whether h has a field name or value net/http refuses.
func badFields(h http.Header) bool {
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return true
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return true
			}
		}
	}
	return false
}

// quoteModel quotes a model name for an error message. The name is request
// data of any size (up to MaxPeek), and %q writes an invalid byte as four:
// quoted whole, a crafted model made every refused call's error, which
// callers log and may return, megabytes long. Real names are far shorter
// than maxInternModel bytes.
func quoteModel(m string) string {
	if len(m) <= maxInternModel {
		return strconv.Quote(m)
	}
	return fmt.Sprintf("%q... (%d bytes)", m[:maxInternModel], len(m))
}
