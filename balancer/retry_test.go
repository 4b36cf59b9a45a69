package balancer_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// TestRetriesDoNotEarnRetries: the budget is a share of the calls made, not
// of the attempts. A retry that deposited as a new call did would refund
// part of its own cost: retries then added RetryRatio/(1-RetryRatio) of the
// traffic (25% for the default 0.2, twice the traffic for 0.5), and with
// RetryRatio 1 every retry paid for itself, so the budget never ran out.
func TestRetriesDoNotEarnRetries(t *testing.T) {
	for _, ratio := range []float64{0.2, 0.5, 1} {
		b := newBalancer(t, 2, balancer.Options{Clock: testutil.NewClock(), Rand: testutil.NewRand(1), RetryRatio: ratio, RetryFloor: -1})
		const calls = 100
		for range calls {
			p, err := b.Pick(&inferlb.Request{})
			require.NoError(t, err)
			p.Done(inferlb.Outcome{})
		}
		retries := 0
		for range 10 * calls {
			p, err := b.PickRetry(&inferlb.Request{}, "")
			if errors.Is(err, balancer.ErrNoRetryBudget) {
				break
			}
			require.NoError(t, err)
			p.Done(inferlb.Outcome{})
			retries++
		}
		assert.Equal(t, int(ratio*calls), retries, "RetryRatio %v", ratio)
	}
}
