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

// A retry the budget denies sends no call. It found where the call would
// have gone first, and that search recorded the spill: the key's sticky
// session moved to an endpoint that never saw it (every later call of the
// conversation went there, to a cold cache), the spill memory called that
// endpoint warm for the key, and its ColdSpills counted a call it never
// got. During an incident, when the budget runs out, that scattered every
// failing conversation.
func TestDeniedRetryLeavesNoTrace(t *testing.T) {
	const key = 0x1234567890abcdef
	b := affine(t, 4, balancer.Options{
		Rand: testutil.NewRand(3), Clock: testutil.NewClock(),
		StickyTTL: time.Minute, RetryRatio: -1, RetryFloor: -1,
	})
	req := &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}
	home := owner(t, b, key)
	for range 5 {
		_, err := b.PickRetry(req, home)
		require.ErrorIs(t, err, balancer.ErrNoRetryBudget)
	}
	assert.Equal(t, home, owner(t, b, key), "the key's session stays on its owner")
	for _, s := range b.Stats() {
		assert.Zero(t, s.WarmSpills+s.ColdSpills, "%s: spills of calls never sent", s.ID)
	}
}
