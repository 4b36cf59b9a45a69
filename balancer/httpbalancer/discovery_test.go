package httpbalancer_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// fakeDNS answers LookupHost from a table the test edits.
type fakeDNS struct {
	mu      sync.Mutex
	addrs   []string
	err     error
	lookups int
}

func (d *fakeDNS) set(err error, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs, d.err = addrs, err
}

func (d *fakeDNS) LookupHost(ctx context.Context, host string) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lookups++
	if host != "vllm.svc" {
		return nil, errors.New("no such host")
	}
	return slices.Clone(d.addrs), d.err
}

func ids(tr *httpbalancer.Transport) []string {
	var out []string
	for _, s := range tr.Balancer().Stats() {
		out = append(out, s.ID)
	}
	return out
}

// TestDiscovery: the name is resolved at start and every Interval; a failed
// or empty answer keeps the last good set; static endpoints stay alongside;
// Close stops the loop (synctest fails the test if a goroutine outlives it).
// Each good answer is served as it came (Grace < 0); the tests in
// discovery_grace_test.go cover Grace.
func TestDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dns := &fakeDNS{}
		dns.set(nil, "10.0.0.2", "10.0.0.1", "10.0.0.1")
		var errMu sync.Mutex
		var errs []error
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{{ID: "static", Addr: "10.9.9.9:80"}},
			Discovery: &httpbalancer.Discovery{
				Target:     "vllm.svc:8000",
				Scheme:     "https",
				Interval:   10 * time.Second,
				Grace:      -1,
				LookupHost: dns.LookupHost,
				Labels:     map[string]string{"model": "llama"},
				OnError:    func(err error) { errMu.Lock(); errs = append(errs, err); errMu.Unlock() },
			},
		})
		require.NoError(t, err)
		// Resolved before NewTransport returned: sorted, deduplicated, with
		// scheme, port and labels.
		assert.Equal(t, []string{"https://10.0.0.1:8000", "https://10.0.0.2:8000", "static"}, ids(tr))

		dns.set(nil, "10.0.0.3")
		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		assert.Len(t, ids(tr), 3, "not before the interval")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, []string{"https://10.0.0.3:8000", "static"}, ids(tr))

		dns.set(errors.New("SERVFAIL"))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		dns.set(nil) // empty answer
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"https://10.0.0.3:8000", "static"}, ids(tr), "last good set kept")
		errMu.Lock()
		defer errMu.Unlock()
		require.Len(t, errs, 2)
		assert.ErrorContains(t, errs[0], "SERVFAIL")
		assert.ErrorContains(t, errs[1], "no addresses")

		// Update replaces the static half only.
		require.NoError(t, tr.Update(nil))
		assert.Equal(t, []string{"https://10.0.0.3:8000"}, ids(tr))

		require.NoError(t, tr.Close())
		require.NoError(t, tr.Close(), "Close is idempotent")
		dns.mu.Lock()
		before := dns.lookups
		dns.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		dns.mu.Lock()
		defer dns.mu.Unlock()
		assert.Equal(t, before, dns.lookups, "no lookups after Close")
	})
}

// TestDiscoveryLookupBounded: a resolver that hangs is cut off after
// Interval, and Close does not wait for it longer than that.
func TestDiscoveryLookupBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var errs []error
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{
			Discovery: &httpbalancer.Discovery{
				Target:   "vllm.svc:8000",
				Interval: 5 * time.Second,
				LookupHost: func(ctx context.Context, host string) ([]string, error) {
					<-ctx.Done()
					return nil, ctx.Err()
				},
				OnError: func(err error) { errs = append(errs, err) },
			},
		})
		require.NoError(t, err)
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
		assert.Empty(t, ids(tr))
		require.NoError(t, tr.Close())
	})
}

