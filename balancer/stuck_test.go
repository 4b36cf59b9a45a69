package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// errTimeout ends the calls still out when a run ends.
var errTimeout = context.DeadlineExceeded

// outstanding is a call picked and not yet done, ending at end with err.
type outstanding struct {
	p   balancer.Pick
	end time.Time
	o   inferlb.Outcome
}

// runRerank sends a rerank call every interval to three endpoints for
// seconds, on a fake clock; answer returns how long the call to addr sent
// at elapsed takes (a call that never ends in the run: longer than it).
// It returns how many calls each endpoint drew after from.
func runRerank(t *testing.T, every time.Duration, seconds int, from time.Duration, answer func(addr string, elapsed time.Duration) time.Duration) map[string]int {
	t.Helper()
	return runRerankEnding(t, every, seconds, from, func(addr string, elapsed time.Duration) (time.Duration, inferlb.Outcome) {
		return answer(addr, elapsed), inferlb.Outcome{}
	})
}

// runRerankEnding is runRerank whose calls end with the outcome end returns
// with their length.
func runRerankEnding(t *testing.T, every time.Duration, seconds int, from time.Duration, end func(addr string, elapsed time.Duration) (time.Duration, inferlb.Outcome)) map[string]int {
	t.Helper()
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}, {Addr: "b:80"}, {Addr: "c:80"}}))
	var out []outstanding
	drew := map[string]int{}
	for elapsed := time.Duration(0); elapsed < time.Duration(seconds)*time.Second; elapsed += every {
		now := clock.Now()
		k := 0
		for _, c := range out {
			if c.end.After(now) {
				out[k] = c
				k++
				continue
			}
			c.p.Done(c.o)
		}
		out = out[:k]
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceRerank})
		require.NoError(t, err)
		addr := p.Endpoint().Addr
		if elapsed >= from {
			drew[addr]++
		}
		d, o := end(addr, elapsed)
		out = append(out, outstanding{p: p, end: now.Add(d), o: o})
		clock.Advance(every)
	}
	for _, c := range out {
		c.p.Done(inferlb.Outcome{Err: errTimeout})
	}
	return drew
}

// A rerank fleet at 200 ms a call, one endpoint of which stops answering
// (a hung GPU, a connection the kernel has not noticed is dead): its
// peak-EWMA is fed only by calls that finish, so it held at 200 ms, and
// while its calls were out it decayed to the scorer's 50 ms prior, its floor
// with calls in flight. The stuck endpoint then cost a quarter of a
// healthy one per call in flight and drew calls until it held several
// times as many as each of them: 13 calls in its first 10 s (4 or 5 now,
// with the run's seed; 5 with seed 1 since an endpoint's first answer is
// held aside, which shifts the run's order of picks), each to hang until
// the caller gave up. Two calls out with none finished for longer than
// its latency now price it at least at that wait.
func TestStuckEndpointStopsDrawingCalls(t *testing.T) {
	const stuckAt = 20 * time.Second
	drew := runRerank(t, 20*time.Millisecond, 30, stuckAt, func(addr string, elapsed time.Duration) time.Duration {
		if addr == "a:80" && elapsed >= stuckAt {
			return time.Hour
		}
		return 200 * time.Millisecond
	})
	assert.LessOrEqual(t, drew["a:80"], 5, "calls the stuck endpoint drew in 10 s, of %v", drew)
}

