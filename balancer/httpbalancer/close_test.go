package httpbalancer_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/httpbalancer"
	"github.com/inferlb/inferlb/telemetry"
)

// A Transport's own Balancer on a shared telemetry Store (BalancerOptions.
// Telemetry) held its endpoints' slots after the Transport's Close, for as
// long as the Store lived: Transports made and closed one after another on
// one Store filled it. Close closes the Balancer it made: the slots go, and
// later calls fail with balancer.ErrClosed. A call in flight at Close ends
// normally.
func TestCloseClosesTheTransportsOwnBalancer(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	store := &telemetry.Store{}
	res := newResults(4)
	tr := newTransport(t, httpbalancer.Options{
		Endpoints:       endpointsOf(a, b),
		BalancerOptions: balancer.Options{Telemetry: store},
		OnResult:        res.on,
	})
	require.Equal(t, 2, store.Len())
	client := &http.Client{Transport: tr}
	req, err := http.NewRequest(http.MethodPost, chatURL, strings.NewReader(chatBody(1, true)))
	require.NoError(t, err)
	resp, err := client.Do(req) // in flight: its stream is unread
	require.NoError(t, err)

	require.NoError(t, tr.Close())
	assert.Zero(t, store.Len(), "the closed Transport's endpoints gave back their slots")
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err, "the call in flight ends normally")
	require.NoError(t, resp.Body.Close())
	r := <-res.c
	assert.NoError(t, r.Outcome.Err)
	assert.Positive(t, r.Outcome.OutputTokens)

	_, err = client.Post(chatURL, "application/json", strings.NewReader(chatBody(2, false)))
	assert.ErrorIs(t, err, balancer.ErrClosed)
	assert.ErrorIs(t, tr.Update(endpointsOf(a)), balancer.ErrClosed)
	assert.Zero(t, store.Len())
	require.NoError(t, tr.Close(), "idempotent")
}

// A Balancer the caller passed in (Options.Balancer) is the caller's: the
// Transport's Close never closes it, whether the Transport routed over the
// Balancer's own endpoints or over a membership of its own.
func TestCloseLeavesAGivenBalancerOpen(t *testing.T) {
	a := newBackend(t, "a")
	store := &telemetry.Store{}
	shared := balancer.New(balancer.Options{Telemetry: store})
	require.NoError(t, shared.Update([]inferlb.Endpoint{{ID: "x", Addr: a.addr()}}))
	over := newTransport(t, httpbalancer.Options{Balancer: shared})                           // routes over shared's own set
	own := newTransport(t, httpbalancer.Options{Balancer: shared, Endpoints: endpointsOf(a)}) // a membership of its own
	require.Equal(t, 2, store.Len())

	require.NoError(t, over.Close())
	require.NoError(t, own.Close())
	assert.Equal(t, 1, store.Len(), "x stays; a, listed by the closed membership only, left")
	p, err := shared.Pick(&inferlb.Request{})
	require.NoError(t, err, "the caller's Balancer still routes")
	assert.Equal(t, "x", p.ID())
	p.Done(inferlb.Outcome{})
	shared.Close()
	assert.Zero(t, store.Len())
}

// NewTransport that fails on its Endpoints has applied the valid ones to
// the Balancer it made, which nobody can close then: it closes it itself,
// or their slots in a shared Store would be held for good.
func TestFailedNewTransportHoldsNoSlots(t *testing.T) {
	store := &telemetry.Store{}
	_, err := httpbalancer.NewTransport(httpbalancer.Options{
		Endpoints:       []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "ftp://10.0.0.2:21"}},
		BalancerOptions: balancer.Options{Telemetry: store},
	})
	require.Error(t, err)
	assert.Zero(t, store.Len())
}

// A Transport with a membership of its own in a shared Balancer, used after
// its Close, failed calls with ErrNoEndpoints worded as if the fleet were
// down: "no endpoint serves it, or each that does is out of rotation
// (breaker open, cooling down or ejected)", sending the caller to look at
// healthy servers. The error still is ErrNoEndpoints (as Close documents),
// and says the Transport is closed.
func TestCallAfterCloseOnASharedBalancerSaysClosed(t *testing.T) {
	a := newBackend(t, "a")
	shared := balancer.New(balancer.Options{})
	defer shared.Close()
	tr := newTransport(t, httpbalancer.Options{Balancer: shared, Endpoints: endpointsOf(a)})
	client := &http.Client{Transport: tr}
	resp, _ := post(t, client, chatBody(1, false))
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.NoError(t, tr.Close())
	for _, body := range []string{chatBody(2, false), `{"input":"no model"}`} {
		_, err := client.Post(chatURL, "application/json", strings.NewReader(body))
		require.Error(t, err)
		assert.ErrorIs(t, err, balancer.ErrNoEndpoints)
		assert.Contains(t, err.Error(), "Transport is closed")
		assert.NotContains(t, err.Error(), "out of rotation")
	}
}

