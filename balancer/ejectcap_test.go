package balancer_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestConcurrentTripsRespectMaxEjectedFraction: when a whole fleet fails at
// once (a network blip), breakers trip on many goroutines together. Each
// checked the cap and then marked its endpoint out, so trips racing
// between the two each saw room for one more and together held out more
// than MaxEjectedFraction, just when the cap matters.
func TestConcurrentTripsRespectMaxEjectedFraction(t *testing.T) {
	const n = 8
	for round := range 100 {
		b := newBalancer(t, n, balancer.Options{
			Clock: testutil.NewClock(), Rand: testutil.NewRand(uint64(round)),
			Scorers: constantScorers(), OutlierInterval: -1, BreakerFailures: 1,
		})
		picks := make([]balancer.Pick, n)
		for i, ep := range endpoints(n) {
			picks[i] = pickOn(t, b, ep.Addr)
		}
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range picks {
			wg.Go(func() {
				start.Wait()
				picks[i].Done(inferlb.Outcome{Err: errDown})
			})
		}
		start.Done()
		wg.Wait()
		open := 0
		for _, s := range b.Stats() {
			if s.BreakerOpen {
				open++
			}
		}
		require.LessOrEqual(t, open, n/2, "round %d: MaxEjectedFraction 0.5 of %d", round, n)
	}
}
