package httpbalancer

import (
	"context"
	"hash/maphash"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"

	"golang.org/x/net/idna"

	"github.com/inferlb/inferlb/balancer"
)

// dialMarks remembers, per address the default Base dials, when its
// latest dial began, so that an embedding or rerank call can tell that a
// connection to its endpoint was set up while it was out, and report its
// latency as one that may include the setup (inferlb.Outcome.Dialed).
//
// Why not per call: net/http tells a request whether its connection was
// new only through an httptrace.ClientTrace in its context, which costs
// allocations per call (the trace and the context that carries it); and a
// dial started for one request may serve another. Here a dial costs a
// clock read and a few atomic stores, and a latency-scored call, at its
// headers, two string hashes and an atomic load or two; a generation call
// nothing. A call that met a dial for its endpoint's address (net/http
// dials for every request that finds no idle connection, so any call that
// waited for a new one began a dial after it started) is marked, and so is
// one sent on a warm connection while another's dial began: the balancer
// holds such a sample aside and counts the smaller of it and the next
// (see inferlb.Outcome.Dialed), which is never below what the endpoint's
// calls take, so marking a call that paid no setup only makes its sample
// count with the next one's.
//
// Only the Transport's own Base is watched (Options.Base nil): a Base of
// the caller's may dial anything, or nothing (a middleware), under any
// name. Through a proxy (HTTP_PROXY), net/http dials the proxy, and no
// call is marked.
//
// Concurrency: clock and seed are set before the first call (resolve,
// bind) and not changed; each slot is a pair of atomics. A call that
// reads a slot another address's dial is taking over may be marked
// wrongly, or not be marked: a sample held aside that need not be, or one
// counted with its setup in it, as before there were marks.
type dialMarks struct {
	seed  maphash.Seed
	clock balancer.Clock // the Balancer's: the one a call's start is read on
	slots [dialSlots]dialSlot
}

// dialSlots and dialProbe size the table: an address takes one of the
// dialProbe slots from its hash on, the oldest when all are taken (4 KiB
// per Transport; endpoints that left give up their slots to new ones).
const (
	dialSlots = 256
	dialProbe = 4
)

type dialSlot struct {
	key atomic.Uint64 // the address's hash (never 0); 0 for a free slot
	at  atomic.Int64  // unix ns on the Transport's clock when its latest dial began
}

func newDialMarks() *dialMarks { return &dialMarks{seed: maphash.MakeSeed()} }

// key hashes a dialed host and port; never 0.
func (d *dialMarks) key(host, port string) uint64 {
	k := maphash.String(d.seed, host)*31 + maphash.String(d.seed, port)
	return max(k, 1)
}

// mark notes that a dial to addr ("host:port", as net/http dials) begins now.
func (d *dialMarks) mark(addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	k, now := d.key(host, port), d.clock.Now().UnixNano()
	i := k % dialSlots
	var oldest *dialSlot
	for j := range uint64(dialProbe) {
		s := &d.slots[(i+j)%dialSlots]
		switch cur := s.key.Load(); {
		case cur == k:
			s.at.Store(now)
			return
		case cur == 0 && s.key.CompareAndSwap(0, k):
			s.at.Store(now)
			return
		case oldest == nil || s.at.Load() < oldest.at.Load():
			oldest = s
		}
	}
	oldest.at.Store(now)
	oldest.key.Store(k)
}

// since reports whether a dial to the address net/http dials for u (its
// host, in ASCII, and port, the scheme's when u has none) began at or
// after startNs.
func (d *dialMarks) since(u *url.URL, startNs int64) bool {
	if u == nil {
		return false
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	if !isASCII(host) {
		// What net/http dials (its idnaASCII); a rare name, and the
		// only case that allocates.
		if a, err := idna.Lookup.ToASCII(host); err == nil {
			host = a
		}
	}
	k := d.key(host, port)
	i := k % dialSlots
	for j := range uint64(dialProbe) {
		s := &d.slots[(i+j)%dialSlots]
		if s.key.Load() == k {
			return s.at.Load() >= startNs
		}
	}
	return false
}

// watch makes t mark each dial it begins, plain or TLS (DialTLSContext,
// when t has one, dials https endpoints in its place).
func (d *dialMarks) watch(t *http.Transport) {
	dial := t.DialContext
	if dial == nil {
		//lint:ignore SA1019 honoured as net/http honours it: a DefaultTransport set up with Dial
		if old := t.Dial; old != nil {
			dial = func(_ context.Context, network, addr string) (net.Conn, error) { return old(network, addr) }
		} else {
			var zero net.Dialer // what net/http dials with when it has neither
			dial = zero.DialContext
		}
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mark(addr)
		return dial(ctx, network, addr)
	}
	tlsDial := t.DialTLSContext
	//lint:ignore SA1019 honoured as net/http honours it: a DefaultTransport set up with DialTLS
	if tlsDial == nil && t.DialTLS != nil {
		//lint:ignore SA1019 as above
		old := t.DialTLS
		tlsDial = func(_ context.Context, network, addr string) (net.Conn, error) { return old(network, addr) }
	}
	if tlsDial != nil {
		t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			d.mark(addr)
			return tlsDial(ctx, network, addr)
		}
	}
}
