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

// With an ErrorAlpha below the 1% floor, each client error adds less than
// the floor to the share: it must still add up (a share below the floor is
// dropped to zero only on a success), or a replica refusing every call is
// never shunned and, fast and idle-looking, takes the most calls.
func TestClientErrorsAddUpUnderASmallErrorAlpha(t *testing.T) {
	clock := testutil.NewClock()
	b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(7), ErrorAlpha: 0.005})
	t.Cleanup(b.Close)
	require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "bad"}}))
	answer := func(addr string, _ int) (time.Duration, bool) {
		if addr == "bad" {
			return time.Millisecond, true
		}
		return 20 * time.Millisecond, false
	}
	const rounds, perRound = 1000, 4 // 4,000 calls over 20 s
	drew := driveAnswers(t, b, clock, inferlb.ServiceEmbedding, 0, rounds, perRound, answer)
	t.Logf("one replica answering 401 in 1 ms, ErrorAlpha 0.005: %v", drew)
	assert.Less(t, drew["bad"], rounds*perRound/10, "calls the replica answering 401 drew of %d", rounds*perRound)
}
