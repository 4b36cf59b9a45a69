package balancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/internal/testutil"
	"github.com/inferlb/inferlb/telemetry"
)

// The affinity bound shares the group's load among the members that take
// calls. A member whose breaker is open was left out of that weight, but one
// passed over for its client errors (shunned, clienterror.go) was not,
// though it takes none of the calls either: with one of 4 replicas
// answering 401, the other 3 carry all of the load, but each one's fair
// share was taken as a quarter of it, and an owner spilled its key at 4
// calls of 12 where a third (a bound of 5) is its share. Here 11 calls are
// in flight on the 3 others, 4 of them on the key's owner: with 3 members
// sharing, the pick makes 12, a share of 4 and a bound of 1.25 x 4 = 5
// calls, and the owner keeps its key; with 4 (all in rotation, the 4th
// idle), 3 and a bound of 4, and it spills. So with the caller's own
// calls, with every server reporting its load (the fleet view), and in a
// tenant's shard (the shard's share).
func TestAffinityBoundLeavesOutShunnedMembers(t *testing.T) {
	const key = 0x1234567890abcdef
	for _, tc := range []struct {
		name string
		out  func(t *testing.T, b *balancer.Balancer, id string)
		home bool
	}{
		{"all four in rotation, one idle", func(*testing.T, *balancer.Balancer, string) {}, false},
		{"one not ready (draining)", func(t *testing.T, b *balancer.Balancer, id string) {
			require.True(t, b.SetReady(id, false))
		}, true},
		{"one breaker open", func(t *testing.T, b *balancer.Balancer, id string) {
			p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serialOf(t, b, id))
			require.NoError(t, err)
			p.Done(inferlb.Outcome{Err: errDown})
			require.True(t, stat(t, b, id).BreakerOpen)
		}, true},
		{"one shunned for its client errors", func(t *testing.T, b *balancer.Balancer, id string) {
			for range 10 {
				p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serialOf(t, b, id))
				require.NoError(t, err)
				p.Done(inferlb.Outcome{ClientError: true})
			}
			require.Greater(t, stat(t, b, id).ClientErrorShare, 0.5)
		}, true},
	} {
		for _, p := range boundPaths(tc.name, 4) {
			how, n, tenant := p.how, p.n, p.tenant
			t.Run(p.name, func(t *testing.T) {
				clock := testutil.NewClock()
				b := affine(t, n, balancer.Options{Clock: clock, Rand: testutil.NewRand(5), BreakerFailures: 1, TenantShardSize: 4})
				req := func(key uint64) *inferlb.Request {
					return &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key, Tenant: tenant}
				}
				shard := map[string]bool{} // the tenant's shard: where its calls go
				for range 1000 {
					p, err := b.Pick(req(0))
					require.NoError(t, err)
					p.Done(inferlb.Outcome{})
					shard[p.ID()] = true
				}
				require.Len(t, shard, 4)
				p, err := b.Pick(req(key))
				require.NoError(t, err)
				p.Done(inferlb.Outcome{})
				home := p.ID()
				var others []string
				for _, e := range endpoints(n) {
					if shard[e.Key()] && e.Key() != home {
						others = append(others, e.Key())
					}
				}
				bad := others[2] // takes no call below
				tc.out(t, b, bad)
				var held []balancer.Pick
				hold := func(id string, k int) {
					for range k {
						p, err := b.PickAt(&inferlb.Request{Service: inferlb.ServiceLLM}, serialOf(t, b, id))
						require.NoError(t, err)
						require.Equal(t, id, p.ID())
						held = append(held, p)
					}
				}
				hold(home, 4)
				hold(others[0], 4)
				hold(others[1], 3)
				if how == "reported load" {
					for id, calls := range map[string]float64{home: 4, others[0]: 4, others[1]: 3, bad: 0} {
						s := telemetry.Sample{Time: clock.Now()}
						s.Set(telemetry.Running, calls)
						s.Set(telemetry.Waiting, 0)
						s.Set(telemetry.KVCacheUsage, 0.5)
						if id == home {
							s.Set(telemetry.KVCacheUsage, 0.92) // no room past the bound (see withinBound)
						}
						b.Publish(id, s)
					}
				}
				p, err = b.Pick(req(key))
				require.NoError(t, err)
				if tc.home {
					assert.Equal(t, home, p.ID(), "the owner, with 4 calls of 12 shared by 3, lost its key")
				} else {
					assert.NotEqual(t, home, p.ID(), "the owner, with 4 calls of 12 shared by 4, took a 5th")
				}
				p.Done(inferlb.Outcome{})
				for i := range held {
					held[i].Done(inferlb.Outcome{})
				}
			})
		}
	}
}

// A steady keyed load over 4 replicas, one of which answers every call
// 401 in a millisecond (its API key is wrong): it is shunned
// (clienterror.go), and the other 3 carry every call. The keys those 3
// own should stay on them as they do when the refusing replica is out of
// rotation (not ready): with the refusing replica's weight still in the
// bound, each owner's bound was a quarter too low, and their keys spilled
// to cold caches. Of the 2,980 calls of the 53 keys the 3 own, 1,945 went
// to their owner (11 keys with 9 in 10 of their calls or more there);
// left out, 2,450 (38 keys), as with the replica not ready: 2,459 (39).
func TestShunnedMemberLeavesOwnersTheirKeys(t *testing.T) {
	const rounds, perRound = 300, 12
	keys := chatKeys(64)
	// hits and spills: calls of the keys on their owner and elsewhere;
	// settled: keys with 9 in 10 of their calls or more on their owner.
	drive := func(t *testing.T, shun bool) ownerStay {
		clock := testutil.NewClock()
		b := affine(t, 4, balancer.Options{Clock: clock, Rand: testutil.NewRand(29)})
		homes := map[uint64]string{}
		for _, k := range keys {
			homes[k] = owner(t, b, k)
		}
		bad := endpoints(4)[3].Addr
		if !shun {
			require.True(t, b.SetReady(bad, false))
		}
		answer := func(addr string, _ int) (time.Duration, bool) {
			if addr == bad {
				return time.Millisecond, true
			}
			return 50 * time.Millisecond, false
		}
		return tallyOwners(driveKeyed(t, b, clock, keys, false, rounds, perRound, answer).byKey, homes, bad)
	}
	out, shunned := drive(t, false), drive(t, true)
	t.Logf("keys of the 3 good replicas (%d), calls on their owner / elsewhere (keys with 90%% on it): refusing replica not ready %d/%d (%d), shunned %d/%d (%d)",
		out.keys, out.hits, out.spills, out.settled, shunned.hits, shunned.spills, shunned.settled)
	require.Positive(t, out.keys)
	assert.GreaterOrEqual(t, float64(shunned.hits), 0.97*float64(out.hits), "calls of the good replicas' keys on their owner")
}

// boundPath is one of the three ways the affinity bound shares a group's
// load (withinBound), for a test over n endpoints named name.
type boundPath struct {
	how, name string
	n         int
	tenant    string
}

// boundPaths returns the three: this caller's own calls (how ""); every
// server reporting its calls ("reported load"; the test sets the owner's
// KV cache too full for the bound to widen, the others' not); and a
// tenant's shard of n of n+1 endpoints, which is then the group
// ("a tenant's shard", tenant "t"; tenant.go, shard.share: the test sets
// TenantShardSize to n).
func boundPaths(name string, n int) []boundPath {
	return []boundPath{
		{"", name, n, ""},
		{"reported load", name + ", reported load", n, ""},
		{"a tenant's shard", name + ", a tenant's shard", n + 1, "t"},
	}
}
