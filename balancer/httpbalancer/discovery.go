package httpbalancer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferlb/inferlb"
)

// errNoAddrs is reported when a resolution succeeds with nothing in it (of
// Discovery.Network's family).
var errNoAddrs = errors.New("no addresses")

// family returns addrs in canonical form ("fd00::1", not "fd00:0::1"),
// keeping those of network ("ip4", "ip6"; "" or "ip" for both) and any that
// is not an IP address but can be a name (a resolver's answer is one; the
// dial reports it).
// The result is a new slice, which the caller may sort and compact:
// addrs is the LookupHost's, which a caching resolver may hand out again.
func family(addrs []string, network string) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if !hostLike(a) {
			continue // from a custom LookupHost: "" would dial this machine
		}
		if ip, err := netip.ParseAddr(a); err == nil {
			ip = ip.Unmap()
			if network == "ip4" && !ip.Is4() || network == "ip6" && !ip.Is6() {
				continue
			}
			a = ip.String()
		} else if strings.ContainsRune(a, ':') {
			// Not an address, and no name has a colon: a custom
			// LookupHost's "10.0.0.5:8000" (host and port, from an SRV
			// lookup). Joined with the port it became the endpoint
			// "[10.0.0.5:8000]:8000", which dials nothing and which no
			// URL parses (Endpoints' telemetry targets).
			continue
		}
		out = append(out, a)
	}
	return out
}

// hostLike reports whether a lookup's answer can be a host to dial: not
// empty (":8000" dials this machine), no spaces or control characters,
// nothing that would end the host part of a URL. Answers of
// net.Resolver.LookupHost always are; a custom LookupHost's may not be.
func hostLike(a string) bool {
	return a != "" && !strings.ContainsFunc(a, func(r rune) bool {
		return r <= ' ' || r == 0x7f || strings.ContainsRune("/?#@[]", r)
	})
}

// graceIntervals is Discovery.Grace's default, in Intervals.
const graceIntervals = 3

// discoverer is the state of one Transport's discovery.
//
// Concurrency: t, d, host, port and keep are immutable once
// startDiscovery has set them. missed belongs to whoever runs resolve:
// NewTransport for the first resolution, then the discovery goroutine,
// which the go statement orders after it. The Transport's mu guards only
// what resolve hands over (Transport.discovered).
type discoverer struct {
	t          *Transport
	d          Discovery
	host, port string
	// keep is how many answers in a row may leave an address out before it
	// leaves: Grace in Intervals, rounded up; 0 without Grace.
	keep int
	// missed holds every address served, with how many answers in a row
	// have left it out (0: it is in the last one). Nothing else is kept, so
	// it is as large as the set served.
	missed map[string]int
}

// startDiscovery resolves d.Target once, synchronously, so the first
// requests find endpoints, then every d.Interval until Close.
func (t *Transport) startDiscovery(d Discovery) {
	host, port, _ := net.SplitHostPort(d.Target) // validated in resolve
	if n, err := net.LookupPort("tcp", port); err == nil {
		// The endpoints' Addrs and IDs name it as a number, as Update
		// requires: "10.0.0.5:80", not "10.0.0.5:http" (which no URL
		// parses) or "10.0.0.5:080".
		port = strconv.Itoa(n)
	}
	if d.Interval == 0 {
		d.Interval = DefaultDiscoveryInterval
	}
	if d.Grace == 0 {
		d.Grace = graceIntervals * d.Interval
	}
	if d.LookupHost == nil {
		d.LookupHost = net.DefaultResolver.LookupHost
	}
	d.Labels = maps.Clone(d.Labels)
	ds := &discoverer{t: t, d: d, host: host, port: port}
	if d.Grace > 0 {
		ds.keep = int(d.Grace / d.Interval)
		if d.Grace%d.Interval != 0 {
			ds.keep++
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.stopDiscovery = cancel
	t.discoveryDone = make(chan struct{})
	ds.resolve(ctx)
	go func() {
		defer close(t.discoveryDone)
		tick := time.NewTicker(d.Interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				ds.resolve(ctx)
			}
		}
	}()
}

// resolve looks the name up and applies the result. A failed or empty
// lookup keeps the previous set: DNS hiccups are far more common than a
// whole fleet vanishing, and an empty set would fail every request.
func (ds *discoverer) resolve(ctx context.Context) {
	d, t := &ds.d, ds.t
	lctx, cancel := context.WithTimeout(ctx, d.Interval)
	addrs, err := d.LookupHost(lctx, ds.host)
	cancel()
	if ctx.Err() != nil {
		return // closing
	}
	if err == nil {
		addrs = family(addrs, d.Network)
		if len(addrs) == 0 {
			err = errNoAddrs
		}
	}
	if err != nil {
		if d.OnError != nil {
			d.OnError(fmt.Errorf("inferlb: httpbalancer: resolving %q: %w; keeping the previous endpoints", ds.host, err))
		}
		return
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	addrs = ds.retain(addrs)
	eps := make([]inferlb.Endpoint, len(addrs))
	for i, a := range addrs {
		addr := net.JoinHostPort(a, ds.port)
		if d.Scheme != "" {
			addr = d.Scheme + "://" + addr
		}
		eps[i] = inferlb.Endpoint{ID: addr, Addr: addr, Labels: d.Labels}
		if d.IDByHost {
			eps[i].ID = a
		}
	}
	t.mu.Lock()
	if slices.EqualFunc(eps, t.discovered, func(a, b inferlb.Endpoint) bool { return a.Addr == b.Addr }) {
		t.mu.Unlock()
		return
	}
	err = t.applyLocked(t.static, eps)
	t.mu.Unlock()
	if err != nil && d.OnError != nil { // outside mu: OnError may call Update
		d.OnError(err)
	}
}

// retain returns the set to serve for a good answer (sorted, without
// duplicates): the answer, and the addresses served before that it
// leaves out, while no more than keep answers in a row have left each
// out (Discovery.Grace). Those are at most as many as the answer has,
// the ones left out the fewest times first, so that answers which name
// new addresses each time (a resolver gone wrong, or hostile) grow the set
// to twice an answer at most, and replicas that are gone cannot outnumber
// the ones answered (so they alone cannot bring the Balancer's default
// PanicThreshold, one half, into play). It reuses answer.
func (ds *discoverer) retain(answer []string) []string {
	next := make(map[string]int, 2*len(answer))
	for _, a := range answer {
		next[a] = 0
	}
	var left []string
	for a, n := range ds.missed {
		if _, ok := next[a]; !ok && n < ds.keep {
			left = append(left, a)
		}
	}
	slices.SortFunc(left, func(a, b string) int {
		return cmp.Or(cmp.Compare(ds.missed[a], ds.missed[b]), strings.Compare(a, b))
	})
	left = left[:min(len(left), len(answer))]
	for _, a := range left {
		next[a] = ds.missed[a] + 1
	}
	ds.missed = next
	if len(left) == 0 {
		return answer
	}
	out := append(answer, left...)
	slices.Sort(out)
	return out
}
