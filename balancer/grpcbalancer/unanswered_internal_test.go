package grpcbalancer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb"
	core "github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A cancellation with nothing received from the server is Unanswered; one
// after bytes came back (headers, a message of the answer) is not, nor is
// a call never sent or any other end.
func TestOutcomeUnanswered(t *testing.T) {
	canceled := status.Error(codes.Canceled, "context canceled")
	for _, tc := range []struct {
		name string
		di   balancer.DoneInfo
		want bool
	}{
		{"canceled before an answer", balancer.DoneInfo{Err: canceled, BytesSent: true}, true},
		{"context canceled before an answer", balancer.DoneInfo{Err: context.Canceled, BytesSent: true}, true},
		{"canceled mid-answer", balancer.DoneInfo{Err: canceled, BytesSent: true, BytesReceived: true}, false},
		{"context canceled mid-answer", balancer.DoneInfo{Err: context.Canceled, BytesSent: true, BytesReceived: true}, false},
		{"canceled before it was sent", balancer.DoneInfo{Err: canceled}, false},
		{"request over the send limit", balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "trying to send message larger than max (1024 vs. 64)"), BytesSent: true}, false},
		{"deadline", balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "context deadline exceeded"), BytesSent: true}, false},
		{"unavailable", balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x"), BytesSent: true}, false},
	} {
		o := outcome(tc.di)
		assert.Equal(t, tc.want, o.Unanswered, tc.name)
		if tc.want {
			assert.True(t, o.Canceled(), tc.name)
		}
	}
}

// Through the policy: a rerank call its caller cancels with nothing back
// after a second raises the endpoint's rerank latency to that second; a
// cancel after the answer began, or a CANCEL reset while the caller's
// context lives (a proxy's, not the caller's doing), leaves it.
func TestCallerCancelBeforeAnAnswerBoundsLatency(t *testing.T) {
	canceled := status.Error(codes.Canceled, "context canceled")
	reset := status.Error(codes.Canceled, "stream terminated by RST_STREAM with error code: CANCEL")
	for _, tc := range []struct {
		name     string
		end      error
		received bool
		cancel   bool // the caller cancels its context
		want     time.Duration
	}{
		{"caller's cancel before an answer", canceled, false, true, time.Second},
		{"caller's cancel mid-answer", canceled, true, true, 200 * time.Millisecond},
		{"a CANCEL reset, the caller still waiting", reset, false, false, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := core.New(core.Options{Clock: clock, Rand: testutil.NewRand(1)})
			h := newHarness(t, registerShared(b), `{"methods": {"/ai.Rerank/": "rerank"}}`, 1)
			_, res := h.pick(balancer.PickInfo{FullMethodName: "/ai.Rerank/Score"})
			clock.Advance(200 * time.Millisecond)
			res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, res = h.pick(balancer.PickInfo{FullMethodName: "/ai.Rerank/Score", Ctx: ctx})
			clock.Advance(time.Second)
			if tc.cancel {
				cancel()
			}
			res.Done(balancer.DoneInfo{Err: tc.end, BytesSent: true, BytesReceived: tc.received})
			s := b.Stats()
			require.Len(t, s, 1)
			assert.EqualValues(t, 1, s[0].Canceled)
			assert.Equal(t, tc.want, s[0].ServiceLatency[inferlb.ServiceRerank])
		})
	}
}
