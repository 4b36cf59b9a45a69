package balancer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/scoring"
	"github.com/inferlb/inferlb/telemetry"
)

// hungRun describes one run of runHungLLM.
type hungRun struct {
	telemetry bool          // publish Running/Waiting/KV every second
	giveUp    error         // how callers end a call the hung replica never answers
	hangAt    time.Duration // when a:80 hangs; never when 0
	seconds   int           // length of the run
	// call returns a healthy call's length and, for a stream, its time to
	// first token (0: not streamed); nil: 1-15 s, half of them streamed
	// with a first token after 0.2-1 s.
	call  func(r *rand.Rand) (length, ttft time.Duration)
	every func(r *rand.Rand) time.Duration // gap between calls; nil: 50-200 ms
	// cancel, when set, says when (after its start) a healthy call's
	// caller gives up on it (0 or past its length: never) and whether
	// with nothing back.
	cancel    func(r *rand.Rand, addr string, length, ttft time.Duration) (time.Duration, bool)
	recoverAt time.Duration // when a:80's engine is back: calls sent from then are answered
	count     time.Duration // when after counts from (default hangAt)
	keys      int           // when > 0, each call carries one of this many affinity keys
	joinAt    time.Duration // when a:80 joins the fleet; listed from the start when 0
	// silent, when not nil, counts for each replica the picks made while
	// it was silent (a run of scoring.MinAbandoned or more and calls out),
	// from count (or hangAt) on.
	silent map[string]int
}

// hungEndpoints are runHungLLM's four replicas; a:80 is the one that hangs.
var hungEndpoints = []inferlb.Endpoint{{Addr: "a:80"}, {Addr: "b:80"}, {Addr: "c:80"}, {Addr: "d:80"}}

