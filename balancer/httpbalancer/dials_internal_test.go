package httpbalancer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/internal/testutil"
)

// A call finds the dial net/http made for its URL's address: the host
// (an IPv6 one without its brackets, a name outside ASCII as the IDNA name
// net/http dials) and the port, the scheme's when the URL names none.
// Only a dial that began at or after the call's start counts, and only
// its own address's.
func TestDialMarksFindTheCallsAddress(t *testing.T) {
	clock := testutil.NewClock()
	d := newDialMarks()
	d.clock = clock
	start := clock.Now().UnixNano()
	for _, tc := range []struct{ dialed, url string }{
		{"10.0.0.5:8000", "http://10.0.0.5:8000/v1/embeddings"},
		{"h.example:80", "http://h.example/v1/embeddings"},
		{"h.example:443", "https://h.example/v1/embeddings"},
		{"[fd00::5]:8000", "http://[fd00::5]:8000/v1/embeddings"},
		{"xn--bcher-kva.example:443", "https://bücher.example/v1/embeddings"},
	} {
		u, err := url.Parse(tc.url)
		require.NoError(t, err)
		assert.False(t, d.since(u, start), "%s before its dial", tc.url)
		d.mark(tc.dialed)
		assert.True(t, d.since(u, start), "%s after a dial to %s", tc.url, tc.dialed)
		assert.False(t, d.since(u, start+1), "%s: a call that started after the dial", tc.url)
	}
	other, _ := url.Parse("http://10.0.0.6:8000/")
	assert.False(t, d.since(other, start), "an address not dialed")
	assert.False(t, d.since(nil, start))
}

// Far more addresses than the table holds: each still finds its own
// latest dial until others take its slot, and none is found wrongly for
// a call that started after it.
func TestDialMarksManyAddresses(t *testing.T) {
	clock := testutil.NewClock()
	d := newDialMarks()
	d.clock = clock
	start := clock.Now().UnixNano()
	for i := range 10 * dialSlots {
		clock.Advance(time.Millisecond)
		addr := fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
		d.mark(addr)
		u := &url.URL{Scheme: "http", Host: addr}
		require.True(t, d.since(u, start), addr)
		require.False(t, d.since(u, clock.Now().UnixNano()+1), addr)
	}
}

// The check a latency-scored call makes at its headers allocates nothing.
func TestDialMarksSinceAllocs(t *testing.T) {
	d := newDialMarks()
	d.clock = testutil.NewClock()
	d.mark("10.0.0.5:8000")
	u, _ := url.Parse("http://10.0.0.5:8000/v1/embeddings")
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = d.since(u, 0) }))
}

// The watched Base marks its dials whichever of its dial functions it
// has (a DefaultTransport a program replaced with an *http.Transport of
// its own may have Dial, or DialTLS, instead of the Context ones), and
// dials with that function.
func TestDialMarksWatchEveryDialFunction(t *testing.T) {
	errDial := errors.New("no network in this test")
	var dialed []string
	plain := func(network, addr string) (net.Conn, error) {
		dialed = append(dialed, "plain "+addr)
		return nil, errDial
	}
	tls := func(network, addr string) (net.Conn, error) {
		dialed = append(dialed, "tls "+addr)
		return nil, errDial
	}
	for _, tc := range []struct {
		name string
		t    *http.Transport
	}{
		{"Context", &http.Transport{
			DialContext:    func(_ context.Context, n, a string) (net.Conn, error) { return plain(n, a) },
			DialTLSContext: func(_ context.Context, n, a string) (net.Conn, error) { return tls(n, a) },
		}},
		//lint:ignore SA1019 the deprecated fields a DefaultTransport may still be set up with
		{"no Context", &http.Transport{Dial: plain, DialTLS: tls}},
	} {
		dialed = nil
		clock := testutil.NewClock()
		d := newDialMarks()
		d.clock = clock
		d.watch(tc.t)
		start := clock.Now().UnixNano()
		_, err := tc.t.DialContext(context.Background(), "tcp", "10.0.0.5:8000")
		assert.ErrorIs(t, err, errDial, tc.name)
		_, err = tc.t.DialTLSContext(context.Background(), "tcp", "10.0.0.6:8443")
		assert.ErrorIs(t, err, errDial, tc.name)
		assert.Equal(t, []string{"plain 10.0.0.5:8000", "tls 10.0.0.6:8443"}, dialed, tc.name)
		assert.True(t, d.since(&url.URL{Scheme: "http", Host: "10.0.0.5:8000"}, start), tc.name)
		assert.True(t, d.since(&url.URL{Scheme: "https", Host: "10.0.0.6:8443"}, start), tc.name)
	}
	// Neither: net/http's zero net.Dialer, which the watch dials with.
	tr := &http.Transport{}
	d := newDialMarks()
	d.clock = testutil.NewClock()
	d.watch(tr)
	require.NotNil(t, tr.DialContext)
	assert.Nil(t, tr.DialTLSContext, "no TLS dial of its own: net/http's handshake over DialContext")
}