// With IDByHost, discovered replicas are named by address alone, so a gRPC
// channel on the same Balancer that names them by host too ("idByHost")
// shares their state although it reaches them on another port.
func TestDiscoveryIDByHostSharesStateWithAnotherPort(t *testing.T) {
	dns := &fakeDNS{}
	dns.set(nil, "10.0.0.1", "10.0.0.2")
	b := balancer.New(balancer.Options{})
	tr, err := httpbalancer.NewTransport(httpbalancer.Options{
		Balancer:  b,
		Discovery: &httpbalancer.Discovery{Target: "vllm.svc:8000", LookupHost: dns.LookupHost, IDByHost: true},
	})
	require.NoError(t, err)
	defer tr.Close()
	grpcSide, err := b.NewMembership()
	require.NoError(t, err)
	defer grpcSide.Close()
	require.NoError(t, grpcSide.Update([]inferlb.Endpoint{{ID: "10.0.0.1", Addr: "10.0.0.1:8001"}, {ID: "10.0.0.2", Addr: "10.0.0.2:8001"}}))
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.2"}, ids(tr), "one state per replica, not one per port")
	p, err := grpcSide.Pick(&inferlb.Request{})
	require.NoError(t, err)
	defer p.Done(inferlb.Outcome{})
	var inFlight int64
	for _, s := range b.Stats() {
		inFlight += s.InFlight
	}
	assert.EqualValues(t, 1, inFlight, "the gRPC call shows on the replica the HTTP side routes over")
}

// TestDiscoveryAddressFamily: in a dual-stack cluster a headless service
// answers each pod's IPv4 and IPv6 address, and each became an endpoint of
// its own, the pod's load, keys and breaker split over two states. Network
// keeps one family. An address spelled two ways ("fd00::1" and
// "fd00:0:0::1", from a custom resolver) is one endpoint.
func TestDiscoveryAddressFamily(t *testing.T) {
	for _, tc := range []struct {
		network string
		want    []string
	}{
		{"", []string{"10.0.0.1:8000", "10.0.0.2:8000", "[fd00::1]:8000", "[fd00::2]:8000"}},
		{"ip", []string{"10.0.0.1:8000", "10.0.0.2:8000", "[fd00::1]:8000", "[fd00::2]:8000"}},
		{"ip4", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"ip6", []string{"[fd00::1]:8000", "[fd00::2]:8000"}},
	} {
		synctest.Test(t, func(t *testing.T) {
			dns := &fakeDNS{}
			dns.set(nil, "fd00::2", "10.0.0.2", "fd00:0:0::1", "10.0.0.1", "fd00::1")
			tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
				Target: "vllm.svc:8000", Network: tc.network, LookupHost: dns.LookupHost}})
			require.NoError(t, err)
			defer tr.Close()
			got := ids(tr)
			slices.Sort(got)
			assert.Equal(t, tc.want, got, "Network %q", tc.network)
		})
	}
	_, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
		Target: "vllm.svc:8000", Network: "tcp4", LookupHost: (&fakeDNS{}).LookupHost}})
	require.ErrorContains(t, err, "Discovery.Network")
}

// A custom LookupHost's answers that cannot be hosts are left out: "" made
// the endpoint ":8000", which net/http dials on this machine.
func TestDiscoveryLeavesOutAnswersThatAreNoHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dns := &fakeDNS{}
		dns.set(nil, "", "10.0.0.1", "a b", "vllm-0.vllm.svc", "x/y", "10.0.0.2\n")
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
			Target: "vllm.svc:8000", LookupHost: dns.LookupHost}})
		require.NoError(t, err)
		defer tr.Close()
		got := ids(tr)
		slices.Sort(got)
		assert.Equal(t, []string{"10.0.0.1:8000", "vllm-0.vllm.svc:8000"}, got)
	})
}

// A custom LookupHost that answers host and port ("10.0.0.1:8000", as an
// adapter over SRV records or a service registry does) had each answer
// joined with the Target's port into "[10.0.0.1:8000]:8000": an endpoint
// that every call failed on at dial time, tripping its breaker, with no
// word to OnError, and whose Addr no URL parses (the telemetry targets
// built from Endpoints failed too). Such answers are no hosts: they are
// left out, and an answer of nothing else is reported as empty.
func TestDiscoveryLeavesOutAnswersWithAPort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dns := &fakeDNS{}
		dns.set(nil, "10.0.0.1:8000", "vllm-0.vllm.svc:9000", "fd00::1", "10.0.0.2")
		var mu sync.Mutex
		var errs []error
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
			Target: "vllm.svc:8000", Interval: time.Second, LookupHost: dns.LookupHost,
			OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }}})
		require.NoError(t, err)
		defer tr.Close()
		got := ids(tr)
		slices.Sort(got)
		assert.Equal(t, []string{"10.0.0.2:8000", "[fd00::1]:8000"}, got)
		for _, e := range tr.Endpoints() {
			_, err := url.Parse("http://" + e.Addr + "/metrics")
			assert.NoError(t, err, e.Addr)
		}
		assert.Empty(t, errs)

		dns.set(nil, "10.0.0.3:8000")
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, errs, 1)
		assert.ErrorContains(t, errs[0], "no addresses")
	})
}

