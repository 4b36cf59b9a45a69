package httpbalancer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/inferlb/inferlb"
)

// errNoAddrs is reported when a resolution succeeds with nothing in it (of
// Discovery.Network's family).
var errNoAddrs = errors.New("no addresses")

// family returns addrs in canonical form ("fd00::1", not "fd00:0::1"),
// keeping those of network ("ip4", "ip6"; "" or "ip" for both) and any that
// is not an IP address (a resolver's answer is one; the dial reports it).
// It reuses addrs.
func family(addrs []string, network string) []string {
	out := addrs[:0]
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			ip = ip.Unmap()
			if network == "ip4" && !ip.Is4() || network == "ip6" && !ip.Is6() {
				continue
			}
			a = ip.String()
		}
		out = append(out, a)
	}
	return out
}

// startDiscovery resolves d.Target once, synchronously, so the first
// requests find endpoints, then every d.Interval until Close.
func (t *Transport) startDiscovery(d Discovery) {
	host, port, _ := net.SplitHostPort(d.Target) // validated in resolve
	if d.Interval == 0 {
		d.Interval = DefaultDiscoveryInterval
	}
	if d.LookupHost == nil {
		d.LookupHost = net.DefaultResolver.LookupHost
	}
	d.Labels = maps.Clone(d.Labels)
	ctx, cancel := context.WithCancel(context.Background())
	t.stopDiscovery = cancel
	t.discoveryDone = make(chan struct{})
	t.resolveOnce(ctx, &d, host, port)
	go func() {
		defer close(t.discoveryDone)
		tick := time.NewTicker(d.Interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				t.resolveOnce(ctx, &d, host, port)
			}
		}
	}()
}

// resolveOnce looks the name up and applies the result. A failed or empty
// lookup keeps the previous set: DNS hiccups are far more common than a
// whole fleet vanishing, and an empty set would fail every request.
func (t *Transport) resolveOnce(ctx context.Context, d *Discovery, host, port string) {
	lctx, cancel := context.WithTimeout(ctx, d.Interval)
	addrs, err := d.LookupHost(lctx, host)
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
			d.OnError(fmt.Errorf("inferlb: httpbalancer: resolving %q: %w; keeping the previous endpoints", host, err))
		}
		return
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	eps := make([]inferlb.Endpoint, len(addrs))
	for i, a := range addrs {
		addr := net.JoinHostPort(a, port)
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
	t.discovered = eps
	err = t.applyLocked()
	t.mu.Unlock()
	if err != nil && d.OnError != nil { // outside mu: OnError may call Update
		d.OnError(err)
	}
}
