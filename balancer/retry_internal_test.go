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
	rb.tokens.Store(rb.capMilli - 100)
	v := rb.tokens.Add(rb.ratioMilli) // a deposit passes the cap...
	require.Greater(t, v, rb.capMilli)
	require.True(t, rb.withdraw(0)) // ...a retry is taken before its clamp...
	rb.clamp(v)                     // ...which must not refund it
	assert.Equal(t, v-1000, rb.tokens.Load())

	// Without a race, the clamp holds the bucket at its cap.
	rb.tokens.Store(rb.capMilli - 100)
	rb.deposit()
	assert.Equal(t, rb.capMilli, rb.tokens.Load())
}
