package cache_test

import (
	"math"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferlb/inferlb/cache"
	"github.com/inferlb/inferlb/internal/testutil"
)

func newSessions(t *testing.T, opts cache.SessionOptions) (*cache.Sessions, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock()
	opts.Clock = clock
	s, err := cache.NewSessions(opts)
	require.NoError(t, err)
	return s, clock
}

func TestSessionsTTL(t *testing.T) {
	s, clock := newSessions(t, cache.SessionOptions{TTL: time.Minute})
	k := cache.NewKeyer(1)
	alice, bob := k.Session("alice"), k.Session("bob")
	s.Put(alice, 7)
	s.Put(bob, 8)
	v, ok := s.Get(alice)
	require.True(t, ok)
	assert.Equal(t, uint64(7), v)

	// Gets keep a session alive: the TTL is an idle timeout.
	for range 5 {
		clock.Advance(50 * time.Second)
		_, ok = s.Get(alice)
		require.True(t, ok)
	}
	_, ok = s.Get(bob)
	assert.False(t, ok, "bob idled past the TTL")
	assert.Equal(t, 1, s.Len())

	clock.Advance(time.Minute)
	_, ok = s.Get(alice)
	assert.False(t, ok)
	assert.Zero(t, s.Len())

	s.Put(alice, 9)
	v, ok = s.Get(alice)
	assert.True(t, ok)
	assert.Equal(t, uint64(9), v)
	s.Put(alice, 10)
	v, _ = s.Get(alice)
	assert.Equal(t, uint64(10), v, "Put replaces")
	assert.Equal(t, 1, s.Len())
	s.Delete(alice)
	_, ok = s.Get(alice)
	assert.False(t, ok)
	s.Delete(alice) // deleting twice is fine

	// CompareAndDelete leaves a value stored since the caller read it.
	s.Put(alice, 11)
	s.Put(alice, 12)
	assert.False(t, s.CompareAndDelete(alice, 11), "12 was stored since 11 was read")
	v, ok = s.Get(alice)
	assert.True(t, ok)
	assert.Equal(t, uint64(12), v)
	assert.True(t, s.CompareAndDelete(alice, 12))
	_, ok = s.Get(alice)
	assert.False(t, ok)
	assert.False(t, s.CompareAndDelete(alice, 12), "gone")

	s.Put(0, 1)
	_, ok = s.Get(0)
	assert.False(t, ok, "key 0 means no session")
	assert.Zero(t, s.Len())
}

// A TTL near the largest Duration must not overflow now + TTL into the
// past, storing every session already expired.
func TestSessionsHugeTTL(t *testing.T) {
	s, _ := newSessions(t, cache.SessionOptions{TTL: time.Duration(math.MaxInt64)})
	s.Put(42, 7)
	v, ok := s.Get(42)
	require.True(t, ok)
	assert.EqualValues(t, 7, v)
}

func TestSessionsEvictLeastRecentlyUsed(t *testing.T) {
	// Eight entries is one set, so eviction order is plain LRU.
	s, clock := newSessions(t, cache.SessionOptions{MaxEntries: 8, TTL: time.Minute})
	require.Equal(t, 8, s.Cap())
	for k := uint64(1); k <= 8; k++ {
		s.Put(k, k*10)
		clock.Advance(time.Second)
	}
	// Recency has a resolution of TTL/8: a Get refreshes an entry only when
	// that moves its expiry by more than that.
	clock.Advance(15 * time.Second)
	_, ok := s.Get(1) // 1 becomes the most recently used; 2 is now the LRU
	require.True(t, ok)
	s.Put(9, 90)
	_, ok = s.Get(2)
	assert.False(t, ok, "the least recently used entry was evicted")
	for _, k := range []uint64{1, 3, 4, 5, 6, 7, 8, 9} {
		v, ok := s.Get(k)
		assert.True(t, ok, "key %d", k)
		assert.Equal(t, k*10, v)
	}
	assert.Equal(t, 8, s.Len())

	// A freed slot is reused before any live entry is evicted.
	s.Delete(5)
	s.Put(10, 100)
	_, ok = s.Get(6)
	assert.True(t, ok)
}

func TestSessionsBounded(t *testing.T) {
	s, _ := newSessions(t, cache.SessionOptions{})
	assert.Equal(t, cache.DefaultMaxSessions, s.Cap())
	assert.Equal(t, cache.DefaultMaxSessionBytes, s.Cap()*cache.SessionEntryBytes)
	k := cache.NewKeyer(3)
	for i := range 4 * cache.DefaultMaxSessions {
		s.Put(k.Session("id-"+strconv.Itoa(i)), uint64(i))
	}
	assert.LessOrEqual(t, s.Len(), s.Cap())
	assert.Greater(t, s.Len(), s.Cap()*9/10, "a flood fills the table, it does not grow it")

	for _, tc := range []struct {
		opts cache.SessionOptions
		cap  int
	}{
		{cache.SessionOptions{MaxEntries: 1000}, 512},
		{cache.SessionOptions{MaxBytes: 64 << 10}, 2048},
		{cache.SessionOptions{MaxEntries: 1 << 20, MaxBytes: 1 << 20}, 1 << 15},
		{cache.SessionOptions{MaxEntries: 1}, 8},
		// One limit given is the bound: the other's default must not cut
		// it silently (balancer.Options.StickyEntries sets MaxEntries only).
		{cache.SessionOptions{MaxEntries: 1 << 18}, 1 << 18},
		{cache.SessionOptions{MaxBytes: 4 << 20}, 1 << 17},
	} {
		s, err := cache.NewSessions(tc.opts)
		require.NoError(t, err)
		assert.Equal(t, tc.cap, s.Cap(), "%+v", tc.opts)
	}
}

func TestSessionOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts  cache.SessionOptions
		field string
	}{{cache.SessionOptions{MaxEntries: -1}, "MaxEntries"}, {cache.SessionOptions{MaxBytes: -1}, "MaxBytes"}, {cache.SessionOptions{TTL: -time.Second}, "TTL"}} {
		_, err := cache.NewSessions(tc.opts)
		assert.ErrorIs(t, err, cache.ErrSessionOptions, "%+v", tc.opts)
		assert.ErrorContains(t, err, tc.field+" ", "%+v", tc.opts)
	}
	// Limits past MaxSessions fail naming the limit that allows them,
	// instead of panicking in make (math.MaxInt) or taking the process's
	// memory (1<<40 entries). An int holds no 1<<40 on 32-bit platforms:
	// there the values are the largest that keep each case's meaning
	// (past MaxSessions, and the same limit binding when both are set).
	const (
		entries40 = min(1<<40, math.MaxInt>>6) // 1<<25-1 on 32-bit
		entries50 = min(1<<50, math.MaxInt)
		bytes40   = min(1<<40, math.MaxInt) // MaxInt/SessionEntryBytes entries on 32-bit
		bytes50   = min(1<<50, math.MaxInt)
	)
	for _, tc := range []struct {
		opts  cache.SessionOptions
		field string
	}{
		{cache.SessionOptions{MaxEntries: math.MaxInt}, "MaxEntries"},
		{cache.SessionOptions{MaxEntries: entries40}, "MaxEntries"},
		{cache.SessionOptions{MaxBytes: bytes50}, "MaxBytes"},
		{cache.SessionOptions{MaxEntries: entries40, MaxBytes: bytes50}, "MaxEntries"},
		{cache.SessionOptions{MaxEntries: entries50, MaxBytes: bytes40}, "MaxBytes"},
	} {
		_, err := cache.NewSessions(tc.opts)
		assert.ErrorIs(t, err, cache.ErrSessionOptions, "%+v", tc.opts)
		assert.ErrorContains(t, err, tc.field+" ", "%+v", tc.opts)
	}
	s, err := cache.NewSessions(cache.SessionOptions{MaxEntries: entries40, MaxBytes: 1 << 20})
	require.NoError(t, err, "a large limit cut by the other is fine")
	assert.Equal(t, 1<<15, s.Cap())
}

func TestSessionsConcurrent(t *testing.T) {
	// Every value stored for key k is k*3+1, so a torn read (key of one
	// entry, value of another) would show.
	s, clock := newSessions(t, cache.SessionOptions{MaxEntries: 64})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20_000 {
				k := uint64(i%200 + 1)
				switch (i + g) % 4 {
				case 0:
					s.Put(k, k*3+1)
				case 1:
					s.Delete(k)
				default:
					if v, ok := s.Get(k); ok && v != k*3+1 {
						t.Errorf("key %d: value %d", k, v)
						return
					}
				}
				if i%5000 == 0 {
					clock.Advance(time.Second)
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, s.Len(), s.Cap())
}

func TestSessionsDoNotAllocate(t *testing.T) {
	s, _ := newSessions(t, cache.SessionOptions{})
	k := uint64(1)
	allocs := testing.AllocsPerRun(1000, func() {
		k++
		s.Put(k, k)
		_, _ = s.Get(k)
		_, _ = s.Get(k + 1<<40)
	})
	assert.Zero(t, allocs)
}

// Without a Clock the table runs on the wall clock (time.Now, which a
// synctest bubble fakes): a session lives for its TTL after its last Put
// or refreshing Get, and no longer.
func TestSessionsDefaultClockIsTheWallClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := cache.NewSessions(cache.SessionOptions{TTL: time.Minute})
		require.NoError(t, err)
		k := cache.NewKeyer(1)
		alice, bob := k.Session("alice"), k.Session("bob")
		s.Put(alice, 7)
		s.Put(bob, 8)
		time.Sleep(59 * time.Second)
		v, ok := s.Get(alice) // refreshes its TTL from now
		require.True(t, ok, "within its TTL")
		assert.Equal(t, uint64(7), v)
		time.Sleep(2 * time.Second)
		_, ok = s.Get(bob)
		assert.False(t, ok, "expired a TTL after its Put")
		_, ok = s.Get(alice)
		assert.True(t, ok, "refreshed by the Get")
	})
}