// A closed Balancer, or one whose 63 Memberships are all taken, given in
// Options.Balancer with Endpoints fails NewTransport; the error names the
// option, as the others do, and wraps the Balancer's.
func TestNewTransportNamesTheBalancerItCannotJoin(t *testing.T) {
	closed := balancer.New(balancer.Options{})
	closed.Close()
	_, err := httpbalancer.NewTransport(httpbalancer.Options{Balancer: closed, Endpoints: []inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}})
	require.ErrorIs(t, err, balancer.ErrClosed)
	assert.Contains(t, err.Error(), "httpbalancer.Options.Balancer")
	assert.Equal(t, 1, strings.Count(err.Error(), "inferlb: "), "one prefix: %s", err)

	full := balancer.New(balancer.Options{})
	defer full.Close()
	for range 63 {
		_, err := full.NewMembership()
		require.NoError(t, err)
	}
	_, err = httpbalancer.NewTransport(httpbalancer.Options{Balancer: full, Discovery: &httpbalancer.Discovery{
		Target: "vllm.svc:8000", LookupHost: (&fakeDNS{}).LookupHost}})
	require.ErrorIs(t, err, balancer.ErrTooManyMemberships)
	assert.Contains(t, err.Error(), "httpbalancer.Options.Balancer")
	assert.Equal(t, 1, strings.Count(err.Error(), "inferlb: "), "one prefix: %s", err)
}

// Update after Close failed (balancer.ErrClosed, or ErrMembershipClosed on
// a shared Balancer) but still recorded the set: Endpoints, which telemetry
// sources follow for their scrape targets, listed endpoints the closed
// Balancer or membership does not have. Update after Close changes nothing.
func TestUpdateAfterCloseChangesNothing(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	shared := balancer.New(balancer.Options{})
	defer shared.Close()
	for _, tc := range []struct {
		name string
		opts httpbalancer.Options
		want error
	}{
		{"own Balancer", httpbalancer.Options{Endpoints: endpointsOf(a)}, balancer.ErrClosed},
		{"membership of a shared Balancer", httpbalancer.Options{Balancer: shared, Endpoints: endpointsOf(a)}, balancer.ErrMembershipClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTransport(t, tc.opts)
			before := tr.Endpoints()
			require.Len(t, before, 1)
			require.NoError(t, tr.Close())
			assert.ErrorIs(t, tr.Update(endpointsOf(a, b)), tc.want)
			assert.Equal(t, before, tr.Endpoints())
			assert.ErrorIs(t, tr.Update(nil), tc.want)
			assert.Equal(t, before, tr.Endpoints())
		})
	}
}

// A Transport routing over a shared Balancer's own set (Options.Balancer,
// no Endpoints, no Discovery) went on replacing that set after its Close:
// Update returned nil, and every other adapter of the Balancer lost its
// endpoints to a Transport its owner had closed. Update after Close
// changes nothing and says why, as it does for every other Transport.
func TestUpdateAfterCloseLeavesASharedSetAlone(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	shared := balancer.New(balancer.Options{})
	defer shared.Close()
	tr := newTransport(t, httpbalancer.Options{Balancer: shared})
	require.NoError(t, tr.Update(endpointsOf(a)))
	require.Len(t, shared.Stats(), 1)

	require.NoError(t, tr.Close())
	err := tr.Update(endpointsOf(b))
	assert.ErrorIs(t, err, balancer.ErrClosed)
	assert.Contains(t, err.Error(), "Transport is closed")
	st := shared.Stats()
	require.Len(t, st, 1, "the shared set is unchanged")
	assert.Equal(t, endpointsOf(a)[0].Key(), st[0].ID)
	assert.Equal(t, endpointsOf(a), tr.Endpoints(), "Endpoints lists the set from before")
}

// Endpoints given empty, to be filled by Update, is the Transport's own
// set as a non-empty list is: before, an empty list took the shared
// Balancer's own set, so another Transport's Update replaced the
// endpoints this one was given, and its Close left them in the Balancer.
func TestEmptyEndpointsOnASharedBalancerAreTheTransportsOwn(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	shared := balancer.New(balancer.Options{})
	defer shared.Close()
	mine := newTransport(t, httpbalancer.Options{Balancer: shared, Endpoints: []inferlb.Endpoint{}})
	other := newTransport(t, httpbalancer.Options{Balancer: shared})
	require.NoError(t, mine.Update(endpointsOf(a)))
	require.NoError(t, other.Update(endpointsOf(b)))

	client := &http.Client{Transport: mine}
	for i := range 4 {
		resp, body := post(t, client, chatBody(i, false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(body), "hello from a", "calls go to this Transport's endpoint only")
	}
	require.NoError(t, mine.Close())
	st := shared.Stats()
	require.Len(t, st, 1, "Close took this Transport's endpoint out")
	assert.Equal(t, endpointsOf(b)[0].Key(), st[0].ID)
}
