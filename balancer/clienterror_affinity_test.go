package balancer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
)

// keyedRun is what driveKeyed saw: the calls each endpoint drew, and for
// each key the endpoint of each of its calls, in order.
type keyedRun struct {
	drew  map[string]int
	byKey map[uint64][]string
}

// driveKeyed sends rounds of perRound concurrent chat calls to b, the n-th
// (from 0) keyed with keys[n % len(keys)] (a conversation's prefix key, or
// with session set its session), ending each as answer says, in order of
// its latency on the fake clock.
func driveKeyed(t *testing.T, b *balancer.Balancer, clock *testutil.Clock, keys []uint64, session bool, rounds, perRound int, answer answerFunc) keyedRun {
	t.Helper()
	run := keyedRun{drew: map[string]int{}, byKey: map[uint64][]string{}}
	key := func(n int) uint64 { return keys[n%len(keys)] }
	driveRounds(t, b, clock, 0, rounds, perRound, answer,
		func(n int) *inferlb.Request {
			return &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key(n), Session: session}
		},
		func(n int, addr string) {
			run.drew[addr]++
			run.byKey[key(n)] = append(run.byKey[key(n)], addr)
		})
	return run
}

func chatKeys(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	return keys
}

// A replica with a wrong API key answers every chat 401 in a millisecond.
// P2C and the scan pass it over (clienterror.go), but the affinity walk
// took each key's owner without reading its share: keyed chats, prompt
// prefixes or sessions, went to it as to any owner, and the quarter of
// the conversations it owns failed on every call (376 of 2,000 calls with
// 4 replicas, prefix keys or sessions; 688 with two such of 5). Passed
// over as an owner with an open breaker is, its keys spill to the next
// endpoints in their order, and a session stuck to it moves: it draws 16
// of the prefix keys' calls, 16 of the sessions', and the two 32. Without
// the check on the sticky endpoint, sessions stuck to it stayed (221
// calls).
func TestShunnedOwnerLosesItsKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		session bool
		sticky  time.Duration
		bad     []string
		most    int // good endpoints a refusing owner's key goes to; 0: unchecked
	}{
		{"prefix", false, 0, []string{"bad"}, 2},
		{"session", true, time.Minute, []string{"bad"}, 1},
		// Two of five: a key both of them own in turn (one its owner,
		// the other next in its order) still leaves them, for the good
		// replicas next in its order. The two refusing replicas take no
		// share of the load the bound shares (fleetView.shunned): counted,
		// they made the others' bound 2 calls here, and keys spilled past
		// the next two to all three others.
		{"prefix, two refusing", false, 0, []string{"bad", "bad2"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock()
			b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(17), AffinitySeed: 17, StickyTTL: tc.sticky})
			eps := []inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}}
			for _, a := range tc.bad {
				eps = append(eps, inferlb.Endpoint{Addr: a})
			}
			require.NoError(t, b.Update(eps))
			answer := func(addr string, _ int) (time.Duration, bool) {
				if slices.Contains(tc.bad, addr) {
					return time.Millisecond, true
				}
				return 50 * time.Millisecond, false
			}
			const rounds, perRound = 500, 4 // 2,000 calls over 25 s
			run := driveKeyed(t, b, clock, chatKeys(64), tc.session, rounds, perRound, answer)
			t.Logf("%s keys, %d of %d replicas answering 401 in 1 ms: %v", tc.name, len(tc.bad), len(eps), run.drew)
			refused := 0
			for _, a := range tc.bad {
				refused += run.drew[a]
			}
			assert.Less(t, refused, len(tc.bad)*rounds*perRound/40, "calls the replicas answering 401 drew of %d", rounds*perRound)
			// Its keys (those whose first call it took, before any share
			// rose) went where a key whose owner's breaker is open goes:
			// to the next two endpoints in their order (the cheaper of
			// the two), and a session to one of them, where it stays. A
			// conversation it owns is not spread over the fleet.
			moved := 0
			for _, eps := range run.byKey {
				if tc.most == 0 || !slices.Contains(tc.bad, eps[0]) {
					continue // not a key a refusing replica owns
				}
				moved++
				went := map[string]bool{}
				for _, e := range eps[len(eps)/2:] {
					if !slices.Contains(tc.bad, e) {
						went[e] = true
					}
				}
				assert.LessOrEqual(t, len(went), tc.most, "a key the refusing replica owned: %v", eps)
			}
			if tc.most > 0 {
				assert.Positive(t, moved, "some key's owner refuses")
			}
		})
	}
}

// The caller's own bad calls (an expired token, a malformed body) are
// refused by every replica alike: no endpoint's share is far above the
// others', and every key keeps the endpoint it has with no client errors
// at all.
func TestCallersOwnClientErrorsKeepKeysHome(t *testing.T) {
	keys := chatKeys(64)
	const rounds, perRound = 250, 4
	homes := func(t *testing.T, badShare int, session bool) (map[uint64]string, keyedRun) {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(19), AffinitySeed: 19})
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "d"}}))
		answer := func(_ string, n int) (time.Duration, bool) {
			if n%10 < badShare {
				return time.Millisecond, true
			}
			return 50 * time.Millisecond, false
		}
		run := driveKeyed(t, b, clock, keys, session, rounds, perRound, answer)
		home := map[uint64]string{}
		for k, eps := range run.byKey {
			count := map[string]int{}
			for _, e := range eps {
				count[e]++
				if count[e] > count[home[k]] {
					home[k] = e
				}
			}
		}
		return home, run
	}
	for _, session := range []bool{false, true} {
		clean, _ := homes(t, 0, session)
		for _, badShare := range []int{3, 7, 10} {
			_, run := homes(t, badShare, session)
			hits, calls := 0, 0
			for k, eps := range run.byKey {
				for _, e := range eps {
					calls++
					if e == clean[k] {
						hits++
					}
				}
			}
			t.Logf("session %v, %d/10 of the calls refused everywhere: %d of %d calls on the key's endpoint without them; %v",
				session, badShare, hits, calls, run.drew)
			assert.GreaterOrEqual(t, float64(hits), 0.97*float64(calls), "session %v, %d/10 bad", session, badShare)
		}
	}
}

// The affinity walk's check of client-error shares allocates nothing: keyed
// chats, prefix keys and sessions, over a fleet whose owner of some keys
// refuses every call.
func TestShunnedOwnerWalkDoesNotAllocate(t *testing.T) {
	for _, session := range []bool{false, true} {
		clock := testutil.NewClock()
		b := balancer.New(balancer.Options{Clock: clock, Rand: testutil.NewRand(23), AffinitySeed: 23, StickyTTL: time.Minute})
		require.NoError(t, b.Update([]inferlb.Endpoint{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}, {Addr: "bad"}}))
		keys := chatKeys(64)
		reqs := make([]inferlb.Request, len(keys))
		for i, k := range keys {
			reqs[i] = inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: k, Session: session}
		}
		n, refused := 0, 0
		call := func() {
			p, err := b.Pick(&reqs[n%len(reqs)])
			if err != nil {
				panic(err)
			}
			n++
			clock.Advance(time.Millisecond)
			bad := p.Endpoint().Addr == "bad"
			if bad {
				refused++
			}
			p.Done(inferlb.Outcome{ClientError: bad})
		}
		for range 200 {
			call() // the shares settle
		}
		allocs := testing.AllocsPerRun(200, call)
		assert.Zero(t, allocs, "session %v", session)
		assert.Positive(t, refused, "session %v: some key's owner refuses", session)
	}
}
