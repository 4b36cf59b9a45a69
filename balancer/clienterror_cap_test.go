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

// Requests are untrusted, and a session places a user's calls on one
// replica. A user sending bad calls under three sessions owned by three
// of four healthy replicas raised their client-error shares far above the
// fourth's, and the comparison passed all three over: the fourth drew
// 1,190 of the other users' 1,200 embedding calls. Only MaxEjectedFraction
// of a pool (here 2 of 4) may be passed over for client errors, as for
// outlier ejection: the third competes on its costs, and the fourth draws
// about half. One replica refusing most calls (a wrong API key) is still
// passed over.
func TestClientErrorShunningIsCappedLikeEjection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		aimed   int // replicas the user's sessions land on
		maxDraw int // most of the 1,200 calls the replica not aimed at may draw
	}{
		{"three of four aimed at", 3, 700},
		{"one of four aimed at: shunned", 1, 1200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(5)})
			require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "d"}}))
			// The user's sessions, one per replica aimed at.
			sessions := map[string]uint64{}
			for k := uint64(1); len(sessions) < 4 && k < 10_000; k++ {
				p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, AffinityKey: k, Session: true})
				require.NoError(t, err)
				if _, ok := sessions[p.Endpoint().Addr]; !ok {
					sessions[p.Endpoint().Addr] = k
				}
				p.Done(inferlb.Outcome{Latency: time.Millisecond})
			}
			require.Len(t, sessions, 4)
			aimed := []string{"a", "b", "c"}[:tc.aimed]
			drew := map[string]int{}
			for range 200 {
				for _, addr := range aimed {
					for range 3 {
						p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding, AffinityKey: sessions[addr], Session: true})
						require.NoError(t, err)
						clock.Advance(time.Millisecond)
						p.Done(inferlb.Outcome{ClientError: true})
					}
				}
				// Other users' calls, six at a time, answered.
				var out []balancer.Pick
				for range 6 {
					p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceEmbedding})
					require.NoError(t, err)
					drew[p.Endpoint().Addr]++
					out = append(out, p)
				}
				clock.Advance(20 * time.Millisecond)
				for _, p := range out {
					p.Done(inferlb.Outcome{})
				}
			}
			t.Logf("%d aimed at: other users' calls %v", tc.aimed, drew)
			assert.LessOrEqual(t, drew["d"], tc.maxDraw, "calls the replica not aimed at drew, of 1,200: %v", drew)
			if tc.aimed == 1 {
				assert.Less(t, drew["a"], 60, "the one replica refusing most calls is passed over: %v", drew)
			}
		})
	}
}
