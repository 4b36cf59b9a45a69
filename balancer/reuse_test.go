package balancer_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb"
	"github.com/inferlb/inferlb/balancer"
	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
)

// spreadKey picks key n times on an idle fleet (see spread).
func spreadKey(t *testing.T, b *balancer.Balancer, key uint64, n int) map[string]int {
	t.Helper()
	return spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: key}, n)
}

// keyed picks n requests whose keys come from next, each ending at once.
func keyed(t *testing.T, b *balancer.Balancer, n int, next func(i int) uint64) {
	t.Helper()
	for i := range n {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: next(i)})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
}

// A workload whose keys never recur gets nothing from affinity, so the
// balancer stops following the keys and balances by load; when keys recur
// again, it follows them again, to the same owners.
func TestAffinityStepsAsideWhileKeysDoNotRecur(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	unique := func(int) uint64 { return rng.Uint64() | 1 }
	// The probe key is one the estimate does not sample (it observes the
	// keys whose top 3 bits are zero), so probing does not change it: 200
	// calls with one sampled key would be a recurring workload, rightly.
	const probe = 0xf123_4567_89ab_cdef

	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(5)})
	first := spreadKey(t, b, probe, 50)
	require.Len(t, first, 1, "a fresh balancer follows keys from the first call")
	var home string
	for id := range first {
		home = id
	}

	warm := b.KeyReuse()
	assert.True(t, warm.FollowingKeys)
	assert.Zero(t, warm.Ratio, "the probe is not sampled")

	keyed(t, b, 16_000, unique) // a stream of unique documents
	st := b.KeyReuse()
	assert.False(t, st.FollowingKeys)
	assert.Greater(t, st.Observed, int64(500), "about 1 in 8 keys observed, decayed")
	assert.Less(t, st.Ratio, 0.01)
	off := spreadKey(t, b, probe, 200)
	t.Logf("after unique keys: %v", off)
	assert.GreaterOrEqual(t, len(off), 6, "P2C on an idle fleet: ties go anywhere")
	assert.Less(t, off[home], 100, "the key's owner is no longer preferred")

	// Conversations: 100 keys, each back again and again.
	keys := make([]uint64, 100)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
	}
	keyed(t, b, 16_000, func(i int) uint64 { return keys[i%len(keys)] })
	st = b.KeyReuse()
	assert.True(t, st.FollowingKeys)
	assert.Greater(t, st.Ratio, 0.7, "the unique keys before still weigh in, halving every window")
	assert.Equal(t, map[string]int{home: 50}, spreadKey(t, b, probe, 50), "keys recur: the owner again")
}

// One tenant's prompts that never recur (a RAG pipeline over fresh
// documents) must not turn affinity off for a tenant whose conversations
// recur: each is judged by its own keys (its class of tenants).
func TestOneTenantsUniquePromptsLeaveOthersAffinityOn(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const probe = 0xf123_4567_89ab_cdef // not sampled, as above
	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(6)})
	// Two tenants in different classes: a name's class is its seeded
	// tenant hash modulo the 7 tenant classes.
	const rag = "rag-ingest"
	k := cache.NewKeyer(seed)
	chat := "support-chat"
	for i := 0; k.Tenant(chat)%7 == k.Tenant(rag)%7; i++ {
		chat = fmt.Sprintf("support-chat-%d", i)
	}
	home := spreadTenant(t, b, chat, probe, 1)
	keys := make([]uint64, 100)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
	}
	for i := range 64_000 { // 97.5% of the traffic: unique documents
		req := &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: rag, AffinityKey: rng.Uint64() | 1}
		if i%40 == 0 {
			req.Tenant, req.AffinityKey = chat, keys[i/40%len(keys)]
		}
		p, err := b.Pick(req)
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	// Overall 2.5% of the keyed requests recur, under MinKeyReuse: one
	// estimate for all would step affinity aside for both tenants.
	assert.True(t, b.KeyReuse().FollowingKeys, "some tenant's picks follow keys")
	for id := range home {
		assert.Equal(t, map[string]int{id: 50}, spreadTenant(t, b, chat, probe, 50), "the chat tenant still follows its keys")
	}
	assert.Greater(t, len(spreadTenant(t, b, rag, probe, 200)), 4, "the RAG tenant is balanced by load")
}

