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
	"github.com/inferlb/inferlb/scoring"
)

// freeSlots is a custom Scorer whose cost is minus an endpoint's free
// capacity (lower is better, as Scorer asks): 100 free slots less those
// this process holds there.
type freeSlots struct{}

func (freeSlots) Cost(_ *inferlb.Request, s scoring.State) float64 {
	return -(100 - float64(s.InFlight))
}

// The balancer's own prices (a generation call's recent prefill, the
// data-parallel barrier, the slower decode speed) are factors of at least
// 1 on a Scorer's cost. Multiplied into a negative cost, they made the
// endpoint they price cheaper: the one just sent a 30k-token prompt beat
// an idle peer, took the next prompt too, and so every call it was drawn
// for. They must make any cost, negative too, dearer.
func TestBalancerPricesRaiseANegativeCost(t *testing.T) {
	b := newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: freeSlots{}}})
	var held []balancer.Pick
	defer func() {
		for i := range held {
			held[i].Done(inferlb.Outcome{Err: context.Canceled})
		}
	}()
	for range 20 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, PromptTokens: 30000})
		require.NoError(t, err)
		held = append(held, p)
	}
	for _, ep := range endpoints(2) {
		n := stat(t, b, ep.Addr).InFlight
		assert.InDelta(t, 10, n, 2, "%s took %d of 20 prompts", ep.Addr, n)
	}

	// Decode speed: the 3x slower endpoint must not be the cheaper one.
	speeds := map[string]time.Duration{fastEP: 20 * time.Millisecond, slowEP: 60 * time.Millisecond}
	b = newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3),
		Scorers: map[inferlb.Service]scoring.Scorer{inferlb.ServiceLLM: freeSlots{}}})
	teachSpeeds(t, b, speeds, 100)
	fast, slow := holdSplit(t, b)
	assert.Greater(t, fast, slow)
}
