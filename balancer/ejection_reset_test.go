package balancer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/balancer"
)

// An interval in which a returned endpoint takes calls enough to be judged
// and is no outlier clears its count of consecutive ejections: failing
// again after that is a new episode, held out EjectionTime, not twice it.
// (Without a judged interval between, a flap doubles: see
// TestFlappingOutlierEjectionStillDoubles.)
func TestJudgedHealthyIntervalClearsTheEjectionCount(t *testing.T) {
	r := newEjectionRun(t)
	require.Equal(t, balancer.DefaultEjectionTime, r.ejected())
	r.interval(20, false) // 20 calls, all answered: judged, and no outlier
	assert.Equal(t, balancer.DefaultEjectionTime, r.ejected(), "a judged healthy interval since: it starts over")
}
