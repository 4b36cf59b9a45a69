package httpbalancer_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
)

// An endpoint was known by its Addr as given, so one server spelled two
// ways ("10.0.0.5:8000" and "http://10.0.0.5:8000/", a scheme or host in
// upper case, a default port written out) was two endpoints: it drew two
// shares of the calls, and its load was split between two states that each
// saw half of it. Listing a server twice is an error naming both entries,
// whatever their IDs: NewTransport makes no Transport.
func TestNewTransportRefusesOneServerListedTwice(t *testing.T) {
	same := [][2]string{
		{"10.0.0.5:8000", "http://10.0.0.5:8000"},
		{"http://10.0.0.5:8000", "http://10.0.0.5:8000/"},
		{"https://10.0.0.5:8443", "HTTPS://10.0.0.5:8443"},
		{"vllm-0.internal:8000", "http://VLLM-0.Internal:8000"},
		{"vllm-0.internal:8000", "vllm-0.internal.:8000"},
		{"http://10.0.0.5", "10.0.0.5:80"},
		{"https://10.0.0.5", "10.0.0.5:443"},
		{"10.0.0.5:8000", "10.0.0.5:08000"},
		{"[fd00::1]:8000", "http://[FD00:0::1]:8000"},
		{"[::ffff:10.0.0.5]:8000", "10.0.0.5:8000"},
		{"https://[fd00::1]", "[fd00::1]:443"},
		// A name outside ASCII is the IDNA name net/http dials
		// ("xn--bcher-kva.example:8000" for both), as a full-width
		// "１０.0.0.5" is 10.0.0.5 (TestServerKeyIsWhatNetHTTPDials).
		{"bücher.example:8000", "http://xn--bcher-kva.example:8000"},
		{"http://BÜCHER.example:8000", "xn--bcher-kva.example:8000"},
		{"10.0.0.5:8000", "http://１０.0.0.5:8000"},
	}
	for _, s := range same {
		for _, ids := range [][2]string{{"", ""}, {"a", "b"}} {
			_, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{
				{ID: "other", Addr: "10.0.0.9:8000"},
				{ID: ids[0], Addr: s[0]},
				{ID: ids[1], Addr: s[1]},
			}})
			require.Error(t, err, "%q and %q, IDs %q", s[0], s[1], ids)
			msg := err.Error()
			assert.True(t, strings.HasPrefix(msg, "inferlb: NewTransport: Options.Endpoints[2] ("), msg)
			assert.Contains(t, msg, `Addr "`+s[1]+`" names the server of Options.Endpoints[1] (`)
			assert.Contains(t, msg, `Addr "`+s[0]+`")`)
			assert.NotContains(t, msg, "Endpoints[0]", "the other entry is fine")
			assert.NotContains(t, msg, "skipped", "nothing was made")
		}
	}

	// Different servers: another port, another host, and a scheme's
	// default port that is not the other's.
	for _, d := range [][2]string{
		{"10.0.0.5:8000", "10.0.0.5:8001"},
		{"10.0.0.5:8000", "10.0.0.6:8000"},
		{"http://10.0.0.5", "https://10.0.0.5"},
		{"10.0.0.5:80", "https://10.0.0.5"},
		{"vllm-0.internal:8000", "vllm-1.internal:8000"},
		{"[fd00::1]:8000", "[fd00::2]:8000"},
		// A name is not resolved: "localhost" may dial ::1, where
		// another server than 127.0.0.1's may listen.
		{"localhost:8000", "127.0.0.1:8000"},
		// Link-local addresses on two interfaces are two servers.
		{"[fe80::1%eth0]:8000", "[fe80::1%eth1]:8000"},
	} {
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: d[0]}, {Addr: d[1]}}})
		require.NoError(t, err, "%q and %q", d[0], d[1])
		assert.Len(t, tr.Endpoints(), 2)
		require.NoError(t, tr.Close())
	}
}

