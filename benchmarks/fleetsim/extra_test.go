package fleetsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
)

func extraEnv(n int) Env {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = string(rune('a' + i))
	}
	return Env{Seed: 1, IDs: ids}
}

// least-conn sends each call to a replica with the fewest of its calls in
// flight, all replicas scanned, and spreads ties.
func TestLeastConnTakesTheFewestInFlight(t *testing.T) {
	r := LeastConn().New(extraEnv(4))
	r.SetMembers([]int{0, 1, 2, 3})
	seen := map[int]int{}
	var dones []func(inferlb.Outcome)
	for range 8 {
		i, done, err := r.Pick(&Request{})
		require.NoError(t, err)
		seen[i]++
		dones = append(dones, done)
	}
	assert.Equal(t, map[int]int{0: 2, 1: 2, 2: 2, 3: 2}, seen, "level after 8 calls")

	for _, d := range dones {
		d(inferlb.Outcome{})
	}

	r2 := LeastConn().New(extraEnv(3))
	r2.SetMembers([]int{0, 1, 2})
	a, da, _ := r2.Pick(&Request{})
	b, _, _ := r2.Pick(&Request{})
	c, _, _ := r2.Pick(&Request{})
	assert.ElementsMatch(t, []int{0, 1, 2}, []int{a, b, c}, "one each")
	da(inferlb.Outcome{})
	d, _, _ := r2.Pick(&Request{})
	assert.Equal(t, a, d, "the one replica with a call fewer")

	r2.SetMembers(nil)
	_, _, err := r2.Pick(&Request{})
	assert.Error(t, err, "no replica")
}

// consistent-hash-bounded sends a key to its ring owner until the owner
// holds its share times the factor, then elsewhere; calls without a key go
// anywhere.
func TestRingHashBoundedSpillsPastTheBound(t *testing.T) {
	owner := func() int {
		r := RingHash().New(extraEnv(4))
		r.SetMembers([]int{0, 1, 2, 3})
		i, _, err := r.Pick(&Request{AffinityKey: 42})
		require.NoError(t, err)
		return i
	}()
	r := RingHashBounded(1.25).New(extraEnv(4))
	r.SetMembers([]int{0, 1, 2, 3})
	var got []int
	var dones []func(inferlb.Outcome)
	for range 8 {
		i, done, err := r.Pick(&Request{AffinityKey: 42})
		require.NoError(t, err)
		got = append(got, i)
		dones = append(dones, done)
	}
	// Slots max(ceil(ceil(1.25 * (total+1)) / 4), 1), a replica taking a
	// call while it holds no more: 1 for the first three calls, 2 from the
	// fourth, 3 from the seventh; the owner takes the first two, spills
	// follow, and none holds more than 4 after 8.
	assert.Equal(t, owner, got[0], "the ring's owner first")
	counts := map[int]int{}
	for _, i := range got {
		counts[i]++
	}
	assert.Greater(t, len(counts), 1, "a hot key spilled: %v", got)
	for i, n := range counts {
		assert.LessOrEqual(t, n, 4, "replica %d over the bound: %v", i, got)
	}
	for _, d := range dones {
		d(inferlb.Outcome{})
	}
	i, _, _ := r.Pick(&Request{AffinityKey: 42})
	assert.Equal(t, owner, i, "back to the owner once the calls ended")
}

// consistent-hash-bounded is named for Envoy's hash_balance_factor, but it
// held the owner to the bound with this call counted (in flight + 1 <=
// ceil(factor x (total+1) / n)), where Envoy's BoundedLoadHashingLoadBalancer
// takes a host while the calls it holds are within its slots
// (max(ceil(ceil((total+1) x factor) / n), 1)): one call more. With 8
// replicas a key's second call in flight spilled, so at light load the
// baseline lost cache hits Envoy keeps.
func TestRingHashBoundedKeepsEnvoysSlots(t *testing.T) {
	const n = 8
	members := []int{0, 1, 2, 3, 4, 5, 6, 7}
	r := RingHashBounded(1.25).New(extraEnv(n))
	r.SetMembers(members)
	owner, _, err := r.Pick(&Request{AffinityKey: 42})
	require.NoError(t, err)
	// total 1: slots max(ceil(ceil(2 x 1.25) / 8), 1) = 1; the owner holds 1.
	i, _, err := r.Pick(&Request{AffinityKey: 42})
	require.NoError(t, err)
	assert.Equal(t, owner, i, "the owner holds its 1 slot: Envoy takes it")
	// total 2: slots ceil(ceil(3 x 1.25) / 8) = 1; the owner holds 2.
	j, _, err := r.Pick(&Request{AffinityKey: 42})
	require.NoError(t, err)
	assert.NotEqual(t, owner, j, "past its slots: spilled")

	// Every client probes the same replicas for a key, as the probe order
	// is seeded by the key's hash: two clients with the owner as full
	// spill to the same replica.
	spill := func(seed uint64) int {
		e := extraEnv(n)
		e.Seed = seed
		r := RingHashBounded(1.25).New(e)
		r.SetMembers(members)
		var k int
		for range 3 {
			k, _, _ = r.Pick(&Request{AffinityKey: 7})
		}
		return k
	}
	assert.Equal(t, spill(1), spill(2), "clients agree on where a key spills")
}
