package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// idleCalls makes one call every 10ms for d (an idle fleet: nothing in
// flight at a pick), each failing when fail says so, and returns the picks
// per endpoint in each 10s window.
func idleCalls(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, d time.Duration, fail func(id string) bool) []map[string]int {
	t.Helper()
	const step, window = 10 * time.Millisecond, 10 * time.Second
	var out []map[string]int
	for i := range int(d / step) {
		if i%int(window/step) == 0 {
			out = append(out, map[string]int{})
		}
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		out[len(out)-1][p.ID()]++
		var o inferlb.Outcome
		if fail(p.ID()) {
			o.Err = errDown
		}
		p.Done(o)
		clock.Advance(step)
	}
	return out
}

// After a failure of the whole pool, MaxEjectedFraction keeps half of it
// in rotation: those endpoints take the pool's calls and fail them all,
// while their tripped peers are out. Their error rate neared 1, a cost a
// thousand times a peer's; once the pool recovered they lost every
// comparison, so no call came for them to answer, and the rate faded
// only with ErrorDecay: one got none of the 9,000 calls in the 90s after
// the recovery, while its tripped peers, probed, were back at once. A capped breaker is probed
// too, and a breaker that closes forgives the outage's error rate: every
// endpoint is back to its share within slow start of the recovery.
func TestCappedEndpointReturnsAfterThePoolRecovers(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), OnEvent: rec.record})
	idleCalls(t, b, clock, 30*time.Second, func(string) bool { return true })
	var capped []string
	for _, ev := range rec.events {
		if ev.Kind == balancer.EventCapped {
			capped = append(capped, ev.Endpoint)
		}
	}
	require.Len(t, capped, 2, "two of four tripped, the cap kept two in rotation")
	for _, id := range capped {
		require.False(t, stat(t, b, id).BreakerOpen)
	}

	windows := idleCalls(t, b, clock, 90*time.Second, func(string) bool { return false })
	for i, w := range windows {
		line := fmt.Sprintf("%3ds-%3ds after recovery:", 10*i, 10*(i+1))
		for _, ep := range endpoints(4) {
			line += fmt.Sprintf(" %4d", w[ep.Addr])
		}
		t.Log(line)
	}
	// Tripped peers are back through slow start (30s); from then on every
	// endpoint takes its share, a quarter of the calls, about.
	for i, w := range windows[3:] {
		for _, ep := range endpoints(4) {
			assert.GreaterOrEqual(t, w[ep.Addr], 150, "%s in %ds-%ds after recovery (capped: %v)",
				ep.Addr, 10*(i+3), 10*(i+4), capped)
		}
	}
}

// A breaker the cap keeps in rotation while its endpoint goes on failing
// (the pool's failure was partial) is probed about once per EjectionTime
// after its last failure, as a tripped one is once per exclusion.
func TestCappedBreakerProbesAreFew(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), OnEvent: rec.record})
	bad := map[string]bool{}
	for _, ep := range endpoints(3) {
		bad[ep.Addr] = true
		call, _ := pinnedCalls(t, b, clock, ep.Addr)
		for range balancer.DefaultBreakerFailures {
			call(errDown)
		}
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped, balancer.EventTripped, balancer.EventCapped}, rec.kinds())
	capped := rec.last().Endpoint
	const d = time.Minute
	n := 0
	for _, w := range idleCalls(t, b, clock, d, func(id string) bool { return bad[id] }) {
		n += w[capped]
	}
	t.Logf("the capped endpoint, failing, took %d of %d calls", n, int(d/(10*time.Millisecond)))
	assert.LessOrEqual(t, n, int(d/balancer.DefaultEjectionTime)+1)
}

// A tripped endpoint whose probes pass ramps back through slow start. The
// error rate of the failures that tripped it (about 0.2 by then) outlived
// the trip: it lost every comparison with its idle peers, which had none,
// and an idle fleet sent it nothing but its probes for the minute after
// its exclusion. The breaker's close forgives it.
func TestRecoveredBreakerForgivesTheOutagesErrorRate(t *testing.T) {
	clock := testutil.NewClock()
	rec := &recorder{}
	b := newBalancer(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(3), OnEvent: rec.record})
	bad := endpoints(4)[0].Addr
	call, held := pinnedCalls(t, b, clock, bad)
	for range balancer.DefaultBreakerFailures {
		call(errDown)
	}
	require.Equal(t, []balancer.EventKind{balancer.EventTripped}, rec.kinds())
	clock.Advance(held())
	windows := idleCalls(t, b, clock, time.Minute, func(string) bool { return false })
	require.Equal(t, balancer.EventRecovered, rec.last().Kind)
	var got []int
	for _, w := range windows {
		got = append(got, w[bad])
	}
	t.Logf("picks of the recovered endpoint per 10s: %v", got)
	for i, n := range got[3:] { // past slow start (30s)
		assert.GreaterOrEqual(t, n, 150, "%ds-%ds after its exclusion", 10*(i+3), 10*(i+4))
	}
}