// Update, which applies what it can, applies the first spelling of a
// server and skips the later one, naming both; calls go to the first
// entry's endpoint alone, and Endpoints lists it once (one telemetry
// target per server).
func TestUpdateSkipsOneServerListedTwice(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	for _, shared := range []bool{false, true} {
		o := httpbalancer.Options{Endpoints: endpointsOf(a)}
		if shared {
			o.Balancer = balancer.New(balancer.Options{})
			defer o.Balancer.Close()
		}
		tr := newTransport(t, o)
		err := tr.Update([]inferlb.Endpoint{
			{ID: "a", Addr: a.addr()},
			{ID: "b", Addr: b.addr()},
			{ID: "a-again", Addr: "HTTP://" + a.addr() + "/"},
		})
		require.Error(t, err, "shared %v", shared)
		assert.Contains(t, err.Error(), `endpoint 2 ("a-again"): Addr "HTTP://`+a.addr()+`/" names the server of endpoint 0 ("a", Addr "`+a.addr()+`")`, "shared %v", shared)
		assert.Contains(t, err.Error(), "skipped")
		var ids []string
		for _, e := range tr.Endpoints() {
			ids = append(ids, e.Key())
		}
		assert.Equal(t, []string{"a", "b"}, ids, "shared %v", shared)

		client := &http.Client{Transport: tr}
		before := a.hits.Load() + b.hits.Load()
		for i := range 8 {
			resp, err := client.Post(chatURL, "application/json", strings.NewReader(chatBody(i, false)))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			assert.Contains(t, []string{"a", "b"}, resp.Header.Get("X-Backend"))
		}
		assert.Equal(t, before+8, a.hits.Load()+b.hits.Load())
		stats := tr.Balancer().Stats()
		assert.Len(t, stats, 2, "shared %v: two endpoints, not three", shared)
	}
}

// A server listed in Endpoints and found by Discovery was two endpoints
// when the two spelled it differently (a static "http://10.0.0.1:8000/",
// or one under an ID of its own, and the 10.0.0.1:8000 found): only a
// shared ID made the static one win. The found address is now left to the
// static endpoint naming its server, and comes back when that one goes.
func TestDiscoveryLeavesAStaticServerToItsEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dns := &fakeDNS{}
		dns.set(nil, "10.0.0.2", "10.0.0.1", "10.0.0.3")
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{
			Endpoints: []inferlb.Endpoint{
				{ID: "pod-1", Addr: "http://10.0.0.1:8000/"},
				{Addr: "HTTP://10.0.0.3:8000"},
			},
			Discovery: &httpbalancer.Discovery{
				Target:     "vllm.svc:8000",
				Interval:   time.Minute,
				Grace:      -1,
				LookupHost: dns.LookupHost,
			},
		})
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.2:8000", "HTTP://10.0.0.3:8000", "pod-1"}, ids(tr))
		var listed []string
		for _, e := range tr.Endpoints() {
			listed = append(listed, e.Key())
		}
		assert.Equal(t, []string{"pod-1", "HTTP://10.0.0.3:8000", "10.0.0.2:8000"}, listed, "one telemetry target per server")

		require.NoError(t, tr.Update(nil))
		assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, ids(tr), "found again once no static endpoint names them")
		require.NoError(t, tr.Close())
	})
}

// Spellings of one name that serverKey takes for one server are what
// net/http dials as one: a name outside ASCII is dialed by its IDNA
// (Punycode) form, and a full-width IPv4 address as the address. Before,
// "bücher.example:8000" and "http://xn--bcher-kva.example:8000" were two
// endpoints on the one server they both dial.
func TestServerKeyIsWhatNetHTTPDials(t *testing.T) {
	dialed := func(addr string) string {
		var got string
		base := &http.Transport{DialContext: func(_ context.Context, _, a string) (net.Conn, error) {
			if got == "" {
				got = a
			}
			return nil, errors.New("no dial in this test")
		}}
		tr, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: addr}}, Base: base})
		require.NoError(t, err, addr)
		defer func() { require.NoError(t, tr.Close()) }()
		resp, err := (&http.Client{Transport: tr}).Get("http://llm.internal/v1/models")
		if err == nil {
			resp.Body.Close()
		}
		require.NotEmpty(t, got, "%q: nothing dialed", addr)
		return got
	}
	for _, s := range [][2]string{
		{"bücher.example:8000", "http://xn--bcher-kva.example:8000"},
		{"http://BÜCHER.example:8000", "xn--bcher-kva.example:8000"},
		{"10.0.0.5:8000", "http://１０.0.0.5:8000"},
	} {
		assert.Equal(t, dialed(s[0]), dialed(s[1]), "%q and %q", s[0], s[1])
		_, err := httpbalancer.NewTransport(httpbalancer.Options{Endpoints: []inferlb.Endpoint{{Addr: s[0]}, {Addr: s[1]}}})
		assert.ErrorContains(t, err, "names the server of Options.Endpoints[0]", "%q and %q", s[0], s[1])
	}
}
