package balancer_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// A Balancer on a shared Store holds a slot for each of its endpoints.
// Dropped without Close while it still had endpoints, it held them for as
// long as the Store lived (a Transport's own Balancer kept its endpoints
// after the Transport's Close). Close lets go of every one, its
// Memberships' too, and leaves the slots that another Balancer holds.
func TestCloseReleasesTheStoreSlots(t *testing.T) {
	clock := testutil.NewClock()
	store := &telemetry.Store{Clock: clock}
	a := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	other := balancer.New(balancer.Options{Clock: clock, Telemetry: store})
	const p, q, r = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
	require.NoError(t, a.Update([]inferlb.Endpoint{{Addr: p}, {Addr: q}}))
	m, err := a.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update([]inferlb.Endpoint{{Addr: q}, {Addr: r}}))
	require.NoError(t, other.Update([]inferlb.Endpoint{{Addr: q}}))
	kv := telemetry.Sample{Time: clock.Now()}
	kv.Set(telemetry.KVCacheUsage, 0.5)
	other.Publish(q, kv)
	require.Equal(t, 3, store.Len())

	a.Close()
	assert.Equal(t, 1, store.Len(), "only the other Balancer's endpoint keeps its slot")
	_, ok := store.Latest(q, clock.Now(), 0)
	assert.True(t, ok, "and its telemetry")
	a.Publish(p, kv)
	assert.EqualValues(t, 1, store.Stats().DroppedUnknown, "a closed Balancer's endpoints have no slot")

	a.Close() // idempotent: it releases nothing twice
	assert.Equal(t, 1, store.Len())
	other.Close()
	assert.Zero(t, store.Len())
}

// After Close every pick fails with ErrClosed, which is not
// ErrNoEndpoints: an adapter tells "nothing can serve this now" from
// "this router is gone". Changes to the endpoint set fail with it too.
func TestClosedBalancerRefusesEverything(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	eps := []inferlb.Endpoint{{Addr: "a:1", Labels: map[string]string{"model": "llama"}}, {Addr: "b:1"}}
	require.NoError(t, b.Update(eps))
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update(eps))
	empty := balancer.New(balancer.Options{})
	_, err = empty.Pick(&inferlb.Request{})
	require.ErrorIs(t, err, balancer.ErrNoEndpoints, "open and empty")
	empty.Close()

	b.Close()
	for name, pick := range map[string]func(*inferlb.Request) (balancer.Pick, error){
		"Pick":                    b.Pick,
		"PickExcept":              func(r *inferlb.Request) (balancer.Pick, error) { return b.PickExcept(r, "a:1") },
		"PickRetry":               func(r *inferlb.Request) (balancer.Pick, error) { return b.PickRetry(r, "a:1") },
		"PickAt":                  func(r *inferlb.Request) (balancer.Pick, error) { return b.PickAt(r, 1) },
		"Membership.Pick":         m.Pick,
		"Membership.PickFailover": func(r *inferlb.Request) (balancer.Pick, error) { return m.PickFailover(r, "a:1") },
		"Membership.PickAt":       func(r *inferlb.Request) (balancer.Pick, error) { return m.PickAt(r, 1) },
		"empty Balancer's Pick":   empty.Pick,
	} {
		for _, model := range []string{"", "llama", "other"} {
			_, err := pick(&inferlb.Request{Model: model})
			assert.ErrorIs(t, err, balancer.ErrClosed, "%s, model %q", name, model)
			assert.False(t, errors.Is(err, balancer.ErrNoEndpoints), "%s, model %q", name, model)
		}
	}
	assert.ErrorIs(t, b.Update(eps), balancer.ErrClosed)
	assert.ErrorIs(t, m.Update(eps), balancer.ErrClosed)
	_, err = b.NewMembership()
	assert.ErrorIs(t, err, balancer.ErrClosed)
	assert.False(t, b.SetReady("a:1", true))
	assert.False(t, m.SetReady("a:1", true))
	assert.Empty(t, b.Stats())
	m.Close()
	b.Close()
	_, err = b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrClosed)
}

// Close is safe while other goroutines pick and report: each pick either
// succeeds (and its Done works as ever) or fails with ErrClosed, and once
// Close has returned every pick fails with it.
func TestCloseWhilePicking(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBalancer(t, 8, balancer.Options{})
	var wg sync.WaitGroup
	running := make(chan struct{}, 4)
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			req := &inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 100}
			for n := 0; ; n++ {
				p, err := b.Pick(req)
				if err != nil {
					errs <- err
					return
				}
				p.Done(inferlb.Outcome{})
				if n == 0 {
					running <- struct{}{}
				}
			}
		})
	}
	for range 4 {
		<-running // every goroutine is picking
	}
	b.Close()
	_, err := b.Pick(&inferlb.Request{})
	assert.ErrorIs(t, err, balancer.ErrClosed, "once Close has returned")
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.ErrorIs(t, err, balancer.ErrClosed)
	}
}

// A closed Balancer's pick fails without allocating, as every pick does.
func TestClosedPickDoesNotAllocate(t *testing.T) {
	b := newBalancer(t, 8, balancer.Options{})
	b.Close()
	req := &inferlb.Request{Service: inferlb.ServiceLLM, Model: "llama"}
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := b.Pick(req); !errors.Is(err, balancer.ErrClosed) {
			panic(err)
		}
	}))
}
