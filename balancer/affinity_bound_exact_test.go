package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// The bound ceil(c x w_i/W x (L+1)) was computed in floating point, and
// where c x share is a whole number the product came out a hair above it:
// with 5 (or 10) equal replicas at the default 1.25, 1/5 x 12 x 1.25 is
// 3.0000000000000004, and its ceiling let the owner take a 4th call where
// the bound is 3 (at 12, 24, 28, 48... calls for 5 replicas). An owner at
// the bound still takes its key.
func TestBoundIsExactWhereTheShareIsWhole(t *testing.T) {
	const key = 0x1234567890abcdef
	for _, tc := range []struct {
		name       string
		n, onOwner int
		total      int // calls in flight before the pick
		home       bool
	}{
		// 11 in flight: the pick makes 12, a fair share of 2.4 each and a
		// bound of 1.25 x 2.4 = 3 calls.
		{"owner at the bound keeps its key", 5, 2, 11, true},
		{"owner past the bound spills", 5, 3, 11, false},
		// 10 replicas, 23 in flight: share 2.4, bound 3.
		{"ten replicas, owner past the bound spills", 10, 3, 23, false},
		{"ten replicas, owner at the bound keeps its key", 10, 2, 23, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := affine(t, tc.n, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(5)})
			home := owner(t, b, key)
			serials := map[string]uint64{}
			for range 1000 {
				if len(serials) == tc.n {
					break
				}
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM})
				require.NoError(t, err)
				serials[p.ID()] = p.Serial()
				p.Done(inferlb.Outcome{})
			}
			require.Len(t, serials, tc.n)
			var held []balancer.Pick
			hold := func(id string, k int) {
				for range k {
					p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serials[id])
					require.NoError(t, err)
					require.Equal(t, id, p.ID())
					held = append(held, p)
				}
			}
			hold(home, tc.onOwner)
			var others []string
			for _, e := range endpoints(tc.n) {
				if e.Key() != home {
					others = append(others, e.Key())
				}
			}
			left := tc.total - tc.onOwner
			for i, id := range others {
				k := 2 // the owner's share, but the last takes what is left
				if i == len(others)-1 {
					k = left
				}
				hold(id, k)
				left -= k
			}
			require.Zero(t, left)
			p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key})
			require.NoError(t, err)
			if tc.home {
				assert.Equal(t, home, p.ID(), "the owner, with %d calls of a bound of 3, lost its key", tc.onOwner)
			} else {
				assert.NotEqual(t, home, p.ID(), "the owner, with %d calls of a bound of 3, took a %dth", tc.onOwner, tc.onOwner+1)
			}
			p.Done(inferlb.Outcome{})
			for i := range held {
				held[i].Done(inferlb.Outcome{})
			}
		})
	}
}