// runHungLLM sends generation calls to four replicas on a fake clock, one
// replica (a:80) hanging at run.hangAt as a vLLM engine does in an NCCL
// deadlock while its API server stays up: every call out to it then, and
// every later one, gets no answer (a stream its headers, no token) until its
// caller gives up after 5-30 s. With telemetry the healthy replicas report
// their calls in flight as Running (KV usage in step) every second and the
// hung one its frozen gauges, as its /metrics does. It returns the calls
// each replica drew in the 60 s from the hang (from 0 without one), and
// the whole run's draws.
func runHungLLM(t *testing.T, run hungRun) (after, all map[string]int) {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1), AffinitySeed: 1})
	joined := run.joinAt <= 0
	if joined {
		require.NoError(t, b.Update(hungEndpoints))
	} else {
		require.NoError(t, b.Update(hungEndpoints[1:]))
	}
	r := rand.New(rand.NewPCG(7, 11))
	call := run.call
	if call == nil {
		call = func(r *rand.Rand) (time.Duration, time.Duration) {
			length := time.Second + time.Duration(r.Int64N(int64(14*time.Second)))
			if r.IntN(2) == 0 {
				return length, 0
			}
			return length, 200*time.Millisecond + time.Duration(r.Int64N(int64(800*time.Millisecond)))
		}
	}
	every := run.every
	if every == nil {
		every = func(r *rand.Rand) time.Duration {
			return 50*time.Millisecond + time.Duration(r.Int64N(int64(150*time.Millisecond)))
		}
	}
	type call1 struct {
		p          balancer.Pick
		start      time.Time
		end        time.Time
		ttft       time.Duration
		giveUpAt   time.Time // when its caller gives up on it
		hung       bool      // on a:80, and its answer was due while a:80 hung
		unanswered bool      // a healthy call given up on at giveUpAt with nothing back
	}
	var out []call1
	after, all = map[string]int{}, map[string]int{}
	hangAt := time.Duration(1<<63 - 1)
	if run.hangAt > 0 {
		hangAt = run.hangAt
	}
	epoch := clock.Now()
	recoverAt := time.Duration(1<<63 - 1)
	if run.recoverAt > 0 {
		recoverAt = run.recoverAt
	}
	hung := func(now time.Time) bool { el := now.Sub(epoch); return el >= hangAt && el < recoverAt }
	frozen := map[string]telemetry.Sample{}
	inFlight := func(addr string) int {
		n := 0
		for _, c := range out {
			if c.p.Endpoint().Addr == addr {
				n++
			}
		}
		return n
	}
	publish := func(now time.Time) {
		for _, ep := range hungEndpoints {
			s := telemetry.Sample{Time: now}
			if !hung(now) {
				delete(frozen, ep.Addr) // restarted: its gauges move again
			}
			if f, ok := frozen[ep.Addr]; ok {
				s.Has, s.Values = f.Has, f.Values
			} else {
				n := float64(inFlight(ep.Addr))
				s.Set(telemetry.Running, n)
				s.Set(telemetry.Waiting, 0)
				s.Set(telemetry.KVCacheUsage, min(n/64, 1))
				if ep.Addr == "a:80" && hung(now) {
					frozen[ep.Addr] = s
				}
			}
			b.Publish(ep.Addr, s)
		}
	}
	end := epoch.Add(time.Duration(run.seconds) * time.Second)
	nextPublish := epoch
	for now := epoch; now.Before(end); now = clock.Now() {
		// End the calls due by now: answered, or given up on when the
		// replica hung before their answer.
		k := 0
		for _, c := range out {
			switch {
			case c.hung && !c.giveUpAt.After(now):
				// Nothing back: a non-streamed call, or a stream whose first
				// token had not come before the hang (its headers had: the
				// HTTP transport reports it Unanswered, as its reader waited
				// for the token).
				nothing := c.ttft == 0 || c.start.Add(c.ttft).Sub(epoch) >= hangAt
				c.p.Done(inferlb.Outcome{Err: run.giveUp, Unanswered: nothing})
			case !c.hung && !c.giveUpAt.IsZero() && !c.giveUpAt.After(now):
				c.p.Done(inferlb.Outcome{Err: context.Canceled, Unanswered: c.unanswered})
			case !c.hung && !c.end.After(now):
				c.p.Done(inferlb.Outcome{TTFT: c.ttft})
			default:
				out[k] = c
				k++
				continue
			}
		}
		out = out[:k]
		if run.telemetry && !now.Before(nextPublish) {
			publish(now)
			nextPublish = nextPublish.Add(time.Second)
		}
		if !joined && now.Sub(epoch) >= run.joinAt {
			require.NoError(t, b.Update(hungEndpoints))
			joined = true
		}
		length, ttft := call(r)
		req := &inferlb.Request{Service: inferlb.ServiceLLM}
		if run.keys > 0 {
			req.AffinityKey = 1 + r.Uint64N(uint64(run.keys))
		}
		from := run.hangAt
		if run.count > 0 {
			from = run.count
		}
		if run.silent != nil && now.Sub(epoch) >= from {
			for _, st := range b.Stats() {
				if st.Abandoned >= scoring.MinAbandoned && st.InFlight > 0 {
					run.silent[st.ID]++
				}
			}
		}
		p, err := b.Pick(req)
		require.NoError(t, err)
		addr := p.Endpoint().Addr
		all[addr]++
		if el := now.Sub(epoch); el >= from && el < from+time.Minute {
			after[addr]++
			if addr == "a:80" {
				after[fmt.Sprint("t", int((el-from)/(10*time.Second)))]++
			}
		}
		wait := 5*time.Second + time.Duration(r.Int64N(int64(25*time.Second)))
		giveUp := now.Add(wait)
		if h := epoch.Add(hangAt); giveUp.Before(h) {
			// A call out at the hang, whose caller would have waited
			// less: it gives up soon after.
			giveUp = h.Add(wait / 6)
		}
		c := call1{p: p, start: now, end: now.Add(length), ttft: ttft}
		// Due while a:80 hangs, or picked while it hung (the engine's
		// restart loses it): no answer comes.
		if addr == "a:80" && (hung(now) || hung(c.end) || now.Sub(epoch) < hangAt && c.end.Sub(epoch) >= recoverAt) {
			c.hung, c.giveUpAt = true, giveUp
		} else if run.cancel != nil {
			if at, unanswered := run.cancel(r, addr, length, ttft); at > 0 && at < length {
				c.giveUpAt, c.unanswered = now.Add(at), unanswered
			}
		}
		out = append(out, c)
		clock.Advance(every(r))
	}
	for _, c := range out {
		c.p.Done(inferlb.Outcome{Err: context.Canceled})
	}
	return after, all
}

