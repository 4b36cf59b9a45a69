package balancer_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A replica whose engine hangs before it has answered a generation call
// (it hung at its start, or as it joined a serving fleet) has no latency
// of its own to measure its callers' waits by; its peers' answers stand
// for it. In the second minute of a run whose replica a:80 hangs from
// the start, it drew 64 of 480 calls (0.53 of its share) with no
// telemetry, 66 with its gauges frozen, 60 in a fleet of streams, and 77
// and 105 with 1,000 sessions' keys without and with telemetry (138 of
// 958 over the first case's two minutes); joining a serving fleet hung,
// at 60 s, 65 of 480 in its first minute there. Its callers' give-ups
// never counted. Counted against the longest of its peers' generation
// peak-EWMAs, it draws 4, 4, 3, 3 and 5 (22 of 958 over two minutes),
// and 28 as it joins.
func TestHungLLMReplicaHungFromTheStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  hungRun
		most int
	}{
		{"no telemetry, callers cancel", hungRun{giveUp: context.Canceled}, 10},
		{"frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled}, 10},
		{"streams, no telemetry, callers cancel", hungRun{giveUp: context.Canceled, call: streamsOnly}, 10},
		{"sessions, no telemetry, callers cancel", hungRun{giveUp: context.Canceled, keys: 1000}, 10},
		{"sessions, frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled, keys: 1000}, 10},
		// Its first minute: its first callers wait 5-30 s before they
		// give up, and it draws its share until then.
		{"joins a serving fleet hung", hungRun{giveUp: context.Canceled, joinAt: 60 * time.Second}, 35},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Hung from its first instant: every call it draws is due
			// after the hang, and no answer comes.
			tc.run.hangAt, tc.run.seconds, tc.run.count = time.Nanosecond, 120, 60*time.Second
			if tc.run.joinAt > 0 {
				tc.run.seconds = int(tc.run.joinAt/time.Second) + 60
			}
			after, all := runHungLLM(t, tc.run)
			t.Logf("from 60 s: %s; whole run: %s", share(after), share(all))
			assert.LessOrEqual(t, after["a:80"], tc.most, "calls the hung replica drew in the run's second minute: %s", share(after))
		})
	}
}

// A replica that joins a fleet serving generations of 2-5 minutes, and
// whose first calls' users give up on a third of them after 30-120 s
// with nothing back, is not taken for a hung one: its peers' answers
// take longer than those waits. It draws what it drew with those calls
// not marked unanswered, whether it joins a quiet fleet (a call every
// 10-40 s) or a busy one (every 1-4 s), 3 or 10 minutes into the run.
func TestFreshReplicaJoiningLongGenerationsKeepsItsShare(t *testing.T) {
	long := func(r *rand.Rand) (time.Duration, time.Duration) {
		return 2*time.Minute + time.Duration(r.Int64N(int64(3*time.Minute))), 0
	}
	stopEarly := func(r *rand.Rand, _ string, _, _ time.Duration) time.Duration {
		if r.IntN(3) == 0 {
			return 30*time.Second + time.Duration(r.Int64N(int64(90*time.Second)))
		}
		return 0
	}
	quiet := func(r *rand.Rand) time.Duration {
		return 10*time.Second + time.Duration(r.Int64N(int64(30*time.Second)))
	}
	busy := func(r *rand.Rand) time.Duration {
		return time.Second + time.Duration(r.Int64N(int64(3*time.Second)))
	}
	for _, join := range []time.Duration{3 * time.Minute, 10 * time.Minute} {
		cancelledBoth(t, hungRun{seconds: 2400, joinAt: join, every: quiet, call: long}, stopEarly)
		cancelledBoth(t, hungRun{seconds: 1200, joinAt: join, every: busy, call: long}, stopEarly)
	}
}