// KeyReuse says what the picks do: a tenant's class with too few
// observations of its own is judged by all the classes' sum, there as in
// Pick, so a few of its unique keys after a stream of unique documents do
// not make FollowingKeys report picks that follow keys (it said true while
// every pick balanced by load).
func TestKeyReuseJudgesAYoungClassAsPicksDo(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const probe = 0xf123_4567_89ab_cdef // not sampled
	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(7)})
	keyed(t, b, 16_000, func(int) uint64 { return rng.Uint64() | 1 }) // unique documents, no tenant
	require.False(t, b.KeyReuse().FollowingKeys)
	for range 20 { // sampled keys (top 3 bits zero), unique: a young class
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, Tenant: "newcomer", AffinityKey: rng.Uint64()>>3 | 1})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	st := b.KeyReuse()
	require.Positive(t, st.Observed)
	assert.Greater(t, len(spreadTenant(t, b, "newcomer", probe, 200)), 4, "the newcomer's picks balance by load")
	assert.Greater(t, len(spreadKey(t, b, probe, 200)), 4, "so do the others'")
	assert.False(t, st.FollowingKeys, "no pick follows keys")
}

// spreadTenant picks key for tenant n times on an idle fleet.
func spreadTenant(t *testing.T, b *balancer.Balancer, tenant string, key uint64, n int) map[string]int {
	t.Helper()
	return spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, Tenant: tenant, AffinityKey: key}, n)
}

// With MinKeyReuse negative, and in AffinityStrict, keys are followed
// whatever the workload.
func TestAffinityFollowsKeysWhenTheCheckIsOff(t *testing.T) {
	for name, opts := range map[string]balancer.Options{
		"MinKeyReuse -1": {MinKeyReuse: -1},
		"strict":         {Affinity: balancer.AffinityStrict},
	} {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			opts.AffinitySeed, opts.Rand = seed, testutil.NewRand(6)
			b := newBalancer(t, 8, opts)
			keyed(t, b, 16_000, func(int) uint64 { return rng.Uint64() | 1 })
			assert.Len(t, spreadKey(t, b, 0xf123_4567_89ab_cdef, 100), 1)
			assert.Equal(t, balancer.KeyReuseStats{FollowingKeys: true}, b.KeyReuse(), "no estimate kept")
		})
	}
}

func TestKeyReuseWithAffinityOff(t *testing.T) {
	b := newBalancer(t, 2, balancer.Options{Affinity: balancer.AffinityOff})
	assert.Equal(t, balancer.KeyReuseStats{}, b.KeyReuse())
}

func TestMinKeyReuseIsValidated(t *testing.T) {
	assert.NoError(t, (&balancer.Options{MinKeyReuse: -1}).Validate())
	assert.NoError(t, (&balancer.Options{MinKeyReuse: 1}).Validate())
	assert.ErrorContains(t, (&balancer.Options{MinKeyReuse: 1.5}).Validate(), "MinKeyReuse")
	assert.ErrorContains(t, (&balancer.Options{MinKeyReuse: math.NaN()}).Validate(), "MinKeyReuse")
}

// An explicit session (a session header, prompt_cache_key, a conversation
// ID: Request.Session) sticks whatever the rest of the traffic does. The
// reuse estimate judged it with the prompt hashes around it: after a
// stream of unique RAG prompts, an agent's session with its own ID was
// spread over the fleet turn by turn, losing its KV cache each time. Its
// calls do not count in the estimate either.
func TestExplicitSessionsStickWhileKeysDoNotRecur(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	b := newBalancer(t, 8, balancer.Options{AffinitySeed: seed, Rand: testutil.NewRand(6)})
	keyed(t, b, 16_000, func(int) uint64 { return rng.Uint64() | 1 }) // unique documents
	require.False(t, b.KeyReuse().FollowingKeys)
	before := b.KeyReuse()

	const session = 0xf123_4567_89ab_cdef
	got := spread(t, b, &inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: session, Session: true}, 50)
	assert.Len(t, got, 1, "every turn of the session on one endpoint: %v", got)
	assert.GreaterOrEqual(t, len(spreadKey(t, b, session, 50)), 4, "the same key as a prompt hash is not followed")

	// Sampled session keys leave the estimate as it was.
	sampled := uint64(0x0123_4567_89ab_cdef) // top bits zero: a sampled key
	for range 300 {
		p, err := b.Pick(&inferlb.Request{Service: inferlb.ServiceLLM, AffinityKey: sampled, Session: true})
		require.NoError(t, err)
		p.Done(inferlb.Outcome{})
	}
	assert.Equal(t, before.Observed, b.KeyReuse().Observed)
	assert.False(t, b.KeyReuse().FollowingKeys)
}