// A stuck endpoint whose callers give up on their calls after a second
// (a user's stop, a hedged call's loser, an agent's step abandoned:
// context.Canceled, neither success nor failure) drew 67 calls in its first
// 10 s: each abandoned call reset its wait. With its wait run from the last
// call it answered or failed it drew 22: once every call out was abandoned
// the next started a busy period afresh, at the latency of its last answer
// (200 ms). Its abandoned calls had nothing back (Outcome.Unanswered), so
// each now says it takes at least the second its caller waited, and it
// draws 13 or 14 with the run's seed (4 or 5 when nobody cancels, its
// wait then growing unbounded).
func TestStuckEndpointStopsDrawingCallsItsCallersCancel(t *testing.T) {
	const stuckAt = 20 * time.Second
	drew := runRerankEnding(t, 20*time.Millisecond, 30, stuckAt, func(addr string, elapsed time.Duration) (time.Duration, inferlb.Outcome) {
		if addr == "a:80" && elapsed >= stuckAt {
			return time.Second, inferlb.Outcome{Err: context.Canceled, Unanswered: true}
		}
		return 200 * time.Millisecond, inferlb.Outcome{}
	})
	assert.LessOrEqual(t, drew["a:80"], 14, "calls the stuck endpoint drew in 10 s, of %v", drew)
}

// One slow call on an endpoint that serves others meanwhile (a pathological
// input, a long batch) is not a stuck endpoint: with that call alone out,
// its wait does not count, and the endpoint keeps at least half its share of
// 20 ms calls (sent every 5 ms, so its peers are busy) while the call is out.
func TestOneSlowCallDoesNotStopAnEndpoint(t *testing.T) {
	slow := false
	drew := runRerank(t, 5*time.Millisecond, 30, 10*time.Second, func(addr string, elapsed time.Duration) time.Duration {
		if addr == "a:80" && elapsed >= 10*time.Second && !slow {
			slow = true
			return time.Hour
		}
		return 20 * time.Millisecond
	})
	assert.Greater(t, drew["a:80"], 20*200/3/2, "calls the endpoint with one slow call out drew in 20 s, of %v", drew)
}

// cancelEvery3rd runs reranks to three endpoints at 200 ms a call, a third
// of a:80's calls ending instead after d with o (a cancellation), and
// returns the calls each drew in its last 20 s.
func cancelEvery3rd(t *testing.T, d time.Duration, o inferlb.Outcome) map[string]int {
	t.Helper()
	n := 0
	return runRerankEnding(t, 20*time.Millisecond, 30, 10*time.Second, func(addr string, _ time.Duration) (time.Duration, inferlb.Outcome) {
		if addr == "a:80" {
			if n++; n%3 == 0 {
				return d, o
			}
		}
		return 200 * time.Millisecond, inferlb.Outcome{}
	})
}

// A healthy endpoint whose callers give up on some of its calls before
// its answer, sooner than it answers (a user's stop, a hedged call's
// loser), is not stuck: such a wait, shorter than its latency, says
// nothing, and it draws exactly the calls it drew when nothing told the
// balancer the calls had no answer (391 of 1,000 with cancels at 50 ms,
// its calls out the shorter; 360 at 150 ms).
func TestEarlyCancelsLeaveAHealthyEndpointsShare(t *testing.T) {
	for _, d := range []time.Duration{50 * time.Millisecond, 150 * time.Millisecond} {
		unanswered := cancelEvery3rd(t, d, inferlb.Outcome{Err: context.Canceled, Unanswered: true})
		canceled := cancelEvery3rd(t, d, inferlb.Outcome{Err: context.Canceled})
		assert.Equal(t, canceled, unanswered, "cancels after %v", d)
		assert.Greater(t, unanswered["a:80"], unanswered["b:80"], "cancels after %v: its calls are out the shorter", d)
	}
}

// Users who stop reading a healthy endpoint's answers (a third of its
// calls cancelled after 1 s, its answer begun at 200 ms: not Unanswered)
// tell nothing about its latency: it keeps the share its longer calls
// out leave it (187 of 1,000 calls), where read as a second's wait with
// nothing back each would price it at a second, and it drew 43.
func TestCancelsAfterTheAnswerChangeNothing(t *testing.T) {
	drew := cancelEvery3rd(t, time.Second, inferlb.Outcome{Err: context.Canceled})
	assert.Greater(t, drew["a:80"], 150, "calls the endpoint drew in 20 s, of %v", drew)
}
