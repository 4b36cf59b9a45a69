package balancer_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
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
	call func(r *rand.Rand) (length, ttft time.Duration)
	every func(r *rand.Rand) time.Duration // gap between calls; nil: 50-200 ms
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
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	require.NoError(t, b.Update(hungEndpoints))
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
		p        balancer.Pick
		start    time.Time
		end      time.Time
		ttft     time.Duration
		giveUpAt time.Time // when its caller gives up on it
	}
	var out []call1
	after, all = map[string]int{}, map[string]int{}
	hangAt := time.Duration(1<<63 - 1)
	if run.hangAt > 0 {
		hangAt = run.hangAt
	}
	epoch := clock.Now()
	hung := func(now time.Time) bool { return now.Sub(epoch) >= hangAt }
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
			addr := c.p.Endpoint().Addr
			stuck := addr == "a:80" && c.end.Sub(epoch) >= hangAt
			switch {
			case stuck && !c.giveUpAt.After(now):
				c.p.Done(inferlb.Outcome{Err: run.giveUp, Unanswered: c.ttft == 0})
			case !stuck && !c.end.After(now):
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
		length, ttft := call(r)
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
		require.NoError(t, err)
		addr := p.Endpoint().Addr
		all[addr]++
		if el := now.Sub(epoch); el >= max(run.hangAt, 0) && el < max(run.hangAt, 0)+time.Minute {
			after[addr]++
		}
		wait := 5*time.Second + time.Duration(r.Int64N(int64(25*time.Second)))
		giveUp := now.Add(wait)
		if h := epoch.Add(hangAt); giveUp.Before(h) {
			// A call out at the hang, whose caller would have waited
			// less: it gives up soon after.
			giveUp = h.Add(wait / 6)
		}
		out = append(out, call1{p: p, start: now, end: now.Add(length), ttft: ttft, giveUpAt: giveUp})
		clock.Advance(every(r))
	}
	for _, c := range out {
		c.p.Done(inferlb.Outcome{Err: context.Canceled})
	}
	return after, all
}

func TestHungLLMReplicaMeasure(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  hungRun
	}{
		{"no telemetry, callers cancel", hungRun{giveUp: context.Canceled}},
		{"frozen telemetry, callers cancel", hungRun{telemetry: true, giveUp: context.Canceled}},
		{"frozen telemetry, callers time out", hungRun{telemetry: true, giveUp: context.DeadlineExceeded}},
		{"no telemetry, callers time out", hungRun{giveUp: context.DeadlineExceeded}},
	} {
		tc.run.hangAt, tc.run.seconds = 60*time.Second, 130
		after, _ := runHungLLM(t, tc.run)
		total := 0
		for _, n := range after {
			total += n
		}
		t.Logf("%s: %v: a:80 %d of %d (%.2f of its share)", tc.name, after, after["a:80"], total, float64(after["a:80"])*4/float64(total))
	}
}