// share formats a run's draws with a:80's share of them.
func share(m map[string]int) string {
	total := m["a:80"] + m["b:80"] + m["c:80"] + m["d:80"]
	return fmt.Sprintf("%v: a:80 %d of %d (%.2f of its share)", m, m["a:80"], total, float64(m["a:80"])*4/float64(total))
}

// streamsOnly is a healthy stream of 1-15 s, its first token after 0.2-1 s.
func streamsOnly(r *rand.Rand) (time.Duration, time.Duration) {
	return time.Second + time.Duration(r.Int64N(int64(14*time.Second))), 200*time.Millisecond + time.Duration(r.Int64N(int64(800*time.Millisecond)))
}

// A vLLM replica whose engine hangs while its API server stays up answers
// nothing, its /metrics frozen but fresh. Over 60 s from the hang it drew
// 62 calls of 480 (about half its share of 120) when nothing reported its
// load and its callers gave up on their calls after 5-30 s
// (context.Canceled: neither success nor failure), and 63 with its frozen
// gauges: its calls out held it at its peers' load. Callers whose
// deadline passes fail their calls, and the breaker stops it at 6. Its
// calls abandoned with nothing back, after waiting as long as its
// answers took, now price it up while it has calls out: 17 calls (12 of
// them before two such abandons), 6 with telemetry. A fleet of streams
// alone drew 67 and 61: its streams' headers came at once, and a stream
// given up on after them counted as answered; one given up on in a Read
// that waited for its first token is unanswered now, and it draws 30 and
// 26: the streams out at the hang had their first tokens, so the run
// starts with the streams sent after it, whose callers wait as long as
// its answers took (12 s or so) only 10-20 s into the hang. Calls with
// affinity keys (1,000 sessions) went to their owner within its load
// bound whatever it cost: 79 and 111 (the same with the price alone); a
// silent owner is out of bound now, and it draws 17 and 25 (AffinitySeed
// 1: with the default random seed the keys' owners, and these counts,
// changed from run to run).
func TestHungLLMReplicaStopsDrawingCalls(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  hungRun
		most int
	}{
		{"no telemetry, callers cancel", hungRun{giveUp: context.Canceled}, 20},
		{"frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled}, 10},
		{"frozen telemetry, callers time out", hungRun{telemetry: true, giveUp: context.DeadlineExceeded}, 10},
		{"no telemetry, callers time out", hungRun{giveUp: context.DeadlineExceeded}, 10},
		{"streams, no telemetry, callers cancel", hungRun{giveUp: context.Canceled, call: streamsOnly}, 35},
		{"streams, frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled, call: streamsOnly}, 35},
		{"sessions, no telemetry, callers cancel", hungRun{giveUp: context.Canceled, keys: 1000}, 30},
		{"sessions, frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled, keys: 1000}, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run.hangAt, tc.run.seconds = 60*time.Second, 130
			after, _ := runHungLLM(t, tc.run)
			t.Log(share(after))
			assert.LessOrEqual(t, after["a:80"], tc.most, "calls the hung replica drew in 60 s: %s", share(after))
		})
	}
}

