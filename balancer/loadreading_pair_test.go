package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// Two candidates of which one reports the server's count of its calls
// (every caller's) and the other none (its scrape fails, or it exports no
// metrics) are compared on what both have: this caller's calls. Compared
// as they were, the one without a reading looked as many times lighter as
// there are callers, and every caller sent it most of its calls: here 28
// of 30, with each endpoint carrying the same 3 calls of this caller and
// the reporting one 27 of other callers'.
//
// So too with load reports on (vLLM's header carries the queue and the KV
// usage, not the running count), for an endpoint whose scrape fails but
// which has a fresh Waiting from its last response: that is no count of
// the calls it runs, and compared with the other's Running it took 28 of
// 30 calls as one without any reading did. A pair is compared on the load
// fields both have.
func TestAPairIsComparedOnTheLoadReadingsBothHave(t *testing.T) {
	reading := func(fields ...float64) *telemetry.Sample {
		s := telemetry.Sample{}
		for i := 0; i < len(fields); i += 2 {
			s.Set(telemetry.Field(fields[i]), fields[i+1])
		}
		return &s
	}
	for _, tc := range []struct {
		name     string
		reported *telemetry.Sample // the busy endpoint's reading: 30 running, 27 of them other callers'
		other    *telemetry.Sample // the other's; nil: none
		// share: the other should share the calls with the busy one
		// (about 15 of 30); else it takes about all of them.
		share bool
	}{
		{"one without a reading", reading(float64(telemetry.Running), 30), nil, true},
		{"one with only a queue", reading(float64(telemetry.Running), 30, float64(telemetry.Waiting), 0), reading(float64(telemetry.Waiting), 0), true},
		{"both with readings", reading(float64(telemetry.Running), 30), reading(float64(telemetry.Running), 3), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := newBalancer(t, 2, balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
			eps := endpoints(2)
			reported, other := eps[0].Key(), eps[1].Key()
			var held []balancer.Pick
			t.Cleanup(func() {
				for _, p := range held {
					p.Done(inferlb.Outcome{})
				}
			})
			for _, id := range []string{reported, other} {
				serial, ok := b.Serial(id)
				require.True(t, ok)
				for range 3 {
					p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serial)
					require.NoError(t, err)
					held = append(held, p)
				}
			}
			tc.reported.Time = clock.Now()
			b.Publish(reported, *tc.reported)
			if tc.other != nil {
				tc.other.Time = clock.Now()
				b.Publish(other, *tc.other)
			}
			count := map[string]int{}
			for range 30 {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
				require.NoError(t, err)
				held = append(held, p)
				count[p.ID()]++
			}
			t.Logf("of 30 calls: %v", count)
			if !tc.share {
				// Both readings count: the one with 30 running takes
				// about none until the other, 3 running and the calls
				// sent since, has as many.
				assert.GreaterOrEqual(t, count[other], 26, "the readings count where both have one")
				return
			}
			assert.InDelta(t, 15, count[other], 2, "compared on this caller's calls, the two share the calls")
		})
	}
}
