package balancer

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/internal/testutil"
)

// A pick that sees an Update's new snapshot finds every member's group
// counters in place: the snapshot of an endpoint new to the Balancer was
// once published before they were, and a pick in between dereferenced nil.
func TestPickRacingUpdateOfNewEndpoints(t *testing.T) {
	b := New(Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(3)})
	require.NoError(t, b.Update([]inferlb.Endpoint{{ID: "base"}}))
	const updates = 300
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if p, err := b.Pick(&inferlb.Request{}); err == nil {
					p.Done(inferlb.Outcome{})
				}
			}
		}()
	}
	for i := range updates {
		// Every Update brings endpoints the Balancer has never seen.
		require.NoError(t, b.Update([]inferlb.Endpoint{{ID: fmt.Sprint("n", i)}, {ID: fmt.Sprint("m", i)}}))
	}
	close(done)
	wg.Wait()
}
