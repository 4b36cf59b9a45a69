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

// A forward step of the clock is no wait: two generation calls out to a
// replica whose answers take a second, stopped by their callers 100 ms
// after the pick with nothing back, made a run of abandoned calls when the
// wall clock stepped an hour forward between (their waits read an hour,
// past the replica's answer time), and the replica was priced as hung
// (Abandoned 2) until it answered again; an embedding call stopped the
// same way raised the endpoint's embedding latency to an hour. With a
// clock that also reads a monotonic one (balancer.MonotonicClock, as the
// default clock does), a call's wait is the shorter of the two readings'
// (a step back still shortens it, as before): 100 ms, which marks nothing.
// Time that does pass, 30 s, still counts.
func TestForwardClockStepIsNoWait(t *testing.T) {
	for _, tc := range []struct {
		name      string
		step      bool // the wall clock steps forward an hour; else 30 s pass
		wantRun   int64
		wantEmbed time.Duration
	}{
		{name: "wall clock stepped forward", step: true, wantRun: 0, wantEmbed: 200 * time.Millisecond},
		{name: "time passed", step: false, wantRun: 2, wantEmbed: 30*time.Second + 100*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewMonoClock()
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(1)})
			t.Cleanup(b.Close)
			require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a:80"}}))
			pick := func(svc inferlb.Service) balancer.Pick {
				t.Helper()
				p, err := b.Pick(&inferlb.Request{Service: svc})
				require.NoError(t, err)
				return p
			}
			// The replica's answers: a generation takes a second, an
			// embedding 200 ms.
			gen := pick(inferlb.ServiceLLM)
			clock.Advance(time.Second)
			gen.Done(inferlb.Outcome{})
			emb := pick(inferlb.ServiceEmbedding)
			clock.Advance(200 * time.Millisecond)
			emb.Done(inferlb.Outcome{})

			calls := []balancer.Pick{pick(inferlb.ServiceLLM), pick(inferlb.ServiceLLM), pick(inferlb.ServiceEmbedding)}
			clock.Advance(100 * time.Millisecond)
			if tc.step {
				clock.Step(time.Hour)
			} else {
				clock.Advance(30 * time.Second)
			}
			// What an adapter that times the call itself reads (Pick.Elapsed).
			wait := 30*time.Second + 100*time.Millisecond
			if tc.step {
				wait = 100 * time.Millisecond
			}
			assert.Equal(t, wait, calls[0].Elapsed(), "the wait Pick.Elapsed reads")
			for _, p := range calls {
				p.Done(inferlb.Outcome{Err: context.Canceled, Unanswered: true})
			}
			assert.Zero(t, (&balancer.Pick{}).Elapsed(), "an empty Pick")
			s := b.Stats()[0]
			t.Logf("unanswered %d, abandoned run %d, embedding latency %v", s.Unanswered, s.Abandoned, s.ServiceLatency[inferlb.ServiceEmbedding])
			assert.EqualValues(t, 3, s.Unanswered)
			assert.Equal(t, tc.wantRun, s.Abandoned, "run of abandoned generation calls")
			assert.Equal(t, tc.wantEmbed, s.ServiceLatency[inferlb.ServiceEmbedding], "embedding latency")
		})
	}
}
