package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// One user's calls that every replica refuses (an expired token), all
// under one session (or one prompt prefix), are a third of the traffic.
// They go to the key's owner, whose share of client errors rises until it
// is passed over (clienterror.go), and then, the walk moving the key off
// it, to the next endpoint in the key's order: counted there too, they
// raised that one's share in turn, and the key took as many replicas as
// the cap allows (2 of 4) out of every other user's rotation, one after
// the other. The other users' calls (keyed chats) then crowded onto the
// rest: the busiest replica drew 895 of their 1,800 calls with sessions
// and 922 with prefix keys (means over 20 seeds), against 485 without
// the bad user. A refusal met past a member passed over for its client
// errors is the key's, not the endpoint's: not counted, the key takes out
// its owner only (653 and 646), and a session moved so sticks to nothing.
func TestRefusedKeyTakesOutItsOwnerOnly(t *testing.T) {
	t.Parallel()
	const seeds, rounds = 20, 300
	for _, tc := range []struct {
		name    string
		session bool
	}{
		{"session", true},
		{"prefix", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busiest := func(bad int) int {
				sum := 0
				for seed := uint64(1); seed <= seeds; seed++ {
					clock := testutil.NewClock()
					opts := balancer.Options{Clock: clock, Rand: testutil.NewRand(seed), AffinitySeed: seed}
					if tc.session {
						opts.StickyTTL = time.Minute
					}
					b := balancer.New(opts)
					require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "d"}}))
					drew := map[string]int{}
					keys := chatKeys(64)
					for r := range rounds {
						for range bad {
							p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "x", AffinityKey: 0xdeadbeefcafe, Session: tc.session})
							require.NoError(t, err)
							clock.Advance(time.Millisecond)
							p.Done(inferlb.Outcome{ClientError: true})
						}
						var out []balancer.Pick
						for i := range 6 {
							n := r*6 + i
							p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: fmt.Sprintf("t%d", n%12), AffinityKey: keys[n%len(keys)], Session: tc.session})
							require.NoError(t, err)
							drew[p.Endpoint().Addr]++
							out = append(out, p)
						}
						clock.Advance(20 * time.Millisecond)
						for _, p := range out {
							p.Done(inferlb.Outcome{})
						}
					}
					most := 0
					for _, n := range drew {
						most = max(most, n)
					}
					sum += most
				}
				return sum / seeds
			}
			clean, refused := busiest(0), busiest(3)
			t.Logf("%s keys: the busiest replica drew %d of the good users' %d calls (mean of %d seeds); %d without the bad user",
				tc.name, refused, rounds*6, seeds, clean)
			// With one replica out, the other 3 share the calls (600 each);
			// with two, 2 do (900).
			assert.Less(t, refused, 750, "the busiest replica's calls of %d", rounds*6)
		})
	}
}
