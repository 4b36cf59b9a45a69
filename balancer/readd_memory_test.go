package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// An address removed by Update and added back (a pod IP reused by a new
// pod) is a new endpoint: what the Balancer learnt about the old one by
// its answers (that it does not serve a model, that its context window
// is small) is the old replica's, kept by endpoint serial, and must not
// hold the new one out. Before the removal the model's long
// calls pass it over; after it is added back they reach it.
func TestReAddedAddressForgetsWhatTheOldEndpointAnswered(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome inferlb.Outcome
	}{
		{"not served", inferlb.Outcome{NotServedModel: "m"}},
		{"too long", inferlb.Outcome{ContextWindow: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(5), SlowStartWindow: time.Millisecond})
			eps := endpoints(3)
			x := eps[0].Addr
			require.NoError(t, b.Update(eps))
			req := inferlb.Request{Service: inferlb.ServiceLLM, Model: "m", PromptTokens: 4000}
			p, err := b.PickAt(&req, serialOf(t, b, x))
			require.NoError(t, err)
			o := tc.outcome
			o.Model = "m"
			p.Done(o)
			reached := func() int {
				n := 0
				for range 300 {
					p, err := b.Pick(&req)
					require.NoError(t, err)
					if p.ID() == x {
						n++
					}
					p.Done(inferlb.Outcome{Model: "m"})
				}
				return n
			}
			require.Zero(t, reached(), "the answer is remembered")

			require.NoError(t, b.Update(eps[1:]))
			require.NoError(t, b.Update(eps))
			clock.Advance(time.Second) // past the new endpoint's slow start
			assert.Positive(t, reached(), "the new endpoint at the old address is passed over for the old one's answer")
		})
	}
}
