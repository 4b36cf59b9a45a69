package balancer_test

import (
	"errors"
	"testing"
	"time"

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

// TestFractionalRetryFloor: a floor under one retry a second allows one
// every 1/floor seconds, as documented, after the bank it starts with (ten
// seconds' worth, or one retry's when that is longer). The floor banked at
// most one second of allowance, less than one retry's worth, so a floor of
// 0.5 (one retry every two seconds) allowed none at all, ever.
func TestFractionalRetryFloor(t *testing.T) {
	for _, tc := range []struct {
		floor float64
		every time.Duration
	}{{0.5, 2 * time.Second}, {0.1, 10 * time.Second}, {2, 500 * time.Millisecond}} {
		clock := testutil.NewClock()
		b := newBalancer(t, 2, balancer.Options{Clock: clock, RetryRatio: -1, RetryFloor: tc.floor})
		allowed := 0
		const span = time.Minute
		for range span / (100 * time.Millisecond) {
			if b.AllowRetry() {
				allowed++
			}
			clock.Advance(100 * time.Millisecond)
		}
		want := int(span/tc.every) + int(max(tc.every, 10*time.Second)/tc.every)
		assert.InDelta(t, want, allowed, 1, "floor %v: retries allowed in a minute", tc.floor)
	}
}

// TestRetryBudgetAbsorbsACrashBurst: a replica that crashes fails every
// call it was streaming at once. The floor banks 10 s of allowance, as the
// reserve of Finagle's and Linkerd's budgets (minRetriesPerSec x ttl), so
// such a burst fails over whole; it banked one second, so of 60 calls
// failing together only 30 (20 earned by traffic, 10 of floor) went
// elsewhere and the rest failed on a healthy fleet. Sustained retries stay
// bounded: the bank refills at the floor's rate.
func TestRetryBudgetAbsorbsACrashBurst(t *testing.T) {
	clock := testutil.NewClock()
	b := newBalancer(t, 8, balancer.Options{Clock: clock, RetryRatio: 0.2, RetryFloor: 10})
	for range 200 {
		p, err := b.Pick(&inferlb.Request{})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	allowed := 0
	for range 60 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.Equal(t, 60, allowed, "a crash's burst of failovers")
	for range 200 {
		if b.AllowRetry() {
			allowed++
		}
	}
	assert.Equal(t, 120, allowed, "the bank (100) and what traffic earned (20), no more")
	clock.Advance(time.Second)
	more := 0
	for range 50 {
		if b.AllowRetry() {
			more++
		}
	}
	assert.Equal(t, 10, more, "then the floor's 10 a second")
}
