package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// MaxEjectedFraction of a pool is the fraction times the pool's size,
// rounded down. The product was rounded down in floating point, where
// 0.29 * 100 is 28.999999999999996: 28 of 100 endpoints could be held
// out, not 29 (and 62 of 90 at 0.7, 28 of 50 at 0.58).
func TestMaxEjectedFractionIsNotCutByRounding(t *testing.T) {
	for _, tc := range []struct {
		fraction float64
		n, want  int
	}{{0.29, 100, 29}, {0.7, 90, 63}, {0.58, 50, 29}, {0.5, 3, 1}, {0.5, 4, 2}} {
		rec := &recorder{}
		b := newBalancer(t, tc.n, balancer.Options{
			Clock: testutil.NewClock(), Rand: testutil.NewRand(1), OnEvent: rec.record,
			OutlierInterval: -1, BreakerFailures: 1, MaxEjectedFraction: tc.fraction,
		})
		for _, ep := range endpoints(tc.n) {
			serial, ok := b.Serial(ep.Key())
			require.True(t, ok)
			p, err := b.PickAt(&inferlb.Request{}, serial)
			require.NoError(t, err)
			require.Equal(t, ep.Key(), p.ID())
			p.Done(inferlb.Outcome{Err: errDown})
		}
		tripped := 0
		for _, k := range rec.kinds() {
			if k == balancer.EventTripped {
				tripped++
			}
		}
		assert.Equal(t, tc.want, tripped, "%v of %d", tc.fraction, tc.n)
	}
}
