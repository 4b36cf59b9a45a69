package grpcbalancer

import (
	"maps"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/grpc/resolver"

	"github.com/inferlb/inferlb"
)

type endpointKey struct{}

// endpointAttr is the value stored under endpointKey. gRPC compares
// attribute values, so it is a pointer with an Equal method (Labels is a
// map, which == cannot compare). It is immutable once stored.
type endpointAttr struct {
	id     string
	weight float64
	labels map[string]string
}

// Equal implements the interface attributes.Attributes.Equal looks for.
func (a *endpointAttr) Equal(o any) bool {
	b, ok := o.(*endpointAttr)
	if !ok {
		return false
	}
	if a == nil || b == nil {
		return a == b
	}
	return a.id == b.id && a.weight == b.weight && maps.Equal(a.labels, b.labels)
}

// WithEndpoint returns a copy of ep that carries what the balancer should
// know about it, for resolvers that have more than addresses to say:
//
//   - info.ID names the endpoint's live state in the Balancer. By default it
//     is the smallest of the endpoint's addresses (so a resolver may list
//     them in any order), or with "idByHost" that address's host. Set it
//     when the same replica is also reached through another transport
//     (say, HTTP on another port) with a shared Balancer, so both see one
//     load, or when addresses change while the replica stays.
//   - info.Weight is the relative capacity (0 means 1).
//   - info.Labels carry facts such as "model" (the models served, for
//     model subsets), "version", or "dp_group" (the data-parallel engine a
//     rank belongs to; see balancer.Options.DPGroupLabel). Only "model" and
//     "dp_group" change routing: a version is routed as a model name of its own
//     (see inferlb.Endpoint).
//
// info.Addr is ignored: the address is always ep's own.
//
// With a resolver that gives addresses only (dns:///, passthrough:///),
// say the same in the service config's "endpoints", by address (see
// Service config in the package doc). For an endpoint that carries
// WithEndpoint's description, that description counts, whole: the config's
// entry for its address is not merged into it.
func WithEndpoint(ep resolver.Endpoint, info inferlb.Endpoint) resolver.Endpoint {
	ep.Attributes = ep.Attributes.WithValue(endpointKey{}, &endpointAttr{
		id:     info.ID,
		weight: info.Weight,
		labels: maps.Clone(info.Labels),
	})
	return ep
}

// endpointOf describes ep for the Balancer. The ID is the WithEndpoint ID
// (or that of the config's "endpoints" entry, see attrOf), else its naming
// address (namingAddr), or with byHost that address's host. Addr is the
// naming address too. cfg may be nil.
func endpointOf(ep resolver.Endpoint, cfg *lbConfig) inferlb.Endpoint {
	var e inferlb.Endpoint
	e.Addr = namingAddr(ep.Addresses)
	if a := attrOf(ep, cfg); a != nil {
		e.ID, e.Weight, e.Labels = a.id, a.weight, a.labels
	}
	if e.ID == "" {
		e.ID = defaultID(e.Addr, cfg != nil && cfg.idByHost)
	}
	return e
}

// endpointID is endpointOf(ep, cfg).ID without building the rest.
func endpointID(ep resolver.Endpoint, cfg *lbConfig) string {
	if a := attrOf(ep, cfg); a != nil && a.id != "" {
		return a.id
	}
	if len(ep.Addresses) > 0 {
		return defaultID(namingAddr(ep.Addresses), cfg != nil && cfg.idByHost)
	}
	return ""
}

// attrOf is what ep's resolver, else the config's "endpoints", says of
// it; nil when neither says anything. WithEndpoint's attributes win whole,
// not field by field: the resolver describes the endpoint as it is at this
// update, while a config entry is written ahead for resolvers that carry
// nothing (DNS, passthrough), and an ID from one with models from the
// other would describe an endpoint nobody wrote down. Of an endpoint's
// addresses with a config entry, the smallest (as a string) counts, so the
// order a resolver lists them in changes nothing (see namingAddr). It runs
// on resolver updates and child state changes, never on a pick.
func attrOf(ep resolver.Endpoint, cfg *lbConfig) *endpointAttr {
	if a, ok := ep.Attributes.Value(endpointKey{}).(*endpointAttr); ok && a != nil {
		return a
	}
	if cfg == nil || cfg.endpoints == nil {
		return nil
	}
	var found *endpointAttr
	least := ""
	for _, ad := range ep.Addresses {
		key, ok := canonicalAddr(ad.Addr)
		if !ok {
			continue
		}
		if a := cfg.endpoints[key]; a != nil && (found == nil || ad.Addr < least) {
			found, least = a, ad.Addr
		}
	}
	return found
}

// canonicalAddr spells a "host:port" address one way, so that a config's
// "endpoints" key matches the resolver's address however either writes
// it: an IP address in its standard form ("fd00::5", "10.0.0.5" for
// "::ffff:10.0.0.5"), a name in lower case (names are case-insensitive),
// the port as a plain number ("80" for "080"). It reports false for
// anything else: no port, a port that is not 1..65535, an empty host, or a
// host with spaces, control characters or '/' (a unix socket path).
func canonicalAddr(s string) (string, bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '/' }) {
		return "", false
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	} else {
		host = strings.ToLower(host)
	}
	return net.JoinHostPort(host, strconv.FormatUint(n, 10)), true
}

// namingAddr is the address an endpoint is named by: the smallest of its
// addresses (as strings), "" when it has none. Not the first: resolvers
// need not keep an order (DNS answers come in any order, and a dual-stack
// endpoint may list either family first), and endpointsharding keeps the
// child of an endpoint whose addresses were reordered, so its live state
// in the core must stay too.
func namingAddr(addrs []resolver.Address) string {
	if len(addrs) == 0 {
		return ""
	}
	least := addrs[0].Addr
	for _, a := range addrs[1:] {
		least = min(least, a.Addr)
	}
	return least
}

// defaultID names an endpoint by its address, or with byHost by the
// address's host alone (an address without a port is its own host).
func defaultID(addr string, byHost bool) string {
	if byHost {
		if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
			return host
		}
	}
	return addr
}

// sameEndpoints reports whether two membership lists are the same set, so
// an unchanged resolver update does not rebuild the core's snapshot. Order
// does not count: DNS servers rotate a name's records from one answer to
// the next, and a Kubernetes headless service lists its pods in no set
// order. A list with a repeated ID is compared in order (the core keeps
// the first of each ID, so there the order tells which one counts).
func sameEndpoints(a, b []inferlb.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	inOrder := true
	for i := range a {
		if !sameEndpoint(&a[i], &b[i]) {
			inOrder = false
			break
		}
	}
	if inOrder {
		return true
	}
	byID := make(map[string]*inferlb.Endpoint, len(a))
	for i := range a {
		byID[a[i].ID] = &a[i]
	}
	if len(byID) != len(a) {
		return false
	}
	seen := make(map[string]bool, len(b))
	for i := range b {
		x, ok := byID[b[i].ID]
		if !ok || seen[b[i].ID] || !sameEndpoint(x, &b[i]) {
			return false
		}
		seen[b[i].ID] = true
	}
	return true
}

func sameEndpoint(x, y *inferlb.Endpoint) bool {
	return x.ID == y.ID && x.Addr == y.Addr && x.Weight == y.Weight && maps.Equal(x.Labels, y.Labels)
}