// A replica whose engine is restarted 10 minutes after it hung (its calls
// of then lost) draws its share again, its sessions' keys too: with nothing in flight it is priced
// as before, so it draws a call, and that call's answer ends the run of
// abandoned ones.
func TestHungLLMReplicaRecovers(t *testing.T) {
	for _, keys := range []int{0, 1000} {
		after, _ := runHungLLM(t, hungRun{giveUp: context.Canceled, keys: keys, hangAt: 60 * time.Second, recoverAt: 660 * time.Second, count: 720 * time.Second, seconds: 780})
		t.Logf("%d keys: %s", keys, share(after))
		total := after["a:80"] + after["b:80"] + after["c:80"] + after["d:80"]
		assert.Greater(t, after["a:80"], total/4*9/10, "%d keys: calls the recovered replica drew in 60 s from 60 s after its restart: %s", keys, share(after))
	}
}

// cancelledBoth runs run with its cancel marking the given-up calls
// Unanswered and not, and checks that every replica drew the same calls:
// the abandons the run holds are no evidence of a hang.
// It does so without affinity keys and with 1,000 sessions' keys.
func cancelledBoth(t *testing.T, run hungRun, cancel func(r *rand.Rand, addr string, length, ttft time.Duration) time.Duration) {
	t.Helper()
	for _, keys := range []int{0, 1000} {
		run.keys = keys
		var draws [2]map[string]int
		for i, unanswered := range []bool{false, true} {
			run.cancel = func(r *rand.Rand, addr string, length, ttft time.Duration) (time.Duration, bool) {
				return cancel(r, addr, length, ttft), unanswered
			}
			_, draws[i] = runHungLLM(t, run)
		}
		t.Logf("%d keys: answered %s; unanswered %s", keys, share(draws[0]), share(draws[1]))
		assert.Equal(t, draws[0], draws[1], "%d keys: draws with the cancels unanswered, against answered", keys)
	}
}

// A quiet fleet of healthy replicas, each serving a few non-streamed
// generations of 2-5 minutes (nothing back until each is done), whose
// users give up on a third of them after 30-120 s: a long wait with
// nothing back is no hang when the replica's answers take longer, and
// every replica draws what it drew with those calls not marked
// unanswered. So it does with generations of 1-5 minutes given up on
// after 0.5-5 minutes, longer than some answers took: the replica's
// answers come between them.
func TestLongGenerationsInAQuietFleetKeepTheirShare(t *testing.T) {
	cancelledBoth(t, hungRun{seconds: 3600,
		every: func(r *rand.Rand) time.Duration {
			return 10*time.Second + time.Duration(r.Int64N(int64(30*time.Second)))
		},
		call: func(r *rand.Rand) (time.Duration, time.Duration) {
			return 2*time.Minute + time.Duration(r.Int64N(int64(3*time.Minute))), 0
		}}, func(r *rand.Rand, _ string, _, _ time.Duration) time.Duration {
		if r.IntN(3) == 0 {
			return 30*time.Second + time.Duration(r.Int64N(int64(90*time.Second)))
		}
		return 0
	})
	cancelledBoth(t, hungRun{seconds: 3600,
		every: func(r *rand.Rand) time.Duration {
			return 10*time.Second + time.Duration(r.Int64N(int64(30*time.Second)))
		},
		call: func(r *rand.Rand) (time.Duration, time.Duration) {
			return time.Minute + time.Duration(r.Int64N(int64(4*time.Minute))), 0
		}}, func(r *rand.Rand, _ string, _, _ time.Duration) time.Duration {
		if r.IntN(3) == 0 {
			return 30*time.Second + time.Duration(r.Int64N(int64(270*time.Second)))
		}
		return 0
	})
}

// A healthy replica in a busy fleet a third of whose non-streamed calls
// their users give up on after 0.5-5.5 s, with nothing back: its answers
// end each run of them, and it draws what it drew with those calls not
// marked unanswered (a tenth over its share: the abandoned calls are out
// the shorter).
func TestEarlyLLMCancelsLeaveAHealthyReplicasShare(t *testing.T) {
	cancelledBoth(t, hungRun{seconds: 300}, func(r *rand.Rand, addr string, _, ttft time.Duration) time.Duration {
		if addr == "a:80" && ttft == 0 && r.IntN(3) == 0 {
			return 500*time.Millisecond + time.Duration(r.Int64N(int64(5*time.Second)))
		}
		return 0
	})
}
