package balancer_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/balancer/internal/testhook"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// The adapters' tests wait for a call's end, which grpc-go reports on a
// goroutine of its own, on testhook.SetOnDone instead of polling the
// stats on a timer: the hook must come once per call, after the counts
// include the call's end, and stop once removed.
func TestDoneHookComesOnceTheCountsIncludeTheCall(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	const id = "10.0.0.1:8000"
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: id}}))
	var seen []balancer.EndpointStats
	testhook.SetOnDone(b, func(got string) {
		assert.Equal(t, id, got)
		seen = append(seen, stat(t, b, got))
	})

	p, err := b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	p.Done(inferlb.Outcome{}) // no effect, no hook
	require.Len(t, seen, 1)
	assert.Zero(t, seen[0].InFlight, "the hook sees the call out of flight")
	assert.Equal(t, uint64(1), seen[0].Successes, "the hook sees the call counted")

	testhook.SetOnDone(b, nil)
	p, err = b.Pick(&inferlb.Request{})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{})
	assert.Len(t, seen, 1, "a removed hook is not called")
}

// The grpcbalancer tests wait for endpoints to turn ready, and for
// out-of-band load reports, which gRPC delivers on goroutines of its own,
// on testhook.SetOnChange: it must come after each SetReady,
// SetReconnected and Publish, once Stats and the Store show it, and stop
// once removed.
func TestChangeHookComesOnceTheChangeShows(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock})
	const id = "10.0.0.1:8000"
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: id}}))
	m, err := b.NewMembership()
	require.NoError(t, err)
	require.NoError(t, m.Update([]inferlb.Endpoint{{Addr: id}}))
	type seen struct {
		ready bool
		kv    float64
	}
	var got []seen
	testhook.SetOnChange(b, func(e string) {
		assert.Equal(t, id, e)
		s, _ := b.Telemetry().Latest(id, clock.Now(), time.Minute)
		kv, _ := s.Get(telemetry.KVCacheUsage)
		got = append(got, seen{stat(t, b, id).Ready, kv})
	})

	b.SetReady(id, false)
	m.SetReady(id, false)
	m.SetReconnected(id)
	s := telemetry.Sample{Time: clock.Now()}
	s.Set(telemetry.KVCacheUsage, 0.5)
	b.Publish(id, s)
	m.SetReady("10.0.0.2:8000", true) // not an endpoint: no change, no hook
	assert.Equal(t, []seen{{true, 0}, {false, 0}, {true, 0}, {true, 0.5}}, got)

	testhook.SetOnChange(b, nil)
	m.SetReady(id, false)
	b.Publish(id, s)
	assert.Len(t, got, 4, "a removed hook is not called")
}

// testhook.SetTenantLooks counts only when set before the tenants'
// refusals memory is allocated, which takes the count then: set after,
// it panics rather than count nothing.
func TestTenantLooksHookAfterTheMemoryPanics(t *testing.T) {
	b := balancer.New(balancer.Options{Clock: testutil.NewClock()})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "10.0.0.1:8000"}}))
	p, err := b.Pick(&inferlb.Request{Tenant: "A"})
	require.NoError(t, err)
	p.Done(inferlb.Outcome{Tenant: "A", ClientError: true})
	assert.Panics(t, func() { testhook.SetTenantLooks(b, new(atomic.Int64)) })
}
