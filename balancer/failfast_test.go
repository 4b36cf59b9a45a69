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

// failFastShare routes calls of svc over a fleet of three where two
// endpoints answer every call with an error at once and the third serves
// each call for hold picks (so it carries hold calls in flight), and
// returns the share of the last 300 picks that went to a failing one.
// MaxEjectedFraction (0.5 of 3: one endpoint) lets only one of the two
// failing endpoints trip its breaker; the other stays in rotation.
func failFastShare(t *testing.T, svc inferlb.Service, hold int) float64 {
	t.Helper()
	clock := testutil.NewClock()
	b := newBalancer(t, 3, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), OutlierInterval: -1})
	good := endpoints(3)[0].Addr
	var held []balancer.Pick
	failing := 0
	const calls = 600
	for i := range calls {
		p, err := b.Pick(&inferlb.Request{Service: svc, PromptTokens: 200, MaxOutputTokens: 200})
		require.NoError(t, err)
		if p.ID() != good {
			p.Done(inferlb.Outcome{Err: errDown, Latency: time.Millisecond})
			if i >= calls-300 {
				failing++
			}
		} else {
			held = append(held, p)
			if len(held) > hold {
				held[0].Done(inferlb.Outcome{Latency: 50 * time.Millisecond})
				held = held[1:]
			}
		}
		clock.Advance(10 * time.Millisecond)
	}
	for _, p := range held {
		p.Done(inferlb.Outcome{})
	}
	var trips uint64
	for _, s := range b.Stats() {
		trips += s.Trips
	}
	// One failing endpoint is held out, the other is capped; or, for
	// embeddings, whose picks compare all three (scoring.FullScanner),
	// the failing ones lose every pick after their first failures, and
	// one may never fail the five calls in a row its breaker needs.
	require.LessOrEqual(t, trips, uint64(1), "MaxEjectedFraction holds one failing endpoint in rotation")
	if svc != inferlb.ServiceEmbedding {
		require.EqualValues(t, 1, trips, "one failing endpoint is held out, the other is capped")
	}
	return float64(failing) / 300
}

// TestFastFailuresDoNotAttractTraffic: an endpoint that answers every
// call with an error at once, and that the breaker cannot hold out
// (MaxEjectedFraction reached), has nothing in flight: priced by load it
// looks idle. Its error rate must outweigh that, however busy its peers
// are: it took 100% of the picks from a generation peer with 40 calls in
// flight (LLM: its cost was capped at 11x an idle endpoint's) and 100%
// from an embedding peer with 2 (Latency: with no successful call its
// latency read as none, 1us, so it looked like the fastest endpoint).
func TestFastFailuresDoNotAttractTraffic(t *testing.T) {
	for _, tc := range []struct {
		svc  inferlb.Service
		hold int
	}{
		{inferlb.ServiceLLM, 40},
		{inferlb.ServiceEmbedding, 2},
		{inferlb.ServiceEmbedding, 20},
	} {
		share := failFastShare(t, tc.svc, tc.hold)
		assert.Less(t, share, 0.1, "%v with %d calls in flight on the healthy endpoint: share of picks to the failing one", tc.svc, tc.hold)
	}
}
