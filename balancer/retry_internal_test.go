package balancer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A deposit that passes the cap is clamped back; a retry taken between the
// deposit and its clamp must stay paid for, not be refunded by the clamp.
func TestRetryBudgetClampKeepsAWithdrawal(t *testing.T) {
	rb := newRetryBudget(0.5, 0)
	rb.tokens.Store(rb.capMicro - 100)
	v := rb.tokens.Add(rb.ratioMicro) // a deposit passes the cap...
	require.Greater(t, v, rb.capMicro)
	require.True(t, rb.withdraw(0, false)) // ...a retry is taken before its clamp...
	rb.clamp(v)                            // ...which must not refund it
	assert.Equal(t, v-oneRetry, rb.tokens.Load())

	// Without a race, the clamp holds the bucket at its cap.
	rb.tokens.Store(rb.capMicro - 100)
	rb.deposit()
	assert.Equal(t, rb.capMicro, rb.tokens.Load())
}

// A ratio under a thousandth still earns retries: one per 2,000 calls at
// 0.0005 (in milli-tokens it earned none).
func TestRetryBudgetSmallRatio(t *testing.T) {
	rb := newRetryBudget(0.0005, 0)
	for range 1999 {
		rb.deposit()
	}
	assert.False(t, rb.withdraw(0, false))
	rb.deposit()
	assert.True(t, rb.withdraw(0, false))
	assert.False(t, rb.withdraw(0, false))
}