// A custom LookupHost may hand out a slice it keeps (a caching resolver):
// discovery reads it and leaves it as it was. It canonicalized, filtered
// and sorted the answer in place, under the resolver's other readers.
func TestDiscoveryLeavesTheLookupsAnswerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cached := []string{"fd00:0:0::2", "10.0.0.2", "", "10.0.0.1", "10.0.0.1"}
		want := slices.Clone(cached)
		lookup := func(context.Context, string) ([]string, error) { return cached, nil }
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{
			Target: "vllm.svc:8000", LookupHost: lookup}})
		require.NoError(t, err)
		defer tr.Close()
		got := ids(tr)
		slices.Sort(got)
		assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "[fd00::2]:8000"}, got)
		assert.Equal(t, want, cached, "the resolver's slice was rewritten")
	})
}

// TestTransportEndpoints: Endpoints lists what the Transport routes to,
// static and discovered, so telemetry sources can follow Discovery (helper
// 61's adoption review found no way to: Stats has IDs only).
func TestTransportEndpoints(t *testing.T) {
	dns := &fakeDNS{}
	dns.set(nil, "10.0.0.7", "10.0.0.8")
	tr := newTransport(t, httpbalancer.Options{
		Endpoints: []inferlb.Endpoint{{ID: "static", Addr: "10.0.0.1:8000"}},
		Discovery: &httpbalancer.Discovery{Target: "vllm.svc:8000", LookupHost: dns.LookupHost},
	})
	keys := func() []string {
		var out []string
		for _, e := range tr.Endpoints() {
			out = append(out, e.Key()+"="+e.Addr)
		}
		slices.Sort(out)
		return out
	}
	assert.Equal(t, []string{"10.0.0.7:8000=10.0.0.7:8000", "10.0.0.8:8000=10.0.0.8:8000", "static=10.0.0.1:8000"}, keys())
	require.NoError(t, tr.Update([]inferlb.Endpoint{{Addr: "10.0.0.2:8000"}}))
	assert.Equal(t, []string{"10.0.0.2:8000=10.0.0.2:8000", "10.0.0.7:8000=10.0.0.7:8000", "10.0.0.8:8000=10.0.0.8:8000"}, keys())
	eps := tr.Endpoints()
	was := eps[0].Addr
	eps[0].Addr = "changed"
	assert.Equal(t, was, tr.Endpoints()[0].Addr, "the caller's copy")
}

// TestDiscoveryPortIsANumber: a Target's port may be a service name
// ("http") or a number spelt otherwise ("08000", "+8000"), as validation
// lets it; the endpoints found get it as a number. They used to get it as
// written ("10.0.0.1:http"): an Addr that Update itself refuses, that no
// URL parses (so the telemetry targets built from Endpoints, as its doc
// shows, failed), and an ID no other adapter names that replica by. Port
// 0, which LookupPort accepts, dials nothing and is refused.
func TestDiscoveryPortIsANumber(t *testing.T) {
	dns := &fakeDNS{}
	dns.set(nil, "10.0.0.1")
	for port, want := range map[string]string{"http": "10.0.0.1:80", "08000": "10.0.0.1:8000", "+8000": "10.0.0.1:8000", "8000": "10.0.0.1:8000"} {
		tr := newTransport(t, httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:" + port, LookupHost: dns.LookupHost}})
		eps := tr.Endpoints()
		require.Len(t, eps, 1)
		assert.Equal(t, want, eps[0].Addr, "port %q", port)
		assert.Equal(t, want, eps[0].Key(), "port %q", port)
		_, err := url.Parse("http://" + eps[0].Addr + "/metrics")
		assert.NoError(t, err, "port %q", port)
		assert.NoError(t, tr.Update(eps), "port %q: Update takes what Discovery found", port)
	}
	_, err := httpbalancer.NewTransport(httpbalancer.Options{Discovery: &httpbalancer.Discovery{Target: "vllm.svc:0", LookupHost: dns.LookupHost}})
	require.ErrorContains(t, err, "Options.Discovery.Target")
}
