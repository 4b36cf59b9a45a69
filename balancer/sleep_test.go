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
	"github.com/inferlb/inferlb/telemetry"
)

// publishSleep reports each endpoint as vLLM does with sleep mode on: a
// sleeping one (asleep[i]) idle, as vLLM lets a server sleep only once its
// calls are done, an awake one running a few calls.
func publishSleep(b *balancer.Balancer, clock *testutil.Clock, asleep ...bool) {
	for i, ep := range endpoints(len(asleep)) {
		s := telemetry.Sample{Time: clock.Now()}
		s.Set(telemetry.Running, 3)
		s.Set(telemetry.Waiting, 0)
		s.Set(telemetry.KVCacheUsage, 0.3)
		s.Set(telemetry.Asleep, 0)
		if asleep[i] {
			s.Set(telemetry.Running, 0)
			s.Set(telemetry.KVCacheUsage, 0)
			s.Set(telemetry.Asleep, 1)
		}
		b.Publish(ep.Addr, s)
	}
}

// countPicks makes n picks of req (keyed by key+k when keys) and counts
// them by endpoint.
func countPicks(t *testing.T, b *balancer.Balancer, req inferlb.Request, n int, keys bool) map[string]int {
	t.Helper()
	c := map[string]int{}
	for k := range n {
		r := req
		if keys {
			r.AffinityKey = uint64(k) + 1
		}
		p, err := b.Pick(&r)
		require.NoError(t, err)
		c[p.ID()]++
		p.Done(inferlb.Outcome{})
	}
	return c
}

// sleepPickCases are the ways a pick can choose: two choices (priced by
// LLM, and by LeastLoaded, which does not price sleep, so the redraws
// alone keep calls off), an affinity key, a full scan.
var sleepPickCases = []struct {
	name string
	svc  inferlb.Service
	keys bool
}{
	{"two choices", inferlb.ServiceLLM, false},
	{"two choices, unpriced", inferlb.ServiceUnknown, false},
	{"keyed", inferlb.ServiceLLM, true},
	{"full scan", inferlb.ServiceEmbedding, false},
}

// A sleeping vLLM server reads as the most idle endpoint of the fleet,
// yet serves nothing until woken: no call goes there while an awake
// endpoint can take it, by two choices, by a full scan or by affinity
// key, and it takes calls again once a reading says it woke.
func TestSleepingEndpointGetsNoCalls(t *testing.T) {
	eps := endpoints(4)
	for _, tc := range sleepPickCases {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(7)})
			publishSleep(b, clock, false, true, false, false)
			req := inferlb.Request{Service: tc.svc}
			c := countPicks(t, b, req, 2000, tc.keys)
			t.Logf("one asleep: %v", c)
			assert.Zero(t, c[eps[1].Addr], "the sleeping endpoint took calls")
			for _, i := range []int{0, 2, 3} {
				assert.Greater(t, c[eps[i].Addr], 300)
			}

			clock.Advance(time.Second)
			publishSleep(b, clock, false, false, false, false)
			c = countPicks(t, b, req, 2000, tc.keys)
			t.Logf("woken: %v", c)
			assert.Greater(t, c[eps[1].Addr], 300, "woken, it takes calls again")
		})
	}
}

// A key owned by a sleeping endpoint spills to the next one in its order
// and comes back when the owner wakes.
func TestSleepingOwnerSpillsItsKey(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(8)})
	const key = 77
	home := owner(t, b, key)
	asleep := make([]bool, 4)
	for i, ep := range endpoints(4) {
		asleep[i] = ep.Addr == home
	}
	publishSleep(b, clock, asleep...)
	spill := owner(t, b, key)
	assert.NotEqual(t, home, spill, "the key stayed on its sleeping owner")
	assert.Equal(t, spill, owner(t, b, key), "the spill is stable")

	clock.Advance(time.Second)
	publishSleep(b, clock, false, false, false, false)
	assert.Equal(t, home, owner(t, b, key), "woken, the owner takes its key back")
}

// With every endpoint asleep a call still goes somewhere, to wait for the
// wake-up, rather than failing with no endpoint; and a stale reading is
// neutral, as every stale reading is.
func TestAllAsleepStillRoutesAndStaleIsNeutral(t *testing.T) {
	eps := endpoints(4)
	for _, tc := range sleepPickCases {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(9)})
			publishSleep(b, clock, true, true, true, true)
			req := inferlb.Request{Service: tc.svc}
			c := countPicks(t, b, req, 800, tc.keys)
			t.Logf("all asleep: %v", c)
			for _, ep := range eps {
				assert.Greater(t, c[ep.Addr], 100, "every sleeping endpoint is as good as the next")
			}

			publishSleep(b, clock, false, true, false, false)
			clock.Advance(balancer.DefaultTelemetryMaxAge + time.Second)
			c = countPicks(t, b, req, 800, tc.keys)
			t.Logf("stale: %v", c)
			for _, ep := range eps {
				assert.Greater(t, c[ep.Addr], 100, "a stale reading is neutral")
			}
		})
	}
}

func TestSleepPickDoesNotAllocate(t *testing.T) {
	clock := testutil.NewClock()
	b := affine(t, 4, balancer.Options{Clock: clock})
	publishSleep(b, clock, false, true, false, true)
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM}))
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: 9}))
	assert.Zero(t, pickDoneAllocs(b, &inferlb.Request{Service: inferlb.ServiceEmbedding}))
}

// With most of a fleet asleep (an RL loop that sleeps all but a few
// replicas between rollouts), both two-choice candidates and their
// redraws often land on sleeping endpoints: the pick then looks for an
// awake one rather than send the call to wait for a wake-up while awake
// endpoints could serve it. Before (6c08a6a's parent), this test sent
// 833, 329 and 17 of 2,000 calls to sleepers with 1, 2 and 4 of 8 awake.
func TestMostlyAsleepFleetSendsNothingToTheSleepers(t *testing.T) {
	for _, awake := range []int{1, 2, 4} {
		for _, tc := range sleepPickCases {
			t.Run(fmt.Sprintf("%d awake/%s", awake, tc.name), func(t *testing.T) {
				clock := testutil.NewClock()
				b := affine(t, 8, balancer.Options{Clock: clock, Rand: testutil.NewRand(11)})
				asleep := make([]bool, 8)
				for i := awake; i < 8; i++ {
					asleep[i] = true
				}
				publishSleep(b, clock, asleep...)
				c := countPicks(t, b, inferlb.Request{Service: tc.svc}, 2000, tc.keys)
				sleeping := 0
				for i, ep := range endpoints(8) {
					if asleep[i] {
						sleeping += c[ep.Addr]
					}
				}
				assert.Zero(t, sleeping, "calls sent to sleeping endpoints: %v", c)
			})
		}
	}
}
