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

// The reference a refusing owner is shunned against is the lowest
// client-error share among the first endpoints of the key's order, not the
// highest: peers that refuse a call now and then (a user's bad request
// among many) still leave a replica refusing every call far above them,
// and its keys move. Taken as the highest (the refusing owner's own), no
// owner would ever be shunned once its peers had any client error.
func TestShunnedOwnerLosesItsKeysAmongPeersWithSomeClientErrors(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(17), AffinitySeed: 17})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "bad"}}))
	answer := func(addr string, n int) (time.Duration, bool) {
		if addr == "bad" {
			return time.Millisecond, true
		}
		return 50 * time.Millisecond, n%8 == 0 // one call in eight refused everywhere
	}
	const rounds, perRound = 500, 4
	run := driveKeyed(t, b, clock, chatKeys(64), false, rounds, perRound, answer)
	t.Logf("calls drawn: %v", run.drew)
	assert.Less(t, run.drew["bad"], rounds*perRound/40, "calls the replica refusing every call drew of %d", rounds*perRound)
}
